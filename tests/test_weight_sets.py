"""The refit benchmarks' inputs (trace_kernels.testing.weight_sets) on the CPU: steady sets keep every expert's amax,
mixed sets move about the asked fraction of them from one call to the next, and say how many moved."""
import torch

from trace_kernels.testing import weight_sets


def expert_amax(w: torch.Tensor) -> torch.Tensor:
    return w.float().abs().amax(dim=(1, 2))  # [E]


def test_steady_sets_keep_every_amax():
    base = torch.randn(6, 8, 32, dtype=torch.bfloat16)
    sets = weight_sets.steady_weight_sets(base, 3)
    for w in sets:
        assert torch.equal(expert_amax(w), expert_amax(base))
        assert not torch.equal(w, base)  # the other weights moved


def test_mixed_sets_move_the_fraction_they_report():
    torch.manual_seed(0)
    base = torch.randn(64, 8, 32, dtype=torch.bfloat16)
    for sets in (2, 5):
        steady = weight_sets.steady_weight_sets(base, sets)
        mixed, fraction = weight_sets.mixed_weight_sets(steady, 0.25, seed=sets)
        amax = [expert_amax(w) for w in mixed]
        moved = sum(int((a != b).sum()) for a, b in zip(amax, amax[1:] + amax[:1]))
        assert moved > 0
        assert fraction == moved / (64 * sets)  # the rotation's last set is followed by its first
        assert 0.1 < fraction < 0.6
        for w, s in zip(mixed, steady):  # only each expert's amax element may differ from the steady set
            assert int((w != s).sum()) <= 64
            assert bool((expert_amax(w) >= expert_amax(s)).all())
