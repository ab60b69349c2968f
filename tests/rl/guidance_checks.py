"""Shared assertion for the engine tests: two GuidanceBatch objects hold the same bytes."""
import torch


def bytes_of(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def assert_guidance_equal(got, want):
    """Same tables, same key columns, scales, bits/codes and experts, byte for byte (any devices)."""
    assert sorted(got.tables) == sorted(want.tables)
    for key, a in got.tables.items():
        b = want.tables[key]
        for f in ("seq_ids", "positions", "scale", "block_scales", "payload"):
            x, y = bytes_of(getattr(a, f)).cpu(), bytes_of(getattr(b, f)).cpu()
            assert torch.equal(x, y), (key, f, (x != y).sum().item() if x.shape == y.shape else x.shape)
        assert (a.experts is None) == (b.experts is None)
        if a.experts is not None:
            assert torch.equal(a.experts.cpu(), b.experts.cpu()), key
