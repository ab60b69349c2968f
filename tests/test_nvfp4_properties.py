"""Property tests of the NVFP4 / TRACE reference over generated rows (hypothesis)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from trace_kernels import nvfp4

SIGNED_GRID = np.array([-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
ROW_KINDS = ["normal", "zero", "single_block", "dynamic_range", "outlier", "tiny", "huge"]


def make_rows(seed: int, kind: str, rows: int, blocks: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    width = 16 if kind == "single_block" else 16 * blocks
    x = torch.randn(rows, width, generator=g)
    if kind == "zero":
        x[0] = 0
    elif kind == "dynamic_range":
        x *= torch.logspace(-6, 6, width)[torch.randperm(width, generator=g)]
    elif kind == "outlier":
        x[:, int(torch.randint(width, (1,), generator=g))] = 3e4
    elif kind == "tiny":
        x *= 1e-30
    elif kind == "huge":
        x *= 1e30
    if dtype == torch.float16:
        x = x.clamp(-6e4, 6e4)
        x = torch.where(x.abs() < 1e-4, torch.zeros_like(x), x)  # keep clear of fp16 underflow
    return x.to(dtype)


rows_strategy = st.tuples(
    st.integers(0, 2**31 - 1), st.sampled_from(ROW_KINDS), st.integers(1, 5), st.integers(1, 8),
    st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)


def block_steps(q: nvfp4.NVFP4Tensor) -> torch.Tensor:
    return (q.block_scales.float() * q.scale[:, None]).repeat_interleave(16, dim=-1)  # [rows, D]


@settings(max_examples=60, deadline=None)
@given(rows_strategy)
def test_dequantize_error_bound(params):
    x = make_rows(*params).float()
    if params[3] == torch.float16 and params[1] == "huge":
        return
    q = nvfp4.quantize(x)
    error = (nvfp4.dequantize(q) - x).abs()
    d = block_steps(q)
    # Inside [-6d, 6d] the largest gap is 2d (between 4 and 6); beyond it the value saturates to 6d.
    bound = torch.maximum(d, x.abs() - 6 * d) * (1 + 2.0**-20) + 1e-45
    assert (error <= bound).all()


@settings(max_examples=60, deadline=None)
@given(rows_strategy, st.sampled_from(["compact", "full"]))
def test_guidance_reproduces_rollout_exactly(params, mode):
    x = make_rows(*params)
    q = nvfp4.quantize(x)
    guided = nvfp4.guided_fake_quantize(x, nvfp4.make_guidance(q, mode))
    assert guided.dtype == x.dtype
    assert torch.equal(guided, nvfp4.dequantize(q, x.dtype))
    assert torch.equal(nvfp4.guided_quantize(x, nvfp4.make_guidance(q, mode)).codes, q.codes)


def neighbour_mask(y: np.ndarray, rollout_values: np.ndarray) -> np.ndarray:
    """True where the rollout's value is one of the two grid points enclosing y (clamped)."""
    y = np.clip(y, -6, 6)[..., None]
    lo = np.where(SIGNED_GRID <= y, SIGNED_GRID, -np.inf).max(axis=-1)
    hi = np.where(SIGNED_GRID >= y, SIGNED_GRID, np.inf).min(axis=-1)
    return (rollout_values == lo) | (rollout_values == hi)


def perturbed_agreement(x_r: torch.Tensor, eps: float, seed: int, mode: str = "compact"):
    """Agreement with the rollout's codes of round-to-nearest and of guided rounding."""
    g = torch.Generator().manual_seed(seed)
    x_t = x_r * (1 + (torch.rand(x_r.shape, generator=g) * 2 - 1) * eps)
    q_r = nvfp4.quantize(x_r)
    guided = nvfp4.guided_quantize(x_t, nvfp4.make_guidance(q_r, mode))
    rtn = nvfp4.quantize(x_t)
    d = block_steps(q_r)
    y = (x_t / torch.where(d == 0, torch.ones_like(d), d)).numpy()
    r_values = nvfp4.dequantize(nvfp4.NVFP4Tensor(q_r.codes, torch.ones_like(q_r.block_scales),
                                                  torch.ones_like(q_r.scale))).numpy()
    neighbours = neighbour_mask(y, r_values) | (d == 0).numpy()
    codes_r, codes_g = nvfp4.unpack_codes(q_r.codes), nvfp4.unpack_codes(guided.codes)
    return {
        "guided": nvfp4.agreement(q_r.codes, guided.codes)["equal_fraction"],
        "rtn": nvfp4.agreement(q_r.codes, rtn.codes)["equal_fraction"],
        "neighbour_fraction": float(neighbours.mean()),
        "guided_on_neighbours": float((codes_r == codes_g).numpy()[neighbours].mean()),
    }


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["normal", "dynamic_range", "outlier"]),
       st.floats(1e-4, 1e-2), st.sampled_from(["compact", "full"]))
def test_guided_rounding_picks_rollout_code_wherever_it_is_a_neighbour(seed, kind, eps, mode):
    x_r = make_rows(seed, kind, 4, 4, torch.float32)
    stats = perturbed_agreement(x_r, eps, seed + 1, mode)
    assert stats["guided_on_neighbours"] == 1.0
    assert stats["guided"] >= stats["rtn"]


def test_agreement_report(capsys):
    """Reports guided vs round-to-nearest agreement at several trainer/rollout mismatches."""
    x_r = torch.randn(256, 2048, generator=torch.Generator().manual_seed(3))
    lines = []
    for eps in (1e-3, 3e-3, 1e-2):
        stats = perturbed_agreement(x_r, eps, seed=4)
        assert stats["guided_on_neighbours"] == 1.0 and stats["guided"] > stats["rtn"]
        lines.append(f"eps={eps:g}: round-to-nearest {stats['rtn']:.4%}, guided {stats['guided']:.4%}, "
                     f"rollout code is a neighbour for {stats['neighbour_fraction']:.4%}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.gpu
def test_reference_on_cuda_matches_cpu():
    x = make_rows(11, "dynamic_range", 64, 8, torch.bfloat16)
    q_cpu, q_gpu = nvfp4.quantize(x), nvfp4.quantize(x.cuda())
    assert torch.equal(q_cpu.codes, q_gpu.codes.cpu())
    assert torch.equal(q_cpu.block_scales.view(torch.uint8), q_gpu.block_scales.cpu().view(torch.uint8))
    assert torch.equal(q_cpu.scale, q_gpu.scale.cpu())
    x_t = x * 1.003
    g = nvfp4.make_guidance(q_cpu)
    assert torch.equal(nvfp4.guided_fake_quantize(x_t, g),
                       nvfp4.guided_fake_quantize(x_t.cuda(), g.to("cuda")).cpu())
