"""The down GEMM's per-slot rows as the combine reads them (reference of cuda/include/trace_kernels/moe_slot_rows.cuh).

Each row ys[m, :] (FP32, router weight applied) is stored as FP16 values scaled by a power of two per pair of columns
(16b + j, 16b + j + 8), j = 0..7 of each 16-column block b (the two values one lane of the wgmma accumulator holds):
    s        = clamp(biased_exponent(max |pair|) - 141, -126, 113)                   (int8, [M, H/2])
    value    = fp16_rn(ys * 2^-s), block b's pair j at positions 16b + 2j, 16b + 2j + 1   (fp16, [M, H])
    decoded  = float(value) * 2^s                                                     (FP32, exact)
so the pair's larger magnitude lands in [2^14, 2^15] and every finite FP32 row fits FP16's range. 2.5 bytes per value
against FP32's 4 for the down GEMM to write and the combine to read, and about 1% more output error (FP16's 11
significant bits; BF16 rows would add 40% and break issue 4's 2e-3: profiling/combine_rows_error.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["BLOCK", "SlotRows", "check_slot_rows", "decode_slot_rows", "empty_slot_rows", "encode_slot_rows"]

BLOCK = 16  # columns per block: 8 pairs (j, j + 8), one exponent each
_EXPONENT_MIN, _EXPONENT_MAX = -126, 113  # 2^s and 2^-s both normal FP32 numbers
_HEADROOM = 14  # the pair amax's exponent minus s: FP16's largest finite is 65504 < 2^16


class SlotRows(NamedTuple):
    values: torch.Tensor  # float16 [M, H]: row / 2^exponent, rounded to nearest
    exponents: torch.Tensor  # int8 [M, H/2]: the power-of-two exponent of each pair of columns


def empty_slot_rows(rows: int, hidden: int, device: torch.device | str) -> SlotRows:
    """The workspace moe_down writes its per-slot rows into ([rows, hidden] and [rows, hidden / 2])."""
    _check_hidden(hidden)
    return SlotRows(torch.empty(rows, hidden, dtype=torch.float16, device=device),
                    torch.empty(rows, hidden // 2, dtype=torch.int8, device=device))


def _check_hidden(hidden: int) -> None:
    if hidden % BLOCK:
        raise ValueError(f"per-slot rows need H % {BLOCK} == 0, got H={hidden}")


def check_slot_rows(rows: SlotRows, m: int, hidden: int, name: str) -> None:
    """Raise unless rows is a SlotRows of values fp16 [m, hidden] and exponents int8 [m, hidden / 2] (a clear error
    before any launch; the ops check the device and alignment on their kernel path)."""
    if not isinstance(rows, SlotRows):
        raise TypeError(f"{name} must be a moe_slot_rows.SlotRows (empty_slot_rows), got {type(rows).__name__}")
    _check_hidden(hidden)
    for part, shape, dtype in (("values", (m, hidden), torch.float16), ("exponents", (m, hidden // 2), torch.int8)):
        t = getattr(rows, part)
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise ValueError(f"{name}.{part} must be {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}")


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32 for integer e in [-126, 127] (built from its bits, as the kernel does)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def encode_slot_rows(ys: torch.Tensor) -> SlotRows:
    """ys float32 [M, H] -> SlotRows (bitwise what the down GEMM's epilogue stores for the same FP32 rows)."""
    if ys.dtype != torch.float32 or ys.dim() != 2 or ys.shape[1] % BLOCK:
        raise ValueError(f"ys must be float32 [M, H] with H % {BLOCK} == 0, got {ys.dtype} {list(ys.shape)}")
    m, h = ys.shape
    pairs = ys.reshape(m, h // BLOCK, 2, BLOCK // 2).transpose(2, 3)  # [M, H/16, 8, 2]: (j, j + 8)
    # the larger |value|'s float bits (integer order is float order here; a NaN's bits exceed every finite value's)
    amax_bits = pairs.abs().contiguous().view(torch.int32).amax(dim=-1)  # [M, H/16, 8]
    biased = (amax_bits >> 23) & 0xFF
    s = (biased - 127 - _HEADROOM).clamp(_EXPONENT_MIN, _EXPONENT_MAX)  # [M, H/16, 8]
    values = (pairs * _pow2(-s).unsqueeze(-1)).to(torch.float16)  # [M, H/16, 8, 2]
    return SlotRows(values.reshape(m, h), s.reshape(m, h // 2).to(torch.int8))


def decode_slot_rows(rows: SlotRows) -> torch.Tensor:
    """SlotRows -> float32 [M, H] in column order, exactly what the combine adds."""
    m, h = rows.values.shape
    scale = _pow2(rows.exponents.to(torch.int32)).reshape(m, h // BLOCK, BLOCK // 2, 1)  # [M, H/16, 8, 1]
    pairs = rows.values.float().reshape(m, h // BLOCK, BLOCK // 2, 2) * scale  # [M, H/16, 8, 2]
    return pairs.transpose(2, 3).reshape(m, h)
