"""Per-CTA timestamps of a kernel built with TRACE_KERNELS_CTA_TIMELINE (cuda/include/trace_kernels/cta_timeline.cuh):
the build, the read-back and the clearing that decode_timeline.py and moe_timeline.py share.

Each CTA owns a row of SLOTS words in the module's array SYMBOL: %globaltimer (ns) at points 0..6, its SM at 7,
clock64 at 8..14 and a value of the kernel's choice at 15. Points a CTA never reached stay 0 (clear_stamps before
every launch that is read).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from trace_kernels import runtime
from trace_kernels.jit import compiler
from trace_kernels.runtime.driver import check, driver

SYMBOL = "trace_kernels_cta_timeline"  # cta_timeline.cuh
SLOTS = 16  # cta_timeline.cuh: kSlots
SM_SLOT, NOTE_SLOT = 7, 15


def compile_with_stamps(spec, workdir: Path, stamps: bool = True) -> Path:
    """spec's cubin compiled by nvcc with the timeline stamps (or without, for comparison); raises CompileError."""
    cubin, report = compiler.compile_spec(spec, workdir, ["-DTRACE_KERNELS_CTA_TIMELINE"] if stamps else [],
                                          suffix="_stamps" if stamps else "")
    print(f"timeline build of {spec.name}: {report.registers} registers")
    return cubin


def stamped_cubin(spec, workdir: Path) -> Path:
    """workdir/NAME_stamps.cubin: spec built with the stamps, compiled now unless an earlier build left it there."""
    cubin = workdir / f"{spec.name}_stamps.cubin"
    return cubin if cubin.exists() else compile_with_stamps(spec, workdir)


def build_timeline_kernel(spec, workdir: Path) -> runtime.CudaKernel:
    """The kernel of `spec` with the timeline stamps (stamped_cubin), launched in its place from now on (this
    process)."""
    kernel = runtime.CudaKernel(spec.name, stamped_cubin(spec, workdir))
    runtime.install_kernel(kernel)
    return kernel


def read_stamps(kernel: runtime.CudaKernel, ctas: int | None = None) -> list[list[int]]:
    """The first `ctas` rows of the kernel's array (all of them when None), in the grid's linear CTA order."""
    dptr, size = kernel.global_symbol(0, SYMBOL)
    words = size // 8 if ctas is None else min(size // 8, ctas * SLOTS)
    host = (ctypes.c_uint64 * words)()
    check(driver().cuMemcpyDtoH(ctypes.addressof(host), dptr, words * 8), "cuMemcpyDtoH", kernel.name)
    return [list(host[i * SLOTS:(i + 1) * SLOTS]) for i in range(words // SLOTS)]


def clear_stamps(kernel: runtime.CudaKernel) -> None:
    dptr, size = kernel.global_symbol(0, SYMBOL)
    check(driver().cuMemsetD8(dptr, 0, size), "cuMemsetD8", kernel.name)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * (len(values) - 1) + 0.5))]
