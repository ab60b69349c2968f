"""Shared pieces of the ops: input validation (before any launch) and the non-finite status word."""

from __future__ import annotations

import functools
import threading

import torch

from trace_kernels import env

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ALIGNMENT = 16  # bytes: every pointer a kernel touches with 16-byte vectors


def new_output(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.empty, poisoned with 0xFF bytes when TRACE_KERNELS_POISON_OUTPUTS=1 (tests)."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if env.flag("POISON_OUTPUTS"):
        out.view(torch.uint8).fill_(0xFF)
    return out


def check_tensor(t: torch.Tensor, name: str, *, dtypes=None, device: torch.device | None = None,
                 dim: int | None = None, aligned: bool = True) -> None:
    """Type, dtype, device, rank, contiguity and 16-byte alignment; raises before any launch."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but the op runs on {device}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimensions, got shape {tuple(t.shape)}")
    if t.device.type == "cuda":
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (strides {t.stride()} for shape {tuple(t.shape)}); "
                             "call .contiguous() first")
        if aligned and t.numel() and t.data_ptr() % ALIGNMENT:
            raise ValueError(f"{name} must start at a {ALIGNMENT}-byte aligned address "
                             f"(data_ptr % {ALIGNMENT} = {t.data_ptr() % ALIGNMENT}); views at odd offsets are not allowed")


def check_last_dim(x: torch.Tensor, name: str = "x") -> int:
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one axis (the blocked last axis)")
    d = x.shape[-1]
    if d == 0 or d % 16:
        raise ValueError(f"{name}: last axis length D={d} must be a positive multiple of 16")
    return d


def check_rows(rows: int, name: str = "x") -> None:
    if rows >= 2**31:
        raise ValueError(f"{name} has {rows} rows; kernels index rows with int32 (split the tensor)")


@functools.lru_cache(maxsize=None)
def device_capability(device_index: int) -> tuple[int, int]:
    """(major, minor) of a device, queried once per process (the ops check it on every launch)."""
    return torch.cuda.get_device_capability(device_index)


@functools.lru_cache(maxsize=None)  # per launch otherwise: two driver queries
def resident_ctas(kernel, device_index: int, threads: int, smem: int = 0) -> int:
    """CTAs of `kernel` resident at once on the whole device (one wave of a persistent grid)."""
    from trace_kernels.runtime import driver
    return kernel.max_active_blocks_per_sm(device_index, threads, smem) * driver.multiprocessor_count(device_index)


def check_cuda_device(t: torch.Tensor) -> int:
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    major, minor = device_capability(index)
    if (major, minor) != (9, 0):
        raise RuntimeError(f"trace_kernels GPU kernels are built for sm_90a (Hopper); device {index} is sm_{major}{minor}. "
                           "Move the tensors to the CPU to use the reference implementation.")
    return index


# ---------------------------------------------------------------------------------------------
# Non-finite status word (cuda/include/trace_kernels/status.cuh), one per device.
# ---------------------------------------------------------------------------------------------

STATUS_OPS = {1: "nvfp4_quantize", 2: "nvfp4_guided_fake_quantize", 4: "nvfp4_refit_weights",
              8: "moe_gemm_gate_up_swiglu", 16: "kv_append"}  # status.cuh StatusOp
_status: dict[int, torch.Tensor] = {}
_status_lock = threading.Lock()


def _fresh_status(device_index: int) -> torch.Tensor:
    # int32 [4]: flags, count, first (uint64 = row << 32 | column, starts at all ones)
    return torch.tensor([0, 0, -1, -1], dtype=torch.int32, device=f"cuda:{device_index}")


def status_buffer(device_index: int) -> torch.Tensor:
    buf = _status.get(device_index)
    if buf is None:
        with _status_lock:
            buf = _status.setdefault(device_index, _fresh_status(device_index))
    return buf


def raise_on_nonfinite(device: int | torch.device | None = None) -> None:
    """Raise ValueError if any kernel on device saw NaN/Inf input since the last check (host sync).

    Kernels never sync; call this at step boundaries (or set TRACE_KERNELS_CHECK_FINITE=1 to check
    after every op). The word is reset after it is read.
    """
    if isinstance(device, torch.device):
        device = device.index if device.index is not None else torch.cuda.current_device()
    indices = [device] if device is not None else list(_status)
    for index in indices:
        buf = _status.get(index)
        if buf is None:
            continue
        flags, count, lo, hi = (int(v) & 0xFFFFFFFF for v in buf.tolist())
        if not flags:
            continue
        buf.copy_(_fresh_status(index))
        first = (hi << 32) | lo
        ops = ", ".join(name for bit, name in STATUS_OPS.items() if flags & bit)
        raise ValueError(f"{ops} on cuda:{index} saw {count} non-finite input element(s) (NaN or Inf); "
                         f"the first is at row {first >> 32}, column {first & 0xFFFFFFFF} (rows flattened; "
                         "refit rows are expert * N + n); the affected outputs were not written")


def after_launch(device_index: int) -> None:
    if env.flag("CHECK_FINITE"):
        raise_on_nonfinite(device_index)


# ---------------------------------------------------------------------------------------------
# Arrival counters of kernels whose last CTAs finish a shared piece of work (the MoE GEMM's fused epilogues,
# decode attention's split combine): int32 zeros that every launch leaves zero again.
# ---------------------------------------------------------------------------------------------

_counters: dict[tuple[int, str], torch.Tensor] = {}
_retired_counters: list[torch.Tensor] = []  # outgrown buffers stay alive: captured CUDA graphs use them
_counters_lock = threading.Lock()


def counter_pool(device: torch.device, count: int, pool: str, *, allocate: bool = True) -> torch.Tensor | None:
    """int32 zeros, at least `count`, shared per device and pool; the kernels given them leave them zero.

    Two launches using one pool concurrently on different streams would race on it (not supported).
    allocate=False returns None where a new or larger buffer would be needed: inside CUDA-graph capture its zero
    fill would only be captured, not run, and the buffer would live in the graph's memory pool.
    """
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else -1)
    with _counters_lock:
        buf = _counters.get((index, pool))
        if buf is None or buf.numel() < count:
            if not allocate:
                return None
            if buf is not None:
                _retired_counters.append(buf)
            buf = torch.zeros(max(count, 4096), dtype=torch.int32, device=device)
            _counters[(index, pool)] = buf
        return buf
