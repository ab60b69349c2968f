"""cuda-python runtime: load cubins, launch on torch's current stream, checked errors.

    kernel = trace_kernels.runtime.kernel_for(spec)   # AOT / JIT cache / compile, loaded once
    kernel.launch(device_index, grid, block, [ptr(x), i32(rows), ...])
"""

from __future__ import annotations

import threading

from trace_kernels.codegen.spec import KernelSpec
from trace_kernels.runtime.driver import CudaError, check, ensure_context, multiprocessor_count
from trace_kernels.runtime.graphs import capture_graph
from trace_kernels.runtime.kernel import CudaKernel, f32, i32, i64, ptr, struct, u32

__all__ = ["CudaError", "CudaKernel", "capture_graph", "check", "ensure_context", "f32", "i32", "i64", "install_kernel",
           "kernel_for", "multiprocessor_count", "ptr", "struct", "u32"]

_kernels: dict[str, CudaKernel] = {}
_lock = threading.Lock()


def install_kernel(kernel: CudaKernel) -> None:
    """Make kernel_for return `kernel` for every spec named kernel.name in this process: a build other than the cache's
    (the profiling scripts' instrumented builds and header-tree A/Bs). Another install replaces it."""
    with _lock:
        _kernels[kernel.name] = kernel


def kernel_for(spec: KernelSpec) -> CudaKernel:
    """The loaded kernel for spec, building it first if needed (memoized per process)."""
    kernel = _kernels.get(spec.name)
    if kernel is None:
        from trace_kernels import jit
        path = jit.cubin_for(spec)
        with _lock:
            kernel = _kernels.setdefault(spec.name, CudaKernel(spec.name, path))
    return kernel
