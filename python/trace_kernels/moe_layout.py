"""The NVFP4 expert-weight layout the MoE GEMM kernel consumes, and the gate/up row interleave.

Natural NVFP4 (what `nvfp4.quantize(w_e, scale="tensor")` returns per expert):
    codes [E, N, K/2] uint8, block_scales [E, N, K/16] e4m3, scale [E] float32.

Kernel ("fragment-ordered") layout, `MoEWeights`: the weight rows are the wgmma M side and each
thread of a 128-thread warpgroup dequantizes its own A fragment in registers, so the bytes are
stored in the order the threads consume them. For expert e, row tile t (64 rows) and K chunk c
(64 elements = 4 k16 steps), one contiguous record:
    codes        [E, N/64, K/64, 2048]: thread i = 32*w + 4*g + q owns bytes [16*i, 16*i+16);
                 its byte 4*j + 2*kh + h holds elements k, k+1 (low nibble k) of row
                 r = 16*w + 8*h + g, with k = 64*c + 16*j + 8*kh + 2*q.  (= wgmma A registers
                 a0..a3 of k16 step j: a0 row r, a1 row r+8, a2 row r k+8, a3 row r+8 k+8.)
    block_scales [E, N/64, K/64, 256]: byte 64*w + 8*g + 2*j + h is the E4M3 scale of row
                 16*w + 8*h + g for elements [64*c + 16*j, +16); a thread reads 8 bytes.
    scale        [E] float32 (per-expert tensor scale).
`pack_weights` / `unpack_weights` convert; they are pure byte permutations (no arithmetic).

Gate/up interleave: the fused gate_up weight [E, 2I, H] stores, for every 16-row group b,
gate rows 8b..8b+7 then up rows 8b..8b+7. A wgmma accumulator thread holds rows r and r+8 of
the same token columns, i.e. gate and up of the same intermediate index: SwiGLU needs no shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import nvfp4

TILE_ROWS = 64  # weight rows per warpgroup tile (wgmma M)
CHUNK_K = 64  # K elements per packed record (4 k16 steps)
INTERLEAVE = 8  # gate/up rows per interleave group
CODE_RECORD_BYTES = TILE_ROWS * CHUNK_K // 2  # 2048
SCALE_RECORD_BYTES = TILE_ROWS * CHUNK_K // nvfp4.BLOCK_SIZE  # 256

__all__ = [
    "MoEWeights",
    "dequantize_weights",
    "interleave_gate_up",
    "pack_weights",
    "pack_weights_",
    "quantize_weights",
    "split_gate_up",
    "unpack_weights",
]


@dataclass(frozen=True)
class MoEWeights:
    """Per-expert NVFP4 weights [E, N, K] in the kernel's fragment-ordered layout."""

    codes: torch.Tensor  # uint8 [E, N/64, K/64, 2048]
    block_scales: torch.Tensor  # float8_e4m3fn [E, N/64, K/64, 256]
    scale: torch.Tensor  # float32 [E]

    @property
    def num_experts(self) -> int:
        return self.codes.shape[0]

    @property
    def n(self) -> int:
        return self.codes.shape[1] * TILE_ROWS

    @property
    def k(self) -> int:
        return self.codes.shape[2] * CHUNK_K

    @property
    def device(self) -> torch.device:
        return self.codes.device

    def to(self, device) -> "MoEWeights":
        return MoEWeights(self.codes.to(device), self.block_scales.to(device), self.scale.to(device))

    def validate(self, n: int | None = None, k: int | None = None, name: str = "weights") -> None:
        """Raise a clear exception if the tensors do not form a valid packed weight."""
        if not isinstance(self.codes, torch.Tensor) or self.codes.dtype != torch.uint8:
            raise TypeError(f"{name}.codes must be a uint8 tensor (see moe_layout.pack_weights)")
        if self.block_scales.dtype != torch.float8_e4m3fn:
            raise TypeError(f"{name}.block_scales must be float8_e4m3fn, got {self.block_scales.dtype}")
        if self.scale.dtype != torch.float32:
            raise TypeError(f"{name}.scale must be float32, got {self.scale.dtype}")
        if self.codes.dim() != 4 or self.codes.shape[-1] != CODE_RECORD_BYTES:
            raise ValueError(f"{name}.codes must have shape [E, N/64, K/64, {CODE_RECORD_BYTES}] "
                             f"(fragment-ordered layout), got {tuple(self.codes.shape)}")
        expect_scales = (*self.codes.shape[:3], SCALE_RECORD_BYTES)
        if tuple(self.block_scales.shape) != expect_scales:
            raise ValueError(f"{name}.block_scales must have shape {expect_scales}, got {tuple(self.block_scales.shape)}")
        if tuple(self.scale.shape) != (self.codes.shape[0],):
            raise ValueError(f"{name}.scale must have shape [E]={self.codes.shape[0]}, got {tuple(self.scale.shape)}")
        for t, what in ((self.codes, "codes"), (self.block_scales, "block_scales"), (self.scale, "scale")):
            if not t.is_contiguous():
                raise ValueError(f"{name}.{what} must be contiguous")
            if t.device != self.codes.device:
                raise ValueError(f"{name}.{what} is on {t.device}, codes on {self.codes.device}")
        if n is not None and self.n != n:
            raise ValueError(f"{name} has N={self.n} rows per expert, expected {n}")
        if k is not None and self.k != k:
            raise ValueError(f"{name} has K={self.k}, expected {k}")


def _check_nk(n: int, k: int) -> None:
    if n % TILE_ROWS or k % CHUNK_K:
        raise ValueError(f"expert weight [N={n}, K={k}] needs N % {TILE_ROWS} == 0 and K % {CHUNK_K} == 0")


def pack_weights(codes: torch.Tensor, block_scales: torch.Tensor, scale: torch.Tensor) -> MoEWeights:
    """Natural per-expert NVFP4 (codes [E, N, K/2], block_scales [E, N, K/16], scale [E]) -> MoEWeights."""
    e, n, half_k = codes.shape
    k = 2 * half_k
    _check_nk(n, k)
    if tuple(block_scales.shape) != (e, n, k // 16) or tuple(scale.shape) != (e,):
        raise ValueError(f"block_scales {tuple(block_scales.shape)} / scale {tuple(scale.shape)} do not match codes {tuple(codes.shape)}")
    t, c = n // TILE_ROWS, k // CHUNK_K
    # rows = (t, w, h, g), code bytes = (c, j, kh, q)
    packed = codes.reshape(e, t, 4, 2, 8, c, 4, 2, 4).permute(0, 1, 5, 2, 4, 8, 6, 7, 3)
    # rows = (t, w, h, g), scale bytes = (c, j)
    scales = block_scales.view(torch.uint8).reshape(e, t, 4, 2, 8, c, 4).permute(0, 1, 5, 2, 4, 6, 3)
    return MoEWeights(
        codes=packed.reshape(e, t, c, CODE_RECORD_BYTES).contiguous(),
        block_scales=scales.reshape(e, t, c, SCALE_RECORD_BYTES).contiguous().view(torch.float8_e4m3fn),
        scale=scale.to(torch.float32).contiguous(),
    )


def pack_weights_(dst: MoEWeights, codes: torch.Tensor, block_scales: torch.Tensor, scale: torch.Tensor) -> MoEWeights:
    """pack_weights into dst's existing buffers (addresses unchanged: captured CUDA graphs stay valid).

    The RL weight sync: refit_weights (issue 3) writes natural per-expert NVFP4; this permutes it
    into the kernel's layout with one strided copy per tensor.
    """
    e, n, half_k = codes.shape
    dst.validate(n=n, k=2 * half_k, name="dst")
    if dst.num_experts != e:
        raise ValueError(f"dst has {dst.num_experts} experts, codes {e}")
    t, c = n // TILE_ROWS, 2 * half_k // CHUNK_K
    dst.codes.view(e, t, c, 4, 8, 4, 4, 2, 2).copy_(codes.reshape(e, t, 4, 2, 8, c, 4, 2, 4).permute(0, 1, 5, 2, 4, 8, 6, 7, 3))
    dst.block_scales.view(torch.uint8).view(e, t, c, 4, 8, 4, 2).copy_(
        block_scales.view(torch.uint8).reshape(e, t, 4, 2, 8, c, 4).permute(0, 1, 5, 2, 4, 6, 3))
    dst.scale.copy_(scale)
    return dst


def unpack_weights(w: MoEWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of pack_weights: (codes [E, N, K/2], block_scales [E, N, K/16], scale [E])."""
    e, t, c, _ = w.codes.shape
    codes = w.codes.reshape(e, t, c, 4, 8, 4, 4, 2, 2).permute(0, 1, 3, 8, 4, 2, 6, 7, 5)
    scales = w.block_scales.view(torch.uint8).reshape(e, t, c, 4, 8, 4, 2).permute(0, 1, 3, 6, 4, 2, 5)
    n, k = t * TILE_ROWS, c * CHUNK_K
    return (codes.reshape(e, n, k // 2).contiguous(),
            scales.reshape(e, n, k // 16).contiguous().view(torch.float8_e4m3fn),
            w.scale)


def quantize_weights(w: torch.Tensor) -> MoEWeights:
    """BF16/FP32 expert weights [E, N, K] -> MoEWeights (one FP32 tensor scale per expert).

    Each expert is exactly `nvfp4.quantize(w[e], scale="tensor")`; the refit_weights kernel must
    write the same bytes in the packed layout.
    """
    if w.dim() != 3:
        raise ValueError(f"expert weights must be [E, N, K], got shape {tuple(w.shape)}")
    _check_nk(w.shape[1], w.shape[2])
    per_expert = [nvfp4.quantize(w[e], scale="tensor") for e in range(w.shape[0])]
    return pack_weights(torch.stack([q.codes for q in per_expert]),
                        torch.stack([q.block_scales for q in per_expert]),
                        torch.stack([q.scale for q in per_expert]))


def dequantize_weights(w: MoEWeights, *, apply_scale: bool = True) -> torch.Tensor:
    """MoEWeights -> FP32 [E, N, K] (value(code) * block scale * tensor scale)."""
    codes, block_scales, scale = unpack_weights(w)
    q = nvfp4.NVFP4Tensor(codes=codes, block_scales=block_scales, scale=scale)
    values = nvfp4.dequantize(q, apply_scale=False)  # [E, N, K]
    return values * scale.view(-1, 1, 1) if apply_scale else values


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [E, I, H] -> fused gate_up [E, 2I, H]: per 16-row group, 8 gate rows then 8 up rows."""
    if gate.shape != up.shape or gate.dim() != 3:
        raise ValueError(f"gate and up must both be [E, I, H], got {tuple(gate.shape)} and {tuple(up.shape)}")
    e, i, h = gate.shape
    if i % INTERLEAVE:
        raise ValueError(f"intermediate size I={i} must be a multiple of {INTERLEAVE}")
    g = gate.reshape(e, i // INTERLEAVE, 1, INTERLEAVE, h)
    u = up.reshape(e, i // INTERLEAVE, 1, INTERLEAVE, h)
    return torch.cat((g, u), dim=2).reshape(e, 2 * i, h)


def split_gate_up(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Interleaved [..., 2I] (columns ordered like interleave_gate_up's rows) -> gate, up [..., I]."""
    two_i = y.shape[-1]
    groups = y.reshape(*y.shape[:-1], two_i // (2 * INTERLEAVE), 2, INTERLEAVE)
    return (groups[..., 0, :].reshape(*y.shape[:-1], two_i // 2),
            groups[..., 1, :].reshape(*y.shape[:-1], two_i // 2))
