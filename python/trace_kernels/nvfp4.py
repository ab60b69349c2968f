"""NVFP4 quantization and TRACE guidance: the reference every kernel must match bit for bit.

NVFP4 (docs/numerics.md has the full definition):
  element code  4 bits: sign (bit 3) | magnitude index m (bits 2..0) into E2M1_MAGNITUDES;
                bit 0 is the E2M1 mantissa bit. Two codes per uint8, element 2i in the low nibble.
  block scale   one E4M3 (float8_e4m3fn) per 16 consecutive elements of the last axis.
  scale         one FP32 per row (scale="row", all leading axes) or per tensor (scale="tensor").

Arithmetic is FP32 with IEEE round-to-nearest-even, in this order, with no reciprocals:
  s = amax(|x|) / 2688;  b = e4m3(bamax / (6 * s));  d = float(b) * s;  code = e2m1(x / d);
  s == 0 or d == 0 -> the block's codes are +0;  dequantized = value(code) * d.

Every division here takes a device tensor as divisor: PyTorch's CUDA division by a CPU scalar
multiplies by a reciprocal, which is not correctly rounded and would break bit-exactness.

TRACE guidance = the scales plus one mantissa bit per element (compact, ~1.5 bits/element) or plus
the codes (full, for audits). Guided rounding picks, of the two grid neighbours of the trainer's
x / d, the one whose mantissa bit the rollout chose.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "BLOCK_SIZE",
    "E2M1_MAGNITUDES",
    "E4M3_MAX",
    "FP4_MAX",
    "Guidance",
    "NVFP4Tensor",
    "agreement",
    "dequantize",
    "e2m1_round",
    "e4m3_round",
    "fake_quantize",
    "guided_fake_quantize",
    "guided_quantize",
    "guided_round",
    "make_guidance",
    "pack_bits",
    "pack_codes",
    "quantize",
    "straight_through",
    "unpack_bits",
    "unpack_codes",
]

BLOCK_SIZE = 16
FP4_MAX = 6.0
E4M3_MAX = 448.0
# The row/tensor scale maps amax onto the largest code times the largest block scale.
GLOBAL_SCALE_DIVISOR = FP4_MAX * E4M3_MAX  # 2688
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
SIGN_BIT = 0x8
MAGNITUDE_MASK = 0x7

ScaleMode = Literal["row", "tensor"]
GuidanceMode = Literal["compact", "full"]

# Rounding |y| to the E2M1 grid with ties to the even magnitude index: each boundary sits halfway
# between grid points m-1 and m; a tie goes up (>=) when m is even, stays down (>) when m is odd.
_E2M1_BOUNDARIES = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                    (2.5, False), (3.5, True), (5.0, False))


@dataclass(frozen=True)
class NVFP4Tensor:
    """A quantized tensor of logical shape [..., D]."""

    codes: torch.Tensor  # uint8 [..., D/2], element 2i in the low nibble
    block_scales: torch.Tensor  # float8_e4m3fn [..., D/16]
    scale: torch.Tensor  # float32 [...] (row) or [] (tensor)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.codes.shape[:-1], self.codes.shape[-1] * 2))

    def to(self, device) -> "NVFP4Tensor":
        return NVFP4Tensor(self.codes.to(device), self.block_scales.to(device), self.scale.to(device))


@dataclass(frozen=True)
class Guidance:
    """What the rollout records about one quantized tensor of logical shape [..., D].

    compact: `mantissa_bits` uint8 [..., D/8], element 8i+j in bit j of byte i; `codes` is None.
    full:    `codes` uint8 [..., D/2] (packed as in NVFP4Tensor); `mantissa_bits` is None.
    """

    scale: torch.Tensor  # float32 [...] or []
    block_scales: torch.Tensor  # float8_e4m3fn [..., D/16]
    mantissa_bits: torch.Tensor | None = None  # uint8 [..., D/8]
    codes: torch.Tensor | None = None  # uint8 [..., D/2]

    def __post_init__(self):
        if (self.mantissa_bits is None) == (self.codes is None):
            raise ValueError("Guidance needs exactly one of mantissa_bits (compact) or codes (full)")

    @property
    def mode(self) -> GuidanceMode:
        return "compact" if self.codes is None else "full"

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.block_scales.shape[:-1], self.block_scales.shape[-1] * BLOCK_SIZE))

    @property
    def numel(self) -> int:
        return self.shape.numel()

    @property
    def nbytes(self) -> int:
        payload = self.mantissa_bits if self.codes is None else self.codes
        return sum(t.numel() * t.element_size() for t in (self.scale, self.block_scales, payload))

    @property
    def bits_per_element(self) -> float:
        return 8.0 * self.nbytes / self.numel if self.numel else 0.0

    def to(self, device) -> "Guidance":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Guidance(move(self.scale), move(self.block_scales), move(self.mantissa_bits), move(self.codes))


# ----------------------------------------------------------------------------------------------
# Element-level helpers
# ----------------------------------------------------------------------------------------------

def _magnitude_table(device) -> torch.Tensor:
    return torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)  # [8]


def _code_values(codes4: torch.Tensor) -> torch.Tensor:
    """Signed FP32 value of each 4-bit code (uint8 [...] holding 0..15)."""
    magnitude = _magnitude_table(codes4.device)[(codes4 & MAGNITUDE_MASK).long()]
    return torch.where((codes4 & SIGN_BIT) != 0, -magnitude, magnitude)


def _signed_index(codes4: torch.Tensor) -> torch.Tensor:
    """Position on the signed grid -6..6 as an integer -7..7 (both zeros -> 0)."""
    m = (codes4 & MAGNITUDE_MASK).to(torch.int16)
    return torch.where((codes4 & SIGN_BIT) != 0, -m, m)


def e2m1_round(y: torch.Tensor) -> torch.Tensor:
    """Round FP32 y to the nearest E2M1 code, ties to the even mantissa bit, saturating at ±6.

    Returns uint8 codes (0..15). A value rounding to magnitude 0 encodes as +0 (code 0).
    """
    magnitude = y.abs()
    m = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for boundary, tie_goes_up in _E2M1_BOUNDARIES:
        above = magnitude >= boundary if tie_goes_up else magnitude > boundary
        m += above.to(torch.uint8)
    negative = (y < 0) & (m != 0)
    return m | (negative.to(torch.uint8) << 3)


def e4m3_round(t: torch.Tensor) -> torch.Tensor:
    """FP32 -> float8_e4m3fn, round to nearest even, saturating at ±448 (NaN never produced)."""
    return t.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def pack_codes(codes4: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D] of 4-bit codes -> uint8 [..., D/2], element 2i in the low nibble."""
    pairs = codes4.reshape(*codes4.shape[:-1], codes4.shape[-1] // 2, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def unpack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D/2] -> uint8 [..., D] of 4-bit codes."""
    _check_dtype(codes, torch.uint8, "codes")
    low, high = codes & 0x0F, codes >> 4
    return torch.stack((low, high), dim=-1).reshape(*codes.shape[:-1], codes.shape[-1] * 2)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D] of 0/1 -> uint8 [..., D/8], element 8i+j in bit j of byte i."""
    octets = bits.reshape(*bits.shape[:-1], bits.shape[-1] // 8, 8).to(torch.uint8)
    shifts = torch.arange(8, dtype=torch.uint8, device=bits.device)
    return (octets << shifts).sum(dim=-1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D/8] -> uint8 [..., D] of 0/1."""
    _check_dtype(packed, torch.uint8, "mantissa_bits")
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(*packed.shape[:-1], packed.shape[-1] * 8)


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------

_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _check_dtype(t: torch.Tensor, dtype: torch.dtype, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")


def _check_input(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_INPUTS:
        raise TypeError(f"{name} must be a floating tensor (float32/float16/bfloat16/float64), got {x.dtype}")
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one axis (the blocked last axis)")
    if x.shape[-1] == 0 or x.shape[-1] % BLOCK_SIZE != 0:
        raise ValueError(f"{name}: last axis length D={x.shape[-1]} must be a positive multiple of {BLOCK_SIZE}")
    check_finite(x, name)


def check_finite(x: torch.Tensor, name: str = "x") -> None:
    """Raise ValueError naming how many elements of x are NaN/Inf and where the first one is."""
    bad = ~torch.isfinite(x)
    count = int(bad.sum())
    if count:
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name} has {count} non-finite element(s) (NaN or Inf); the first is at index {first}")


def _check_scale_mode(scale: str) -> None:
    if scale not in ("row", "tensor"):
        raise ValueError(f"scale must be 'row' or 'tensor', got {scale!r}")


# ----------------------------------------------------------------------------------------------
# Quantize / dequantize
# ----------------------------------------------------------------------------------------------

def _blocks(x32: torch.Tensor) -> torch.Tensor:
    return x32.reshape(*x32.shape[:-1], x32.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)  # [..., D/16, 16]


def _global_scale(x32: torch.Tensor, scale: ScaleMode) -> torch.Tensor:
    """s = amax(|x|) / 2688 per row ([...]) or per tensor ([])."""
    if scale == "row":
        amax = x32.abs().amax(dim=-1)
    else:
        amax = x32.abs().amax() if x32.numel() else x32.new_zeros(())
    return amax / torch.full_like(amax, GLOBAL_SCALE_DIVISOR)


def _block_step(block_scales: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """d = float(b) * s, broadcast to [..., D/16]."""
    return block_scales.to(torch.float32) * s.unsqueeze(-1) if s.dim() else block_scales.to(torch.float32) * s


def quantize(x: torch.Tensor, *, scale: ScaleMode = "row") -> NVFP4Tensor:
    """Quantize x [..., D] (D % 16 == 0) to NVFP4 exactly as docs/numerics.md defines."""
    _check_input(x)
    _check_scale_mode(scale)
    x32 = x.to(torch.float32)
    s = _global_scale(x32, scale)  # [...] or []
    blocks = _blocks(x32)  # [..., D/16, 16]
    block_amax = blocks.abs().amax(dim=-1)  # [..., D/16]
    s_b = s.unsqueeze(-1).expand_as(block_amax) if s.dim() else s.expand_as(block_amax)
    six_s = torch.full_like(s_b, FP4_MAX) * s_b
    # s == 0 (an all-zero row, or amax / 2688 underflowing): 0/0 would be NaN; the block scale is 0.
    ratio = block_amax / torch.where(s_b == 0, torch.ones_like(six_s), six_s)
    b = e4m3_round(torch.where(s_b == 0, torch.zeros_like(ratio), ratio))  # [..., D/16]
    d = b.to(torch.float32) * s_b  # [..., D/16]
    d_safe = torch.where(d == 0, torch.ones_like(d), d)
    codes4 = e2m1_round(blocks / d_safe.unsqueeze(-1))  # [..., D/16, 16]
    codes4 = torch.where((d == 0).unsqueeze(-1), torch.zeros_like(codes4), codes4)
    codes = pack_codes(codes4.reshape(x.shape))
    return NVFP4Tensor(codes=codes, block_scales=b, scale=s)


def dequantize(q: NVFP4Tensor, dtype: torch.dtype = torch.float32, *, apply_scale: bool = True) -> torch.Tensor:
    """value(code) * float(b) * s in FP32, cast to dtype.

    apply_scale=False leaves out s: `value(code) * float(b)`, exact in BF16, the activation operand
    the MoE GEMM consumes (its row scale goes into the epilogue).
    """
    values = _code_values(unpack_codes(q.codes))  # [..., D]
    blocks = _blocks(values)  # [..., D/16, 16]
    if apply_scale:
        step = _block_step(q.block_scales, q.scale)
    else:
        step = q.block_scales.to(torch.float32)
    return (blocks * step.unsqueeze(-1)).reshape(values.shape).to(dtype)


class _StraightThrough(torch.autograd.Function):
    """Forward returns the quantized values; backward passes the gradient through unchanged."""

    @staticmethod
    def forward(ctx, x, quantized):
        return quantized

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def straight_through(x: torch.Tensor, quantized: torch.Tensor) -> torch.Tensor:
    """quantized in the forward pass, x's gradient unchanged in the backward pass.

    Exact in any dtype, unlike `x + (quantized - x).detach()`, which rounds twice in BF16.
    """
    return _StraightThrough.apply(x, quantized) if x.requires_grad else quantized


def fake_quantize(x: torch.Tensor, *, scale: ScaleMode = "row") -> torch.Tensor:
    """dequantize(quantize(x)) in x's dtype, with a straight-through gradient."""
    with torch.no_grad():
        quantized = dequantize(quantize(x.detach(), scale=scale), dtype=x.dtype)
    return straight_through(x, quantized)


# ----------------------------------------------------------------------------------------------
# TRACE guidance
# ----------------------------------------------------------------------------------------------

def make_guidance(q: NVFP4Tensor, mode: GuidanceMode = "compact") -> Guidance:
    """The rollout's record of q: scales plus mantissa bits (compact) or codes (full)."""
    if mode == "compact":
        bits = pack_bits(unpack_codes(q.codes) & 1)
        return Guidance(scale=q.scale, block_scales=q.block_scales, mantissa_bits=bits)
    if mode == "full":
        return Guidance(scale=q.scale, block_scales=q.block_scales, codes=q.codes)
    raise ValueError(f"guidance mode must be 'compact' or 'full', got {mode!r}")


def _check_guidance(x: torch.Tensor, guidance: Guidance) -> None:
    if not isinstance(guidance, Guidance):
        raise TypeError(f"guidance must be a Guidance, got {type(guidance).__name__}")
    if tuple(guidance.shape) != tuple(x.shape):
        raise ValueError(f"guidance covers shape {tuple(guidance.shape)} but x has shape {tuple(x.shape)}")
    if guidance.scale.dim() and tuple(guidance.scale.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"guidance.scale has shape {tuple(guidance.scale.shape)}, expected {tuple(x.shape[:-1])} or []")
    _check_dtype(guidance.scale, torch.float32, "guidance.scale")
    _check_dtype(guidance.block_scales, torch.float8_e4m3fn, "guidance.block_scales")
    payload, name, width = ((guidance.mantissa_bits, "mantissa_bits", 8) if guidance.mode == "compact"
                            else (guidance.codes, "codes", 2))
    _check_dtype(payload, torch.uint8, f"guidance.{name}")
    if tuple(payload.shape) != (*x.shape[:-1], x.shape[-1] // width):
        raise ValueError(f"guidance.{name} has shape {tuple(payload.shape)}, expected {(*x.shape[:-1], x.shape[-1] // width)}")
    for t in (guidance.scale, guidance.block_scales, payload):
        if t.device != x.device:
            raise ValueError(f"guidance is on {t.device} but x is on {x.device}")


def _signed_grid(device) -> torch.Tensor:
    magnitudes = _magnitude_table(device)
    return torch.cat((-magnitudes.flip(0)[:-1], magnitudes))  # [15]: -6 .. 6, signed index i - 7


def guided_round(y: torch.Tensor, guidance_bits: torch.Tensor | None = None,
                 rollout_values: torch.Tensor | None = None) -> torch.Tensor:
    """Signed grid value chosen for each FP32 y (already divided by d).

    y is clamped to [-6, 6]; on-grid values stay; otherwise of the neighbours lo < y < hi take the
    one whose mantissa bit equals guidance_bits (compact), or the one nearer to rollout_values
    (full; a tie rounds to nearest).
    """
    grid = _signed_grid(y.device)
    y = y.clamp(-FP4_MAX, FP4_MAX)
    lo_i = (torch.searchsorted(grid, y.contiguous(), right=True) - 1).clamp(0, 14)  # grid[lo_i] <= y
    hi_i = (lo_i + 1).clamp(max=14)
    lo, hi = grid[lo_i], grid[hi_i]
    on_grid = lo == y
    if guidance_bits is not None:
        lo_bit = (lo_i - 7).abs() & 1
        choose_lo = lo_bit == guidance_bits.to(lo_bit.dtype)
    else:
        nearest = _code_values(e2m1_round(y))
        dist_lo, dist_hi = (lo - rollout_values).abs(), (hi - rollout_values).abs()
        choose_lo = torch.where(dist_lo == dist_hi, nearest == lo, dist_lo < dist_hi)
    return torch.where(on_grid | choose_lo, lo, hi)


def guided_quantize(x: torch.Tensor, guidance: Guidance) -> NVFP4Tensor:
    """The codes guided rounding chooses for trainer values x [..., D], with the rollout's scales.

    d = float(b_r) * s_r from the guidance; y = x / d; blocks with d == 0 get code +0.
    """
    _check_input(x)
    _check_guidance(x, guidance)
    x32 = _blocks(x.detach().to(torch.float32))  # [..., D/16, 16]
    d = _block_step(guidance.block_scales, guidance.scale).unsqueeze(-1)  # [..., D/16, 1]
    y = x32 / torch.where(d == 0, torch.ones_like(d), d).expand_as(x32)
    if guidance.mode == "compact":
        chosen = guided_round(y, guidance_bits=_blocks(unpack_bits(guidance.mantissa_bits)))
    else:
        chosen = guided_round(y, rollout_values=_blocks(_code_values(unpack_codes(guidance.codes))))
    codes4 = torch.where(d == 0, torch.zeros_like(chosen), chosen)
    # chosen is on the grid, so rounding to nearest maps it to its own code.
    codes = pack_codes(e2m1_round(codes4).reshape(x.shape))
    return NVFP4Tensor(codes=codes, block_scales=guidance.block_scales, scale=guidance.scale)


def guided_fake_quantize(x: torch.Tensor, guidance: Guidance) -> torch.Tensor:
    """dequantize(guided_quantize(x, guidance)) in x's dtype, with a straight-through gradient."""
    with torch.no_grad():
        quantized = dequantize(guided_quantize(x.detach(), guidance), dtype=x.dtype)
    return straight_through(x, quantized)


def agreement(codes_a: torch.Tensor, codes_b: torch.Tensor) -> dict:
    """Compare two packed code tensors (uint8 [..., D/2]) element by element.

    Returns {"equal_fraction": float, "elements": int, "distance_histogram": {d: count}} where d is
    the signed grid-index distance (b minus a) on the grid -6 .. 6; d = 0 counts +0 and -0 as equal.
    """
    _check_dtype(codes_a, torch.uint8, "codes_a")
    _check_dtype(codes_b, torch.uint8, "codes_b")
    if codes_a.shape != codes_b.shape:
        raise ValueError(f"code tensors differ in shape: {tuple(codes_a.shape)} vs {tuple(codes_b.shape)}")
    distance = _signed_index(unpack_codes(codes_b)) - _signed_index(unpack_codes(codes_a.to(codes_b.device)))
    values, counts = torch.unique(distance.flatten(), return_counts=True)
    histogram = {int(v): int(c) for v, c in zip(values.tolist(), counts.tolist())}
    elements = distance.numel()
    return {
        "equal_fraction": histogram.get(0, 0) / elements if elements else 1.0,
        "elements": elements,
        "distance_histogram": histogram,
    }
