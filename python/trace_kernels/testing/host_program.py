"""Host programs that include the project's CUDA headers, compiled by nvcc for CPU tests of their __host__ __device__
helpers (split plans, merge roles) and of their struct layouts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from trace_kernels import paths


def compile_host_program(source: str, folder: Path, name: str, *, object_only: bool = False,
                         extra_includes: tuple[Path, ...] = ()) -> Path:
    """source written to folder/name.cu and compiled for the host (sm_90a device code) -> the executable, or with
    object_only the object file (a compile-time check: static_asserts). Raises AssertionError with nvcc's output."""
    nvcc = shutil.which("nvcc")
    assert nvcc is not None, "nvcc is not on PATH"
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"{name}.cu"
    src.write_text(source)
    out = folder / (f"{name}.o" if object_only else name)
    includes = [f"-I{paths.include_dir()}", *(f"-I{d}" for d in extra_includes)]
    cmd = [nvcc, "-std=c++17", "-arch=sm_90a", "--expt-relaxed-constexpr", *includes,
           *(["-c"] if object_only else []), str(src), "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return out
