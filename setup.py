"""Build hooks for trace-kernels (metadata lives in pyproject.toml).

build_py copies the Jinja templates (codegen/templates), the built-in MoE tile tables (codegen/moe_tables) and CUDA
headers (cuda/include) into the wheel as trace_kernels/_data/{templates,moe_tables,include}, the RL configs (rl/configs) as trace_rl/_configs, and, when nvcc is found, compiles the presets in
TRACE_KERNELS_AOT (default "tiny"; "0" or empty skips) into trace_kernels/_data/aot with a
manifest.json. Without nvcc, or for editable installs, the AOT step is skipped with a note: the
package is pure Python and JIT-compiles kernels on first use.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _note(message: str) -> None:
    print(f"[trace-kernels] {message}", file=sys.stderr, flush=True)


class BuildPyWithKernels(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            _note("editable install: templates and headers are read from the checkout; no AOT build")
            return
        data = Path(self.build_lib) / "trace_kernels" / "_data"
        for src, dst in (("codegen/templates", data / "templates"), ("codegen/moe_tables", data / "moe_tables"),
                         ("cuda/include", data / "include"),
                         ("rl/configs", Path(self.build_lib) / "trace_rl" / "_configs")):
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(ROOT / src, dst)
        self._build_aot(data / "aot")

    def _build_aot(self, out: Path) -> None:
        presets = [p.strip() for p in os.environ.get("TRACE_KERNELS_AOT", "tiny").split(",") if p.strip()]
        if not presets or presets == ["0"]:
            _note("TRACE_KERNELS_AOT is empty: no kernels built ahead of time")
            return
        sys.path.insert(0, str(ROOT / "python"))  # the generator from this source tree (torch-free)
        try:
            from trace_kernels import cli
            from trace_kernels.jit import compiler
        except ImportError as error:  # e.g. jinja2 missing from the build environment
            _note(f"AOT build skipped: cannot import the generator ({error})")
            return
        finally:
            sys.path.pop(0)
        if compiler.find_nvcc() is None:
            _note("nvcc not found: AOT build skipped (kernels are compiled on first use where nvcc exists)")
            return
        # compile in the build tree, not the user's JIT cache
        os.environ.setdefault("TRACE_KERNELS_CACHE_DIR", str(Path(self.build_temp).resolve() / "trace_kernels_cache"))
        args = [arg for preset in presets for arg in ("--preset", preset)]
        _note(f"building the AOT set for {', '.join(presets)} into {out}")
        try:
            status = cli.main(["build", *args, "--keep-going", "--out", str(out)])
        except Exception as error:  # a broken toolchain must not break a pure-Python install
            status = error
        if isinstance(status, Exception):
            _note(f"AOT build failed ({status}); kernels will be compiled on first use instead")
            shutil.rmtree(out, ignore_errors=True)
        elif status:
            _note("some AOT kernels failed to build (listed above, e.g. no CUTLASS headers in the build "
                  "environment); they will be compiled on first use")


setup(
    packages=find_packages("python") + find_packages("rl"),
    package_dir={"trace_kernels": "python/trace_kernels", "trace_rl": "rl/trace_rl"},
    cmdclass={"build_py": BuildPyWithKernels},
)
