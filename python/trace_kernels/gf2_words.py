"""GF(2)-linear maps of 32-bit code words (the bit encodings of moe_encoding and kv_codes).

A map is given by its columns: the image of each set bit b of a word is columns[b], and the image
of a word is the XOR of the columns of its set bits. Applied to uint8 [..., 4] little-endian words
through two 65536-entry tables (one per 16-bit half), built once per (map, device).
"""

from __future__ import annotations

import functools

import torch

__all__ = ["apply", "code_word_columns", "invert", "tables"]


def invert(columns) -> tuple[int, ...]:
    """Columns of the inverse of the GF(2) 32x32 matrix whose column b is columns[b] (ValueError if
    it is singular)."""
    rows = [(sum(((columns[b] >> r) & 1) << b for b in range(32)), 1 << r) for r in range(32)]
    for bit in range(32):  # Gauss-Jordan on [A | I], rows as (A row, I row) bit masks
        pivot = next((i for i in range(bit, 32) if rows[i][0] >> bit & 1), None)
        if pivot is None:
            raise ValueError("the bit map is not invertible")
        rows[bit], rows[pivot] = rows[pivot], rows[bit]
        for i in range(32):
            if i != bit and rows[i][0] >> bit & 1:
                rows[i] = (rows[i][0] ^ rows[bit][0], rows[i][1] ^ rows[bit][1])
    inverse_rows = [r[1] for r in rows]  # row i of A^-1
    return tuple(sum(((inverse_rows[i] >> b) & 1) << i for i in range(32)) for b in range(32))


def code_word_columns(registers_of, low_bit: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(decode, encode) columns between a kernel's stored word and the code word it stands for.

    registers_of(word) gives the kernel's four registers of two 16-bit fields each: a code's bits
    e1 e0 m at low_bit + 2 .. low_bit and its sign at bit 15 of the half. In the code word, byte j
    holds register j's low-half code in its low nibble and its high-half code in its high nibble.
    """
    def nibble(half: int) -> int:
        return ((half >> low_bit) & 7) | ((half >> 12) & 8)

    def code_word(registers) -> int:
        return sum((nibble(r & 0xFFFF) | nibble(r >> 16) << 4) << (8 * j) for j, r in enumerate(registers))

    decode = tuple(code_word(registers_of(1 << b)) for b in range(32))
    return decode, invert(decode)


@functools.cache
def tables(columns: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [65536] x 2: the map's image of every low / high 16-bit half."""
    v = torch.arange(65536, dtype=torch.int64)
    tables = []
    for base in (0, 16):
        acc = torch.zeros(65536, dtype=torch.int64)
        for b in range(16):
            acc ^= ((v >> b) & 1) * columns[base + b]
        tables.append(torch.where(acc >= 2**31, acc - 2**32, acc).to(torch.int32).to(device))
    return tables[0], tables[1]


def apply(words: torch.Tensor, columns: tuple[int, ...]) -> torch.Tensor:
    """uint8 [..., 4] little-endian words -> uint8 [..., 4] images under the map."""
    if words.shape[-1] != 4 or words.dtype != torch.uint8:
        raise ValueError(f"expected uint8 [..., 4] words, got {words.dtype} {tuple(words.shape)}")
    halves = words.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF  # [..., 2]
    lo_table, hi_table = tables(tuple(columns), words.device)
    out = lo_table.index_select(0, halves[..., 0].reshape(-1)) ^ hi_table.index_select(0, halves[..., 1].reshape(-1))
    return out.view(torch.uint8).view(words.shape)
