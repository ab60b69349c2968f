"""A compiled kernel: cubin bytes, loaded once per device, launched on torch's current stream.

Arguments are (ctypes type, value) pairs in the order of the extern "C" kernel's parameters;
pointers are passed as ctypes.c_void_p of tensor.data_ptr().
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Sequence

import torch

from trace_kernels.runtime.driver import check, driver, ensure_context

Arg = tuple[type, object]  # (ctypes type, python value)


def ptr(tensor: torch.Tensor | None) -> Arg:
    """A tensor's device address as a kernel pointer argument (None -> nullptr)."""
    return ctypes.c_void_p, (0 if tensor is None else tensor.data_ptr())


def i32(value: int) -> Arg:
    return ctypes.c_int32, int(value)


def i64(value: int) -> Arg:
    return ctypes.c_int64, int(value)


def u32(value: int) -> Arg:
    return ctypes.c_uint32, int(value)


def f32(value: float) -> Arg:
    return ctypes.c_float, float(value)


def struct(value: ctypes.Structure) -> Arg:
    """A ctypes.Structure passed by value (its fields laid out as the kernel's C++ struct)."""
    return (lambda s: s), value


class CudaKernel:
    def __init__(self, name: str, cubin: bytes | Path):
        self.name = name
        self.image = cubin if isinstance(cubin, bytes) else Path(cubin).read_bytes()
        self._functions: dict[int, object] = {}
        self._modules: dict[int, object] = {}
        self._smem_allowed: dict[int, int] = {}  # device -> dynamic shared memory limit set
        self._nonportable_clusters: set[int] = set()  # devices where clusters above 8 CTAs are allowed
        self._occupancy: dict[tuple[int, int, int], int] = {}  # (device, threads, smem) -> CTAs per SM
        self._lock = threading.Lock()

    def function(self, device_index: int):
        fn = self._functions.get(device_index)
        if fn is not None:
            return fn
        with self._lock:
            if device_index not in self._functions:
                cu = driver()
                ensure_context(device_index)
                image = ctypes.create_string_buffer(self.image, len(self.image))
                module = check(cu.cuModuleLoadData(ctypes.addressof(image)), "cuModuleLoadData", self.name)
                fn = check(cu.cuModuleGetFunction(module, self.name.encode()), "cuModuleGetFunction", self.name)
                self._modules[device_index] = module
                self._functions[device_index] = fn
            return self._functions[device_index]

    def global_symbol(self, device_index: int, symbol: str) -> tuple[object, int]:
        """(device address, bytes) of the module's __device__ variable `symbol` (extern "C" name) on device_index."""
        self.function(device_index)  # loads the module
        return check(driver().cuModuleGetGlobal(self._modules[device_index], symbol.encode()), "cuModuleGetGlobal",
                     self.name)

    def allow_dynamic_smem(self, device_index: int, smem: int) -> None:
        """Raise the kernel's dynamic shared-memory limit to smem (once per device and size); call before an
        occupancy query or launch that uses smem. The default limit is 48 KB minus the kernel's static shared
        memory, so even a launch below 48 KB may need it."""
        if smem <= 0 or self._smem_allowed.get(device_index, 0) >= smem:
            return
        cu = driver()
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(self.function(device_index), attr, smem), "cuFuncSetAttribute", self.name)
        self._smem_allowed[device_index] = smem
        self._occupancy = {key: n for key, n in self._occupancy.items() if key[0] != device_index}  # may differ now

    def allow_nonportable_cluster_size(self, device_index: int) -> None:
        """Let the kernel run clusters of more than 8 CTAs (up to 16 on sm_90; its __cluster_dims__ sets the size),
        once per device: without it the launch of such a kernel fails."""
        if device_index in self._nonportable_clusters:
            return
        cu = driver()
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        check(cu.cuFuncSetAttribute(self.function(device_index), attr, 1), "cuFuncSetAttribute", self.name)
        self._nonportable_clusters.add(device_index)

    def max_active_blocks_per_sm(self, device_index: int, threads: int, smem: int = 0) -> int:
        """CTAs per SM (the driver's occupancy query, asked once per device, block size and shared memory:
        launch planners ask it on every call)."""
        key = (device_index, threads, smem)
        if key not in self._occupancy:
            cu = driver()
            fn = self.function(device_index)
            self._occupancy[key] = int(check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, smem),
                                             "cuOccupancyMaxActiveBlocksPerMultiprocessor", self.name))
        return self._occupancy[key]

    def launch(self, device_index: int, grid: Sequence[int], block: Sequence[int], args: Sequence[Arg],
               *, smem: int = 0, cooperative: bool = False, pdl: bool = False) -> None:
        """Launch on torch's current stream for device_index; raises CudaError on any failure.

        pdl: programmatic dependent launch (cuda/include/trace_kernels/pdl.cuh): the kernel may start
        while the previous kernel on the stream still runs, so only for kernels whose code before
        `wait_for_prerequisite_grid()` reads nothing that kernel writes."""
        if pdl and cooperative:
            raise ValueError(f"{self.name}: a cooperative launch cannot also be a programmatic dependent launch")
        cu = driver()
        fn = self.function(device_index)
        ensure_context(device_index)
        stream = torch.cuda.current_stream(device_index).cuda_stream
        values = [ctype(value) for ctype, value in args]
        params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        gx, gy, gz = (*grid, 1, 1)[:3]
        bx, by, bz = (*block, 1, 1)[:3]
        if pdl:
            config = pdl_launch_config(cu, (gx, gy, gz), (bx, by, bz), smem, stream)
            result = cu.cuLaunchKernelEx(config, fn, ctypes.addressof(params), 0)
        elif cooperative:
            result = cu.cuLaunchCooperativeKernel(fn, gx, gy, gz, bx, by, bz, smem, stream,
                                                  ctypes.addressof(params))
        else:
            result = cu.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, ctypes.addressof(params), 0)
        check(result, f"launch grid={tuple(grid)} block={tuple(block)}", self.name)


def pdl_launch_config(cu, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int):
    """cuLaunchKernelEx's configuration for a programmatic dependent launch on `stream` (a handle)."""
    attribute = cu.CUlaunchAttribute()
    attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value.programmaticStreamSerializationAllowed = 1
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = smem
    config.hStream = cu.CUstream(stream)
    config.attrs = [attribute]
    config.numAttrs = 1
    return config
