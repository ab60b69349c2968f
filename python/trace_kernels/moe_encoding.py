"""Bit encoding of the packed MoE weights, chosen so the kernel dequantizes with few ALU instructions.

The MoE GEMM (moe_gemm.cuh, moe_gemm_ws.cuh; moe_dequant.cuh holds the device side) feeds wgmma with
BF16 A registers = value(code) * block scale. In the packed layout (moe_layout.py) one thread's k16
step is a 32-bit "fragment word": byte i holds the two codes of A register a_i (low nibble = low
half). Stored as is, turning a byte into a BF16 pair costs a table lookup (shared memory) or ~4
ALU operations. So the packed codes are not the fragment words but an encoded word q from which each
register comes out with at most one shift of its own and one LOP3:

    a0 = q & M     a1 = rotl(q, 12) & M     a2 = (rotl(q, 8) ^ (q << 2)) & M     a3 = (rotl(q, 8) ^ (q << 6)) & M

with M = 0x81C081C0: each 16-bit half then holds code (s e1 e0 m) at bits 15, 8, 7, 6, which as a
BF16 is exactly value(code) * 2^-126 (code 0.5 becomes the subnormal 2^-127). Four shifts per word:
the two rotations are funnel shifts on the ALU pipe, and ptxas may turn the two plain left shifts
into IMAD.SHL on the FMA pipe, so the ALU pipe sees 2 shifts + 4 LOP3 per word instead of the 4 + 4
of the earlier all-rotation encoding (rotations 4, 8, 10, 14). No encoding with fewer than four
distinct shifts exists, and none with one rotation or right shift and three left shifts (searched
over GF(2): every choice of register terms tested for invertibility). q -> (a0..a3) is an
invertible GF(2)-linear map; the torch packer applies its inverse through two 65536-entry tables,
the moe_pack and refit_packed kernels through four 256-entry byte tables built from encode_columns().

Block scales are re-encoded as c = bits 14..7 of fp16(b * 2^7): an unsigned 5-bit-exponent,
3-bit-mantissa byte in which every E4M3 value, subnormals included, is a normal number (0 stays 0).
The kernel forms the BF16 (c << 4) + 0x7000 = b * 2^119 (no branch for subnormal scales), so
a_i * scale = value * b * 2^-7 exactly; the epilogue's per-row scale carries the 2^7 back
(WEIGHT_SCALE_FOLD). A zero block scale decodes to 2^97, which is harmless only because such a
block's codes are +-0: the packer zeroes the codes of zero-scale blocks (quantization already does).
"""

from __future__ import annotations

import functools

import torch

from trace_kernels import gf2_words

# a0..a3 = XOR of these terms of q, masked (moe_dequant.cuh dequant_step): ("id",), ("rotl", s), ("shl", s)
REGISTER_TERMS = ((("id",),), (("rotl", 12),), (("rotl", 8), ("shl", 2)), (("rotl", 8), ("shl", 6)))
FIELD_MASK = 0x81C081C0  # per BF16 half: sign (15), exponent bits 8..7, top mantissa bit 6
SCALE_BIAS = 0x7000  # BF16 of scale byte c = (c << 4) + SCALE_BIAS = b * 2^119
WEIGHT_SCALE_FOLD = 128.0  # a_i * scale = value * b / WEIGHT_SCALE_FOLD

__all__ = ["FIELD_MASK", "REGISTER_TERMS", "SCALE_BIAS", "WEIGHT_SCALE_FOLD", "apply_term", "decode_code_words",
           "decode_scales", "encode_code_words", "encode_columns", "encode_scales", "kernel_registers",
           "kernel_scale_bf16"]


def apply_term(q, term):
    """One REGISTER_TERMS term of q: python ints or int64 tensors holding 32-bit words."""
    if term[0] == "id":
        return q
    s = term[1]
    if term[0] == "shl":
        return (q << s) & 0xFFFFFFFF
    if term[0] == "rotl":
        return ((q << s) | (q >> (32 - s))) & 0xFFFFFFFF
    raise ValueError(f"unknown term {term!r}")


def kernel_registers(q):
    """The four BF16x2 A registers the kernel forms from encoded word q (a python int, or an int64
    tensor of words: then four tensors)."""
    regs = []
    for terms in REGISTER_TERMS:
        r = 0
        for term in terms:
            r ^= apply_term(q, term)
        regs.append(r & FIELD_MASK)
    return tuple(regs)


@functools.cache
def _columns() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(decode, encode) columns: fragment word (byte i = the codes of register a_i, low half in the low
    nibble) = XOR of decode[b] over set bits b of q, and back. Code bits e1 e0 m sit at bits 8..6."""
    return gf2_words.code_word_columns(kernel_registers, low_bit=6)


def encode_columns() -> tuple[int, ...]:
    """The encoded word of each fragment-word bit b (the encoding is the XOR over the set bits)."""
    return _columns()[1]


def encode_code_words(fragment_words: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4] fragment words (byte i = codes of A register a_i) -> encoded words."""
    return gf2_words.apply(fragment_words, _columns()[1])


def decode_code_words(encoded: torch.Tensor) -> torch.Tensor:
    """Inverse of encode_code_words (what the kernel's rotate + LOP3 forms, as fragment words)."""
    return gf2_words.apply(encoded, _columns()[0])


def encode_scales(block_scales: torch.Tensor) -> torch.Tensor:
    """E4M3 block scales (any shape; non-negative, finite) -> uint8 scale bytes c."""
    half_bits = (block_scales.to(torch.float32) * 128.0).to(torch.float16).view(torch.int16).to(torch.int32)
    return ((half_bits >> 7) & 0xFF).to(torch.uint8)


def decode_scales(scale_bytes: torch.Tensor) -> torch.Tensor:
    """Inverse of encode_scales -> float8_e4m3fn (exact)."""
    half = (scale_bytes.to(torch.int32) << 7).to(torch.int16).view(torch.float16)
    return (half.to(torch.float32) / 128.0).to(torch.float8_e4m3fn)


def kernel_scale_bf16(scale_bytes: torch.Tensor) -> torch.Tensor:
    """The BF16 the kernel forms from scale bytes c: (c << 4) + SCALE_BIAS (= b * 2^119), as float32."""
    bits = (scale_bytes.to(torch.int32) << 4) + SCALE_BIAS
    return (bits << 16).view(torch.float32)
