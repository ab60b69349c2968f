"""Bit layout of the NVFP4 KV cache's codes, chosen so decode attention dequantizes with few ALU operations.

`nvfp4.quantize` packs element 2i in the low nibble of byte i. The KV pages (kv_cache.py) store each
row's codes as 32-bit little-endian words of 8 elements, but not as nibbles: word x holds elements
0, 2, 4, 6 in its low 16-bit lane and 1, 3, 5, 7 in its high lane, and decode attention forms the
FP16 pair (element 2j, element 2j + 1) of each j = 0..3 as

    f0 = x & M    f1 = (x << 3) & M    f2 = ((x << 1) ^ (x << 6)) & M    f3 = ((x << 2) ^ (x << 9)) & M

with M = 0x8E008E00: each half then holds the code (s e1 e0 m) at bits 15, 11, 10, 9, which as an
FP16 is exactly value(code) * 2^-14 (code 0.5 is the subnormal 2^-15); times the E4M3 block scale
as FP16 it stays exact (at most 6 significant bits, >= 2^-24). That is 5 left shifts (which ptxas
may issue on the FMA pipe as IMAD.SHL) and 4 LOP3 per word, against 7 integer operations and 4
e4m3x2 -> f16x2 conversions for nibbles. No lane-local encoding needs fewer shifts (every choice of
at most two shift terms per register over shifts 0..9 tested for invertibility).

Left shifts of at most 9 never move a bit across the two lanes, so each lane decodes alone: P.V
takes pairs of two tokens' same element, and one byte permute of two tokens' words (low lanes, or
high lanes) gives a word that decodes straight into those pairs.

The encoding is GF(2)-linear and invertible; encode_code_words / decode_code_words convert between
`nvfp4.quantize`'s nibble bytes and the cache's bytes (kv_append's kernel encodes in registers,
kv_codes.cuh). The block scales, row scales and guidance are unchanged.
"""

from __future__ import annotations

import functools

import torch

from trace_kernels import gf2_words

REGISTER_SHIFTS = ((0,), (3,), (1, 6), (2, 9))  # f_j = XOR of (x << s) over these s, masked (kv_codes.cuh)
FIELD_MASK = 0x8E008E00  # per FP16 half: sign (15), exponent bits 11..10, top mantissa bit 9
VALUE_FOLD = 16384.0  # f_j as FP16 = value(code) / VALUE_FOLD

__all__ = ["FIELD_MASK", "REGISTER_SHIFTS", "VALUE_FOLD", "decode_code_words", "decode_codes", "encode_code_words",
           "encode_codes", "kernel_fields", "prepare"]


def kernel_fields(x):
    """The four FP16x2 registers (element 2j, 2j + 1) the kernel forms from stored word x (a python
    int, or an int64 tensor of words: then four tensors)."""
    return tuple(functools.reduce(lambda acc, s: acc ^ ((x << s) & 0xFFFFFFFF), shifts, 0) & FIELD_MASK
                 for shifts in REGISTER_SHIFTS)


@functools.cache
def _columns() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(decode, encode) columns: nvfp4 nibble word (element 2j = low half of f_j in nibble 2j, element
    2j + 1 in nibble 2j + 1) = XOR of decode[b] over set bits b of the stored word, and back."""
    return gf2_words.code_word_columns(kernel_fields, low_bit=9)


def encode_code_words(nibble_words: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4] words of `nvfp4.quantize` codes (two per byte, low nibble first) -> stored words."""
    return gf2_words.apply(nibble_words, _columns()[1])


def decode_code_words(stored: torch.Tensor) -> torch.Tensor:
    """Inverse of encode_code_words."""
    return gf2_words.apply(stored, _columns()[0])


def prepare(device) -> None:
    """Build the conversion tables on device now (e.g. before a CUDA graph capture, which must not
    create them)."""
    for columns in _columns():
        gf2_words.tables(columns, torch.device(device))


def _words(codes: torch.Tensor) -> torch.Tensor:
    if codes.dtype != torch.uint8 or codes.dim() == 0 or codes.shape[-1] % 4:
        raise ValueError(f"expected uint8 codes [..., D/2] with D a multiple of 8, got {codes.dtype} "
                         f"{tuple(codes.shape)}")
    return codes.reshape(*codes.shape[:-1], codes.shape[-1] // 4, 4)


def encode_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., D/2] nvfp4 codes of rows -> the cache's bytes of the same rows."""
    return encode_code_words(_words(codes)).reshape(codes.shape)


def decode_codes(stored: torch.Tensor) -> torch.Tensor:
    """The cache's uint8 [..., D/2] code bytes -> nvfp4 codes (inverse of encode_codes)."""
    return decode_code_words(_words(stored)).reshape(stored.shape)
