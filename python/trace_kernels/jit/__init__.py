"""Get a cubin for a KernelSpec: the AOT set, else the JIT cache, else compile it now.

    cubin_path = trace_kernels.jit.cubin_for(spec)

Env knobs (docs/toolchain.md): TRACE_KERNELS_CACHE_DIR, _DISABLE_JIT, _LINEINFO, _PTXAS_CHECK, _NVCC,
_VERBOSE.
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

from trace_kernels import env, paths
from trace_kernels.codegen.spec import KernelSpec
from trace_kernels.jit import cache, compiler
from trace_kernels.jit.compiler import CompileError

__all__ = ["CompileError", "KernelUnavailable", "build", "cubin_for", "key_for"]


class KernelUnavailable(RuntimeError):
    """No AOT cubin matches and JIT is disabled or no nvcc is available."""


_lock = threading.Lock()
_resolved: dict[str, Path] = {}


@functools.lru_cache(maxsize=None)
def _headers(source: str) -> str:
    """Digest of the headers this source includes (memoized: a process renders few distinct sources)."""
    return cache.header_digest(source=source)


def _extra_key(spec: KernelSpec) -> str:
    return f"cutlass={paths.cutlass_version()}" if spec.needs_cutlass else ""


def key_for(spec: KernelSpec, source: str, nvcc: str) -> str:
    return cache.cache_key(source, compiler.flags(spec), compiler.nvcc_version(nvcc), _headers(source), _extra_key(spec))


@functools.lru_cache(maxsize=1)
def _aot_manifest() -> dict:
    try:
        return json.loads((paths.aot_dir() / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def _aot_cubin(spec: KernelSpec, source: str) -> Path | None:
    """A cubin built at install time from exactly this source and these headers."""
    item = _aot_manifest().get(spec.name)
    if not item or env.flag("LINEINFO"):
        return None
    if item.get("source_key") != cache.source_key(source + _extra_key(spec), _headers(source)):
        return None
    path = paths.aot_dir() / item["cubin"]
    return path if path.is_file() else None


def build(spec: KernelSpec, *, force: bool = False) -> cache.Entry:
    """Compile spec into the cache (or reuse a valid entry). Needs nvcc."""
    nvcc = compiler.find_nvcc()
    if nvcc is None:
        raise KernelUnavailable(f"{spec.name}: no nvcc found (set TRACE_KERNELS_NVCC or put nvcc on PATH)")
    source = spec.render()
    key = key_for(spec, source, nvcc)
    entry = cache.entry_for(spec.name, key)
    if entry.is_valid() and not force:
        return entry
    if force:
        cache._discard(entry.folder)

    def _compile(folder: Path) -> None:
        src = folder / cache.SOURCE
        src.write_text(source)
        report = compiler.compile_cubin(spec, src, folder / cache.CUBIN, nvcc)
        (folder / "ptxas.txt").write_text(report.text)
        if not env.flag("LINEINFO"):
            src.unlink()

    return cache.install(entry, _compile, {"op": spec.op, "flags": compiler.flags(spec),
                                           "nvcc": compiler.nvcc_version(nvcc).splitlines()[-1]})


def cubin_for(spec: KernelSpec) -> Path:
    """Path of a valid cubin for spec (memoized per process)."""
    with _lock:
        hit = _resolved.get(spec.name)
        if hit is not None:
            return hit
        source = spec.render()
        path = _aot_cubin(spec, source)
        if path is None:
            if env.flag("DISABLE_JIT"):
                raise KernelUnavailable(f"{spec.name} is not in the AOT set and TRACE_KERNELS_DISABLE_JIT=1")
            path = build(spec).cubin
        _resolved[spec.name] = path
        return path


def build_all(specs: list[KernelSpec], jobs: int = 0, keep_going: bool = False) -> list:
    """Build many specs into the cache in parallel (nvcc processes); returns their entries.

    keep_going=True returns the exception in place of the entry of a spec that failed.
    """
    import os
    from concurrent.futures import ThreadPoolExecutor
    jobs = jobs or max(1, min(len(specs), os.cpu_count() or 1))

    def one(spec):
        try:
            return build(spec)
        except Exception as error:
            if not keep_going:
                raise
            return error

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, specs))
