"""nvcc invocation: find the compiler, its version, the flags, and the ptxas resource report."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from trace_kernels import env, paths
from trace_kernels.codegen.spec import GENCODE, KernelSpec


class CompileError(RuntimeError):
    """nvcc failed, or the ptxas report broke a TRACE_KERNELS_PTXAS_CHECK rule."""


def find_nvcc() -> str | None:
    explicit = env.get("NVCC")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    on_path = shutil.which("nvcc")
    if on_path:
        return on_path
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


@functools.lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """The full `nvcc --version` text (release and build), part of every cache key."""
    result = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CompileError(f"{nvcc} --version failed: {result.stderr.strip()}")
    return result.stdout.strip()


def flags(spec: KernelSpec) -> list[str]:
    """Flags that change the cubin (part of the cache key). Include paths are added separately."""
    out = ["-std=c++17", "-O3", GENCODE, "-cubin", "-Xptxas=-v", "--expt-relaxed-constexpr",
           # exact IEEE division and denormals everywhere: kernels must match the reference bit for bit
           "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true"]
    if env.flag("LINEINFO"):
        out.append("-lineinfo")
    return out


def include_flags(spec: KernelSpec) -> list[str]:
    dirs = [paths.include_dir()]
    if spec.needs_cutlass:
        cutlass = paths.cutlass_include_dirs()
        if not cutlass:
            raise CompileError(f"{spec.name} needs CUTLASS headers: pip install nvidia-cutlass")
        dirs.extend(cutlass)
    return [f"-I{d}" for d in dirs]


@dataclass(frozen=True)
class PtxasReport:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    text: str
    # ptxas's "wgmma.mma_async instructions are serialized due to ..." codes (C7510-C7519): it then
    # waits for every wgmma before the next, whatever the source's wait_group counts say
    wgmma_serialized: tuple[str, ...] = ()


_PTXAS_NUMBERS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack_frame": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}


_WGMMA_SERIALIZED = re.compile(r"\((C751\d)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized")


def parse_ptxas(text: str) -> PtxasReport:
    values = {}
    for key, pattern in _PTXAS_NUMBERS.items():
        values[key] = max((int(m) for m in pattern.findall(text)), default=0)
    return PtxasReport(text=text, wgmma_serialized=tuple(sorted(set(_WGMMA_SERIALIZED.findall(text)))), **values)


def compile_spec(spec: KernelSpec, folder: Path, extra_flags: Sequence[str] = (),
                 suffix: str = "") -> tuple[Path, PtxasReport]:
    """spec rendered into folder/NAME.cu and compiled to folder/NAME{suffix}.cubin outside the cache (compile_cubin's
    extra_flags): the profiling scripts' diagnostic builds."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise CompileError(f"{spec.name}: no nvcc (set TRACE_KERNELS_NVCC or put nvcc on PATH)")
    source = folder / f"{spec.name}.cu"
    source.write_text(spec.render())
    cubin = folder / f"{spec.name}{suffix}.cubin"
    return cubin, compile_cubin(spec, source, cubin, nvcc, extra_flags)


def compile_cubin(spec: KernelSpec, source: Path, cubin: Path, nvcc: str,
                  extra_flags: Sequence[str] = ()) -> PtxasReport:
    """source .cu -> cubin for sm_90a; raises CompileError with nvcc's message on failure.

    extra_flags go before the include paths (an -I there wins over the package's headers): the profiling scripts'
    diagnostic builds (-D macros, another commit's header tree). The JIT cache never passes any."""
    cmd = [nvcc, *flags(spec), *extra_flags, *include_flags(spec), "-o", str(cubin), str(source)]
    if env.flag("VERBOSE"):
        print("[trace_kernels] " + " ".join(cmd), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CompileError(f"nvcc failed for {spec.name} (exit {result.returncode}):\n"
                           f"{' '.join(cmd)}\n{result.stdout}{result.stderr}")
    report = parse_ptxas(result.stdout + result.stderr)
    if env.flag("VERBOSE"):
        print(report.text.strip(), flush=True)
    if env.flag("PTXAS_CHECK") and (report.spill_stores or report.spill_loads or report.stack_frame
                                    or report.wgmma_serialized):
        raise CompileError(f"{spec.name}: ptxas reports {report.spill_stores} B spill stores, "
                           f"{report.spill_loads} B spill loads, {report.stack_frame} B stack frame, serialized "
                           f"wgmma {list(report.wgmma_serialized)} (TRACE_KERNELS_PTXAS_CHECK=1)\n{report.text}")
    return report
