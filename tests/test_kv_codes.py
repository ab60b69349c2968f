"""The KV cache's code layout (kv_codes): invertible, exact FP16 fields, lane-local, device constants."""

import re

import numpy as np
import torch

from trace_kernels import kv_codes, nvfp4, paths

GEN = torch.Generator().manual_seed(5)


def _as_fp16(bits: torch.Tensor) -> torch.Tensor:
    """int64 tensor of 16-bit patterns -> float64 values of those FP16s."""
    return torch.from_numpy(bits.numpy().astype(np.uint16).view(np.float16).astype(np.float64))


def _words(stored: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4k] -> int64 [..., k] little-endian 32-bit words."""
    return stored.reshape(*stored.shape[:-1], -1, 4).contiguous().view(torch.int32).squeeze(-1).long() & 0xFFFFFFFF


def test_encoding_round_trips():
    words = torch.randint(0, 256, (4096, 4), dtype=torch.uint8, generator=GEN)
    assert torch.equal(kv_codes.decode_code_words(kv_codes.encode_code_words(words)), words)
    codes = torch.randint(0, 256, (3, 5, 64), dtype=torch.uint8, generator=GEN)
    assert torch.equal(kv_codes.decode_codes(kv_codes.encode_codes(codes)), codes)
    assert not torch.equal(kv_codes.encode_codes(codes), codes)


def test_fields_are_the_fp16_values_of_every_code():
    """f_j of a stored word = FP16 (value(element 2j), value(element 2j + 1)) / VALUE_FOLD, signs of
    zeros included, for random rows holding every code."""
    codes = torch.randint(0, 256, (512, 32), dtype=torch.uint8, generator=GEN)  # 64 elements per row
    fields = kv_codes.kernel_fields(_words(kv_codes.encode_codes(codes)))  # 4 x [512, 8]
    got = torch.stack([torch.stack((_as_fp16(f & 0xFFFF), _as_fp16(f >> 16)), -1) for f in fields], -2)  # [512, 8, 4, 2]
    want = nvfp4.unpack_codes(codes)  # [512, 64] code per element
    values = torch.tensor([*nvfp4.E2M1_MAGNITUDES, *(-v for v in nvfp4.E2M1_MAGNITUDES)], dtype=torch.float64)[want.long()]
    got = got.reshape(512, 64) * kv_codes.VALUE_FOLD
    assert torch.equal(got, values)
    assert torch.equal(torch.signbit(got), want >= 8)


def test_lanes_decode_alone():
    """Byte-permuting the low (high) lanes of two tokens' words into one word decodes into pairs of the
    two tokens' same element (decode attention's P.V operand)."""
    a, b = (_words(kv_codes.encode_codes(torch.randint(0, 256, (256, 4), dtype=torch.uint8, generator=GEN)))
            for _ in range(2))
    for lane in (0, 16):
        mixed = ((a >> lane) & 0xFFFF) | (((b >> lane) & 0xFFFF) << 16)
        for fm, fa, fb in zip(kv_codes.kernel_fields(mixed), kv_codes.kernel_fields(a), kv_codes.kernel_fields(b)):
            assert torch.equal(fm & 0xFFFF, (fa >> lane) & 0xFFFF)
            assert torch.equal(fm >> 16, (fb >> lane) & 0xFFFF)


def test_device_constants_match_the_encoding():
    header = (paths.include_dir() / "trace_kernels" / "kv_codes.cuh").read_text()
    assert f"kFieldMask = 0x{kv_codes.FIELD_MASK:08X}u" in header
    assert f"kValueFold = {kv_codes.VALUE_FOLD:.0f}.f" in header
    assert kv_codes.REGISTER_SHIFTS == ((0,), (3,), (1, 6), (2, 9))
    for formula in ("f[0] = x & kFieldMask;", "f[1] = (x << 3) & kFieldMask;", "f[2] = ((x << 1) ^ (x << 6)) & kFieldMask;",
                    "f[3] = ((x << 2) ^ (x << 9)) & kFieldMask;"):
        assert formula in header, formula
    # encode_classes: the stored bits of magnitude bit t and of the sign of pair j (both lanes alike)
    encode = kv_codes._columns()[1]
    table = re.search(r"kMagnitudeColumns\[4\]\[3\] = \{(.*?)\};", header, re.S).group(1)
    columns = [[int(v, 16) for v in re.findall(r"0x([0-9A-F]+)u", row)] for row in re.findall(r"\{([^{}]*)\}", table)]
    shifts = [int(v) for v in re.search(r"kSignShift\[4\] = \{([^}]*)\}", header).group(1).split(",")]
    for j in range(4):
        for t in range(4):
            low, high = encode[8 * j + t], encode[8 * j + 4 + t]  # elements 2j, 2j + 1
            assert high == low << 16
            assert low == (columns[j][t] if t < 3 else 1 << (15 - shifts[j])), (j, t)


def test_default_decode_kernel_by_gqa_group_and_fallback():
    from trace_kernels import attention
    assert attention.default_variant("nvfp4", 32, 4, 128, 16) == attention.DEFAULT_NVFP4_VARIANT == "mma4l"
    assert attention.default_variant("nvfp4", 32, 4, 128, 8) == attention.NVFP4_FALLBACK_VARIANT  # pages < 16 tokens
    assert attention.default_variant("nvfp4", 64, 32, 128, 16) == attention.NVFP4_FALLBACK_VARIANT  # 64 warps per CTA
    assert attention.default_variant("bf16", 32, 4, 128, 16) == attention.DEFAULT_BF16_VARIANT
    # GQA groups above 8 (16, 12, 32): the two-column-block kernel; up to 8 (5): mma4l
    wide = attention.DEFAULT_NVFP4_WIDE_VARIANT
    for heads in ((64, 4, 128, 16), (96, 8, 128, 16), (24, 2, 64, 64), (128, 4, 128, 16)):
        assert attention.default_variant("nvfp4", *heads) == wide, heads
    assert attention.default_variant("nvfp4", 40, 8, 128, 16) == "mma4l"
    assert attention.default_variant("nvfp4", 64, 4, 128, 8) == attention.NVFP4_FALLBACK_VARIANT  # neither fits


def test_bad_code_rows_are_rejected():
    import pytest
    with pytest.raises(ValueError, match="uint8 codes"):
        kv_codes.encode_codes(torch.zeros(3, 6, dtype=torch.uint8))  # D/2 not a multiple of 4
    with pytest.raises(ValueError, match="uint8 codes"):
        kv_codes.decode_codes(torch.zeros(3, 8, dtype=torch.int32))
