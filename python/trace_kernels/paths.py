"""Where the templates and CUDA headers live: a source checkout first, else the installed wheel.

Checkout: <repo>/codegen/templates, <repo>/codegen/moe_tables and <repo>/cuda/include (the design card's layout).
Wheel:    trace_kernels/_data/{templates,moe_tables,include} (copied there by setup.py),
          plus trace_kernels/_data/aot (cubins built ahead of time, with manifest.json).
"""

from __future__ import annotations

import functools
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_DIR = PACKAGE_DIR / "_data"


@functools.lru_cache(maxsize=None)
def checkout_root() -> Path | None:
    """The repository root when running from a source checkout (editable install or PYTHONPATH)."""
    root = PACKAGE_DIR.parent.parent
    if (root / "codegen" / "templates").is_dir() and (root / "cuda" / "include" / "trace_kernels").is_dir():
        return root
    return None


def _pick(checkout_rel: str, data_rel: str) -> Path:
    root = checkout_root()
    path = root / checkout_rel if root is not None else DATA_DIR / data_rel
    if not path.is_dir():
        raise FileNotFoundError(f"trace_kernels data folder {path} is missing: broken install?")
    return path


def templates_dir() -> Path:
    return _pick("codegen/templates", "templates")


def include_dir() -> Path:
    """Folder to pass as -I; headers are included as "trace_kernels/<name>.cuh"."""
    return _pick("cuda/include", "include")


def moe_tables_dir() -> Path:
    """The built-in tuned MoE tile tables (trace_kernels.moe_tables)."""
    return _pick("codegen/moe_tables", "moe_tables")


def aot_dir() -> Path:
    """Cubins built ahead of time (may not exist: pure-Python install); TRACE_KERNELS_AOT_DIR overrides."""
    from trace_kernels import env
    explicit = env.get("AOT_DIR")
    return Path(explicit).expanduser() if explicit else DATA_DIR / "aot"


@functools.lru_cache(maxsize=None)
def cutlass_include_dirs() -> tuple[Path, ...]:
    """CUTLASS/CuTe headers shipped by the nvidia-cutlass wheel (empty when it is not installed)."""
    try:
        import cutlass_library
    except ImportError:
        return ()
    base = Path(cutlass_library.__file__).resolve().parent / "source"
    dirs = tuple(p for p in (base / "include", base / "tools" / "util" / "include") if p.is_dir())
    return dirs


def cutlass_version() -> str:
    try:
        from importlib.metadata import version
        return version("nvidia-cutlass")
    except Exception:  # not installed
        return "none"
