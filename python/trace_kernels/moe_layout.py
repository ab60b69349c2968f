"""The NVFP4 expert-weight layout the MoE GEMM kernel consumes, and the gate/up row interleave.

Natural NVFP4 (what `nvfp4.quantize(w_e, scale="tensor")` returns per expert):
    codes [E, N, K/2] uint8, block_scales [E, N, K/16] e4m3, scale [E] float32.

Kernel ("fragment-ordered") layout, `MoEWeights`: the weight rows are the wgmma M side and each
thread of a 128-thread warpgroup dequantizes its own A fragment in registers, so the bytes are
stored in the order the threads consume them. For expert e, row tile t (64 rows) and K chunk c
(64 elements = 4 k16 steps), one contiguous record:
    codes        [E, N/64, K/64, 2048] uint8: thread i = 32*w + 4*g + q owns bytes [16*i, 16*i+16),
                 one 32-bit word per k16 step j. Before encoding, byte 4*j + 2*kh + h of the thread's
                 record holds elements k, k+1 (low nibble k) of row r = 16*w + 8*h + g, with
                 k = 64*c + 16*j + 8*kh + 2*q (= wgmma A registers a0..a3 of step j: a0 row r, a1 row
                 r+8, a2 row r k+8, a3 row r+8 k+8); each such "fragment word" is stored encoded
                 (moe_encoding.encode_code_words) so the kernel forms a register with 2 ALU operations.
    block_scales [E, N/64, K/64, 256] uint8: byte 64*w + 8*g + 2*j + h is the scale of row
                 16*w + 8*h + g for elements [64*c + 16*j, +16), encoded (moe_encoding.encode_scales:
                 S0E5M3, every E4M3 value normal); a thread reads 8 bytes.
    scale        [E] float32 (per-expert tensor scale).
`pack_weights` / `unpack_weights` convert (a byte permutation plus the two bijective encodings).
Blocks whose scale is zero have all-zero codes in the packed layout (the kernel relies on it;
quantization writes them so).

Gate/up interleave: the fused gate_up weight [E, 2I, H] stores, for every 16-row group b,
gate rows 8b..8b+7 then up rows 8b..8b+7. A wgmma accumulator thread holds rows r and r+8 of
the same token columns, i.e. gate and up of the same intermediate index: SwiGLU needs no shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import moe_encoding, nvfp4

TILE_ROWS = 64  # weight rows per warpgroup tile (wgmma M)
CHUNK_K = 64  # K elements per packed record (4 k16 steps)
INTERLEAVE = 8  # gate/up rows per interleave group
CODE_RECORD_BYTES = TILE_ROWS * CHUNK_K // 2  # 2048
SCALE_RECORD_BYTES = TILE_ROWS * CHUNK_K // nvfp4.BLOCK_SIZE  # 256

__all__ = [
    "MoEWeights",
    "dequantize_weights",
    "empty_weights",
    "interleave_gate_up",
    "pack_weights",
    "pack_weights_",
    "quantize_weights",
    "split_gate_up",
    "store_fragments_",
    "unpack_weights",
]


@dataclass(frozen=True)
class MoEWeights:
    """Per-expert NVFP4 weights [E, N, K] in the kernel's fragment-ordered layout."""

    codes: torch.Tensor  # uint8 [E, N/64, K/64, 2048]
    block_scales: torch.Tensor  # uint8 [E, N/64, K/64, 256], encoded (moe_encoding.encode_scales)
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
        if self.block_scales.dtype != torch.uint8:
            raise TypeError(f"{name}.block_scales must be uint8 (encoded scales, see moe_layout.pack_weights), "
                            f"got {self.block_scales.dtype}")
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


def _fragment_views(codes: torch.Tensor, block_scales: torch.Tensor, groups: int = 1):
    """Natural codes [E, N, K/2] / block scales [E, N, K/16] as views in the packed record order.

    groups = 2 reads the rows as [gate; up] halves and interleaves them by 8 (interleave_gate_up)
    in the same view. Returns codes (e, t, c, w, g, q, j, kh, h) and scale bytes (e, t, c, w, g, j, h).
    """
    e, n, half_k = codes.shape
    t, c = n // TILE_ROWS, 2 * half_k // CHUNK_K
    scale_bytes = block_scales.view(torch.uint8)
    if groups == 1:  # rows = (t, w, h, g)
        return (codes.reshape(e, t, 4, 2, 8, c, 4, 2, 4).permute(0, 1, 5, 2, 4, 8, 6, 7, 3),
                scale_bytes.reshape(e, t, 4, 2, 8, c, 4).permute(0, 1, 5, 2, 4, 6, 3))
    # interleaved row 64t + 16w + 8h + g holds natural row h*I + 32t + 8w + g (h = 0 gate, 1 up)
    return (codes.reshape(e, 2, t, 4, 8, c, 4, 2, 4).permute(0, 2, 5, 3, 4, 8, 6, 7, 1),
            scale_bytes.reshape(e, 2, t, 4, 8, c, 4).permute(0, 2, 5, 3, 4, 6, 1))


def _zero_unscaled_blocks(codes: torch.Tensor, block_scales: torch.Tensor) -> torch.Tensor:
    """codes [E, N, K/2] with the codes of zero-scale blocks set to +0 (the kernel's precondition)."""
    e, n, half_k = codes.shape
    zero = (block_scales.view(torch.uint8) & 0x7F) == 0  # [E, N, K/16]
    blocks = codes.reshape(e, n, half_k // 8, 8)
    return torch.where(zero.unsqueeze(-1), torch.zeros_like(blocks), blocks).reshape(e, n, half_k)


def store_fragments_(dst: MoEWeights, codes: torch.Tensor, block_scales: torch.Tensor, scale: torch.Tensor,
                     groups: int = 1, *, kernel: bool | None = None) -> MoEWeights:
    """Natural NVFP4 -> dst's buffers in the packed layout, in place (addresses unchanged: captured
    CUDA graphs stay valid). groups = 2: codes are [gate; up] rows, stored interleaved.

    kernel: None = the moe_pack kernel for CUDA tensors (ops/moe_pack.py), the torch path below
    otherwise; False = always the torch path (the reference the kernel is tested against).
    """
    if codes.dtype != torch.uint8 or block_scales.dtype != torch.float8_e4m3fn:
        raise TypeError(f"natural NVFP4 needs uint8 codes and float8_e4m3fn block scales, got {codes.dtype} and "
                        f"{block_scales.dtype}")
    if codes.dim() != 3:
        raise ValueError(f"codes must be [E, N, K/2], got shape {tuple(codes.shape)}")
    e, n, half_k = codes.shape
    dst.validate(n=n, k=2 * half_k, name="dst")
    if dst.num_experts != e:
        raise ValueError(f"dst has {dst.num_experts} experts, codes {e}")
    if tuple(block_scales.shape) != (e, n, half_k // 8) or tuple(scale.shape) != (e,):
        raise ValueError(f"block_scales {tuple(block_scales.shape)} / scale {tuple(scale.shape)} do not match "
                         f"codes {tuple(codes.shape)}")
    if groups not in (1, 2):
        raise ValueError(f"groups must be 1 or 2, got {groups}")
    if kernel is None:
        kernel = codes.is_cuda
    if kernel:
        from trace_kernels.ops import moe_pack
        moe_pack.pack_(dst, codes, block_scales, scale, groups)
        return dst
    frag_codes, frag_scales = _fragment_views(_zero_unscaled_blocks(codes, block_scales), block_scales, groups)
    t, c = n // TILE_ROWS, 2 * half_k // CHUNK_K
    words = frag_codes.reshape(e, t, c, CODE_RECORD_BYTES // 4, 4)  # one fragment word per (thread, step)
    dst.codes.view(e, t, c, CODE_RECORD_BYTES // 4, 4).copy_(moe_encoding.encode_code_words(words))
    dst.block_scales.view(e, t, c, 4, 8, 4, 2).copy_(
        moe_encoding.encode_scales(frag_scales.contiguous().view(torch.float8_e4m3fn)))
    dst.scale.copy_(scale)
    return dst


def empty_weights(experts: int, n: int, k: int, device=None) -> MoEWeights:
    """Zeroed packed weights [E, N, K] (allocated once; pack_weights_ / refit write into them)."""
    _check_nk(n, k)
    t, c = n // TILE_ROWS, k // CHUNK_K
    return MoEWeights(codes=torch.zeros(experts, t, c, CODE_RECORD_BYTES, dtype=torch.uint8, device=device),
                      block_scales=torch.zeros(experts, t, c, SCALE_RECORD_BYTES, dtype=torch.uint8, device=device),
                      scale=torch.zeros(experts, dtype=torch.float32, device=device))


def pack_weights(codes: torch.Tensor, block_scales: torch.Tensor, scale: torch.Tensor) -> MoEWeights:
    """Natural per-expert NVFP4 (codes [E, N, K/2], block_scales [E, N, K/16], scale [E]) -> MoEWeights.

    Block scales must be non-negative and finite (what quantization writes; checked: a device sync).
    """
    e, n, half_k = codes.shape
    _check_nk(n, 2 * half_k)
    values = block_scales.to(torch.float32)
    if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
        raise ValueError("block scales must be non-negative and finite (the packed encoding assumes it)")
    return store_fragments_(empty_weights(e, n, 2 * half_k, codes.device), codes, block_scales,
                            scale.to(torch.float32))


def pack_weights_(dst: MoEWeights, codes: torch.Tensor, block_scales: torch.Tensor, scale: torch.Tensor) -> MoEWeights:
    """pack_weights into dst's existing buffers (addresses unchanged: captured CUDA graphs stay valid).

    The RL weight sync: refit_weights (issue 3) writes natural per-expert NVFP4; this permutes and
    encodes it into the kernel's layout (no value check: refit's output is valid by construction).
    """
    return store_fragments_(dst, codes, block_scales, scale)


def unpack_weights(w: MoEWeights) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of pack_weights: (codes [E, N, K/2], block_scales [E, N, K/16], scale [E])."""
    e, t, c, _ = w.codes.shape
    words = moe_encoding.decode_code_words(w.codes.reshape(e, t, c, CODE_RECORD_BYTES // 4, 4))
    codes = words.reshape(e, t, c, 4, 8, 4, 4, 2, 2).permute(0, 1, 3, 8, 4, 2, 6, 7, 5)
    scales = moe_encoding.decode_scales(w.block_scales).view(torch.uint8)
    scales = scales.reshape(e, t, c, 4, 8, 4, 2).permute(0, 1, 3, 6, 4, 2, 5)
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
