"""ops.refit_weights_packed_ on the CPU: the reference composition, the kernel's index arithmetic mirrored in
torch, argument checks before any launch, codegen, and the sm_90a compile (nvcc)."""

from __future__ import annotations

import pytest
import torch

from trace_kernels import codegen, moe_encoding, moe_layout, ops, shapes
from trace_kernels.codegen.ops import refit_packed as codegen_packed


def _weights(e, n, k, dtype=torch.bfloat16, seed=0):
    w = torch.randn(e, n, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
    w[0, 3] = 0  # a zero row: zero block scales
    w[0, 5, :16] *= 1e-6  # a block far below the expert's amax: subnormal E4M3 scale or 0
    if e > 1:
        w[1] = 0  # an all-zero expert: scale 0
    return w


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_equals_refit_then_store_fragments(groups, dtype):
    e, n, k = 3, 128, 192
    w = _weights(e, n, k, dtype)
    staging = ops.allocate_refit_buffers(e, n, k, "cpu")
    ops.refit_weights(w, staging)
    want = moe_layout.store_fragments_(moe_layout.empty_weights(e, n, k), staging.codes, staging.block_scales,
                                       staging.scale, groups, kernel=False)
    got = moe_layout.empty_weights(e, n, k)
    for t in (got.codes, got.block_scales):
        t.fill_(0xAB)
    ptrs = [t.data_ptr() for t in (got.codes, got.block_scales, got.scale)]
    assert ops.refit_weights_packed_(w, got, groups=groups) is got
    assert ptrs == [t.data_ptr() for t in (got.codes, got.block_scales, got.scale)]
    assert torch.equal(got.codes, want.codes) and torch.equal(got.block_scales, want.block_scales)
    assert torch.equal(got.scale, want.scale) and float(got.scale[1]) == 0.0
    if groups == 2:  # = quantize_weights of the interleaved rows
        ref = moe_layout.quantize_weights(moe_layout.interleave_gate_up(w[:, : n // 2], w[:, n // 2:]))
        assert torch.equal(got.codes, ref.codes) and torch.equal(got.block_scales, ref.block_scales)


def _mirror_kernel(codes, block_scales, groups):
    """refit_packed.cuh's indexing on natural NVFP4 (what its quantization writes), in python ints: lane
    L = 8w + g of a record's warp, rows r(h) = 16w + 8h + g, code bytes of block (r(h), j) looked up in
    the four byte tables, 16 words at 64 L + 16 q + 4 j, scale byte 2 j + h at 8 L."""
    e_n, n, half_k = codes.shape
    tiles, chunks = n // 64, 2 * half_k // 64
    columns = moe_encoding.encode_columns()
    table = [[0] * 256 for _ in range(4)]
    for byte in range(4):
        for v in range(256):
            for b in range(8):
                if v >> b & 1:
                    table[byte][v] ^= columns[8 * byte + b]
    enc_scale = moe_encoding.encode_scales(block_scales).tolist()
    scale_bytes = block_scales.view(torch.uint8)
    out_codes = torch.zeros(e_n * tiles * chunks * 2048, dtype=torch.uint8)
    out_scales = torch.zeros(e_n * tiles * chunks * 256, dtype=torch.uint8)
    cb = codes.tolist()
    for rec in range(e_n * tiles * chunks):
        e, t, c = rec // (tiles * chunks), rec % (tiles * chunks) // chunks, rec % chunks
        for lane in range(32):
            w4, g = lane >> 3, lane & 7
            for j in range(4):
                code = []
                for h in range(2):
                    r = 16 * w4 + 8 * h + g
                    nat = 64 * t + r if groups == 1 else ((r >> 3) & 1) * (n // 2) + 32 * t + 8 * (r >> 4) + (r & 7)
                    block = cb[e][nat][32 * c + 8 * j: 32 * c + 8 * j + 8]  # 16 elements, 2 per byte
                    code.append((int.from_bytes(bytes(block[:4]), "little"), int.from_bytes(bytes(block[4:]), "little")))
                    out_scales[rec * 256 + 8 * lane + 2 * j + h] = enc_scale[e][nat][4 * c + j]
                    assert scale_bytes[e, nat, 4 * c + j] != 0 or block == [0] * 8  # zero scale: +0 codes
                for q in range(4):
                    word = (table[0][code[0][0] >> 8 * q & 0xFF] ^ table[1][code[1][0] >> 8 * q & 0xFF]
                            ^ table[2][code[0][1] >> 8 * q & 0xFF] ^ table[3][code[1][1] >> 8 * q & 0xFF])
                    at = rec * 2048 + 64 * lane + 16 * q + 4 * j
                    out_codes[at: at + 4] = torch.tensor(list(word.to_bytes(4, "little")), dtype=torch.uint8)
    return out_codes, out_scales


@pytest.mark.parametrize("groups", [1, 2])
def test_kernel_indexing_mirrored_in_torch_equals_store_fragments(groups):
    """The header's lane/row/byte arithmetic (ported line for line) writes store_fragments_' bytes."""
    e, n, k = 2, 128, 128
    w = _weights(e, n, k)
    staging = ops.allocate_refit_buffers(e, n, k, "cpu")
    ops.refit_weights(w, staging)
    want = moe_layout.store_fragments_(moe_layout.empty_weights(e, n, k), staging.codes, staging.block_scales,
                                       staging.scale, groups, kernel=False)
    got_codes, got_scales = _mirror_kernel(staging.codes, staging.block_scales, groups)
    assert torch.equal(got_codes, want.codes.flatten()) and torch.equal(got_scales, want.block_scales.flatten())


@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("groups", [1, 2])
def test_kernel_loads_mirrored_put_every_row_chunk_in_its_swizzled_slot(groups, elem_bytes):
    """load_record's per-lane copies (base row + compile-time row offsets) land chunk ch of tile row r's
    natural row at r * row_bytes + 16 * (ch ^ (r & 7)), where load_half_block reads it; every byte once."""
    n, t, c = 256, 2, 1
    row_chunks = 64 * elem_bytes // 16
    rpi = 32 // row_chunks

    def natural_row(r):
        return 64 * t + r if groups == 1 else ((r >> 3) & 1) * (n // 2) + 32 * t + 8 * (r >> 4) + (r & 7)

    stage = {}
    for lane in range(32):
        r_lane, ch = lane // row_chunks, lane % row_chunks
        x0 = ch ^ r_lane
        for i in range(64 * row_chunks // 32):
            r = rpi * i
            rows = r if groups == 1 else 8 * (r >> 4) + (r & 7)
            src = (natural_row(r_lane) + rows + (n // 2 if groups == 2 and (r >> 3) & 1 else 0), 64 * c * elem_bytes + 16 * ch)
            dst = r_lane * 64 * elem_bytes + r * 64 * elem_bytes + 16 * (x0 ^ (r & 7))
            assert dst not in stage
            stage[dst] = src
    for r in range(64):
        for ch in range(row_chunks):
            assert stage[r * 64 * elem_bytes + 16 * (ch ^ (r & 7))] == (natural_row(r), 64 * c * elem_bytes + 16 * ch)


def test_bad_inputs_raise_before_any_launch():
    e, n, k = 2, 64, 64
    dst = moe_layout.empty_weights(e, n, k)
    w = torch.randn(e, n, k)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ops.refit_weights_packed_(w.numpy(), dst)
    with pytest.raises(TypeError, match="MoEWeights"):
        ops.refit_weights_packed_(w, (dst.codes, dst.block_scales, dst.scale))
    with pytest.raises(ValueError, match="groups"):
        ops.refit_weights_packed_(w, dst, groups=3)
    with pytest.raises(ValueError, match=r"\[E, N, K\]"):
        ops.refit_weights_packed_(w[0], dst)
    with pytest.raises(ValueError, match="N % 64"):
        ops.refit_weights_packed_(torch.randn(e, 48, k), dst)
    with pytest.raises(ValueError, match="K a positive multiple of 64"):
        ops.refit_weights_packed_(torch.randn(e, n, 80), dst)
    with pytest.raises(ValueError, match="dst has K=64, expected 128"):
        ops.refit_weights_packed_(torch.randn(e, n, 2 * k), dst)
    with pytest.raises(ValueError, match="experts"):
        ops.refit_weights_packed_(torch.randn(e + 1, n, k), dst)
    with pytest.raises(TypeError, match="floating"):
        ops.refit_weights_packed_(torch.ones(e, n, k, dtype=torch.int32), dst)
    bad = moe_layout.MoEWeights(dst.codes, dst.block_scales.view(torch.int8), dst.scale)
    with pytest.raises(TypeError, match="block_scales must be uint8"):
        ops.refit_weights_packed_(w, bad)
    bad = moe_layout.MoEWeights(dst.codes, dst.block_scales, dst.scale[:1])
    with pytest.raises(ValueError, match="scale must have shape"):
        ops.refit_weights_packed_(w, bad)
    with pytest.raises(ValueError, match="is on meta"):
        ops.refit_weights_packed_(w.to("meta"), dst)
    w_nan = w.clone()
    w_nan[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match="(?i)non-finite|nan"):
        ops.refit_weights_packed_(w_nan, dst)


def test_codegen_names_and_registry(monkeypatch):
    assert codegen_packed.spec("bf16", 2, "v1").name == "nvfp4_refit_packed_bf16_g2_sm90a"
    assert codegen_packed.spec(torch.float32, 1, "v1").name == "nvfp4_refit_packed_f32_g1_sm90a"
    assert codegen_packed.spec("bf16", 2, "v2").name == "nvfp4_refit_packed_bf16_v2_g2_sm90a"
    with pytest.raises(ValueError, match="groups"):
        codegen_packed.spec("bf16", 3)
    with pytest.raises(ValueError, match="variant"):
        codegen_packed.spec("bf16", 1, "v3")
    assert codegen_packed.NAME in codegen.all_ops()
    monkeypatch.setattr(codegen_packed, "VARIANT", "v1")  # its quantize pass after refit_weights' v2 amax pass
    names = [s.name for s in codegen.specs_for_shape(shapes.preset("tiny"), [codegen_packed.NAME])]
    assert names == ["nvfp4_refit_packed_bf16_g1_sm90a", "nvfp4_refit_packed_bf16_g2_sm90a",
                     "nvfp4_refit_weights_bf16_v2_sm90a"]
    monkeypatch.setattr(codegen_packed, "VARIANT", "v2")  # one kernel, three launches
    names = [s.name for s in codegen.specs_for_shape(shapes.preset("tiny"), [codegen_packed.NAME])]
    assert names == ["nvfp4_refit_packed_bf16_v2_g1_sm90a", "nvfp4_refit_packed_bf16_v2_g2_sm90a"]
    for variant, entry in (("v1", "quantize_pack"), ("v2", "speculative_pack")):
        text = codegen_packed.spec("f16", 1, variant).render()
        assert text == codegen_packed.spec("f16", 1, variant).render() and "/*GROUPS=*/1" in text and "__half" in text
        assert f"refit_packed::{entry}<Config>" in text


@pytest.mark.nvcc
def test_refit_packed_compiles_for_sm90a(tmp_path, monkeypatch):
    """Both row groupings' kernel, the 16-bit and the FP32 body, both variants: no spills, no stack frame."""
    from trace_kernels import jit
    from trace_kernels.jit import compiler
    monkeypatch.setenv("TRACE_KERNELS_CACHE_DIR", str(tmp_path))
    specs = [codegen_packed.spec("bf16", 2, "v1"), codegen_packed.spec("f32", 1, "v2"),
             codegen_packed.spec("bf16", 1, "v2")]
    for spec, entry in zip(specs, jit.build_all(specs, jobs=2)):
        report = compiler.parse_ptxas((entry.folder / "ptxas.txt").read_text())
        assert report.registers > 0 and report.spill_stores == 0 and report.spill_loads == 0, spec.name
        assert report.stack_frame == 0, spec.name
