"""Thin, checked access to the CUDA driver through cuda-python (cuda.bindings.driver).

No torch C++ extension: kernels are cubins loaded with cuModuleLoadData, so they do not depend on
torch's ABI. Every driver result is checked; failures raise CudaError naming the kernel and error.
"""

from __future__ import annotations

import functools
import threading


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the kernel (when known) and the error."""


@functools.lru_cache(maxsize=1)
def driver():
    from cuda.bindings import driver as cu  # imported lazily: CPU-only installs never touch it
    return cu


def check(result, what: str, kernel: str | None = None):
    """Unpack a cuda.bindings (err, *values) tuple; raise CudaError unless err is CUDA_SUCCESS."""
    cu = driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        where = f"kernel {kernel}: " if kernel else ""
        raise CudaError(f"{where}{what} failed with {name} ({text})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


_init_lock = threading.Lock()
_initialized = False


def ensure_context(device_index: int) -> None:
    """Make torch's primary context for device_index current on this thread (cuda-python calls need it)."""
    global _initialized
    cu = driver()
    if not _initialized:  # runs on every launch: take the lock only until cuInit has run
        with _init_lock:
            if not _initialized:
                check(cu.cuInit(0), "cuInit")
                _initialized = True
    current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is not None and int(current) != 0:
        current_device = check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
        if int(current_device) == int(_device(device_index)):
            return
    ctx = _primary_context(device_index)
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


@functools.lru_cache(maxsize=None)
def _device(device_index: int):
    return check(driver().cuDeviceGet(device_index), "cuDeviceGet")


@functools.lru_cache(maxsize=None)
def _primary_context(device_index: int):
    return check(driver().cuDevicePrimaryCtxRetain(_device(device_index)), "cuDevicePrimaryCtxRetain")


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device_index: int) -> int:
    cu = driver()
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(check(cu.cuDeviceGetAttribute(attr, _device(device_index)), "cuDeviceGetAttribute"))
