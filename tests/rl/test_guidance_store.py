"""Guidance store: exact round trip, selection, lookup semantics, and every corruption case."""
import json

import pytest
import torch
from safetensors.torch import load, save

from trace_kernels import nvfp4
from trace_rl.guidance_store import GuidanceStoreError, read_guidance, write_guidance
from trace_rl.quant import GuidanceRecorder, TokenIndex


def make_batch(mode="compact", D=32):
    torch.manual_seed(0)
    rec = GuidanceRecorder(mode)
    for step, (seqs, pos) in enumerate([([0, 0, 1], [0, 1, 0]), ([0, 1, 2], [2, 1, 0])]):
        idx = TokenIndex(torch.tensor(seqs), torch.tensor(pos))
        rec.record(0, "moe_in", nvfp4.quantize(torch.randn(3, D)), idx)
        rec.record(1, "k", nvfp4.quantize(torch.randn(3, 2, D)), idx)
        rec.record(1, "moe_act", nvfp4.quantize(torch.randn(3, 2, D)), idx,
                   experts=torch.randint(0, 8, (3, 2)))
    return rec.finalize()


def _bytes(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def assert_batches_equal(a, b):
    assert a.mode == b.mode and a.tables.keys() == b.tables.keys()
    for key in a.tables:
        ta, tb = a.tables[key].tensors(), b.tables[key].tensors()
        assert ta.keys() == tb.keys()
        for f in ta:
            assert ta[f].dtype == tb[f].dtype and torch.equal(_bytes(ta[f]), _bytes(tb[f])), (key, f)


@pytest.mark.parametrize("mode", ["compact", "full"])
def test_round_trip(tmp_path, mode):
    batch = make_batch(mode)
    info = write_guidance(tmp_path / "b.safetensors", batch)
    assert info["bytes"] == (tmp_path / "b.safetensors").stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == ["b.safetensors"]  # no temp file left
    back = read_guidance(tmp_path / "b.safetensors")
    assert_batches_equal(batch, back)
    assert back.stats() == batch.stats()


def test_lookup_select_and_stats():
    batch = make_batch("compact", D=128)
    t = batch.table(0, "moe_in")
    assert t.seq_ids.tolist() == [0, 0, 0, 1, 1, 2] and t.positions.tolist() == [0, 1, 2, 0, 1, 0]
    g, found = batch.lookup(0, "moe_in", torch.tensor([2, 0, 5, 0]), torch.tensor([0, 2, 0, 1]))
    assert found.tolist() == [True, True, False, True]
    assert g.mantissa_bits.shape == (4, 16) and (g.mantissa_bits[2] == 0).all() and g.scale[2] == 0
    assert batch.table(1, "k").num_rows == 6
    sel = batch.select(seq_ids=[0], positions=(1, 3))
    assert sel.table(1, "moe_act").positions.tolist() == [1, 2]
    e, found = batch.experts(1, torch.tensor([0, 9]), torch.tensor([0, 0]))
    assert found.tolist() == [True, False] and (e[1] == -1).all()
    s = batch.stats()
    # compact: 1 mantissa bit + 8/16 block-scale bits per element + 32 bits per row of 128
    assert s["bits_per_element"] == pytest.approx(1.5 + 32 / 128)
    assert s["tokens"] == 6 and s["bytes_per_token"] == s["guidance_bytes"] / 6
    with pytest.raises(KeyError, match="layer 7"):
        batch.lookup(7, "k", torch.tensor([0]), torch.tensor([0]))


def test_duplicate_key_keeps_last():
    rec = GuidanceRecorder()
    idx = TokenIndex(torch.tensor([0]), torch.tensor([4]))
    rec.record(0, "moe_in", nvfp4.quantize(torch.ones(1, 16)), idx)
    last = nvfp4.quantize(torch.full((1, 16), 3.0))
    rec.record(0, "moe_in", last, idx)
    g, _ = rec.finalize().lookup(0, "moe_in", torch.tensor([0]), torch.tensor([4]))
    assert torch.equal(g.scale, last.scale)


def test_read_filters_on_load(tmp_path):
    batch = make_batch()
    write_guidance(tmp_path / "b.st", batch)
    part = read_guidance(tmp_path / "b.st", seq_ids=[1, 2], positions=(0, 1))
    assert part.table(1, "k").seq_ids.tolist() == [1, 2]


def _rewrite(path, fn_tensors=None, fn_meta=None):
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + n])["__metadata__"]
    tensors = load(data)
    if fn_tensors:
        fn_tensors(tensors)
    if fn_meta:
        fn_meta(meta)
    path.write_bytes(save(tensors, metadata=meta))


def test_corruption_cases(tmp_path):
    p = tmp_path / "b.st"
    write_guidance(p, make_batch())
    good = p.read_bytes()

    p.write_bytes(good[: len(good) - 7])  # truncated
    with pytest.raises(GuidanceStoreError, match="truncated or corrupted"):
        read_guidance(p)
    p.write_bytes(good[:5])
    with pytest.raises(GuidanceStoreError, match="truncated"):
        read_guidance(p)
    p.write_bytes(b"")
    with pytest.raises(GuidanceStoreError, match="truncated"):
        read_guidance(p)

    flipped = bytearray(good)
    flipped[-3] ^= 0x10  # a data byte
    p.write_bytes(bytes(flipped))
    with pytest.raises(GuidanceStoreError, match="checksum"):
        read_guidance(p)

    flipped = bytearray(good)
    flipped[12] ^= 0xFF  # inside the JSON header
    p.write_bytes(bytes(flipped))
    with pytest.raises(GuidanceStoreError):
        read_guidance(p)

    p.write_bytes(good)
    _rewrite(p, fn_meta=lambda m: m.__setitem__("version", "2"))
    with pytest.raises(GuidanceStoreError, match="version '2'"):
        read_guidance(p)
    p.write_bytes(good)
    _rewrite(p, fn_meta=lambda m: m.__setitem__("format", "something-else"))
    with pytest.raises(GuidanceStoreError, match="format"):
        read_guidance(p)
    p.write_bytes(good)
    _rewrite(p, fn_tensors=lambda t: t.pop("L1.k.scale"))  # checksum recomputed below fails first
    with pytest.raises(GuidanceStoreError):
        read_guidance(p)
    p.write_bytes(good)
    _rewrite(p, fn_tensors=lambda t: t["L0.moe_in.scale"].mul_(2))  # valid file, wrong data
    with pytest.raises(GuidanceStoreError, match="checksum"):
        read_guidance(p)

    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_guidance(tmp_path / "missing.st")
