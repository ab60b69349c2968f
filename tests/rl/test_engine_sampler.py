"""Sampler: Gumbel-max with counter-based randomness draws from the sampling distribution; the
plain path is the sampling kernel's reference (tests/gpu/test_sampling_kernel.py)."""
from pathlib import Path

import pytest
import torch

from trace_kernels import ops
from trace_kernels.ops import gumbel_sample as gs
from trace_rl.engine import SamplingParams, sampler
from trace_rl.engine.sampler import sample, sampling_logprobs, uniforms


def test_uniforms_are_uniform_and_keyed():
    u = uniforms(5, torch.arange(64), torch.zeros(64, dtype=torch.long), 4096)  # [64, 4096]
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.std().item() - 12 ** -0.5) < 0.01
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert (hist - 0.1).abs().max() < 0.01
    same = uniforms(5, torch.arange(64), torch.zeros(64, dtype=torch.long), 4096)
    assert torch.equal(u, same)
    assert not torch.equal(u, uniforms(6, torch.arange(64), torch.zeros(64, dtype=torch.long), 4096))
    assert (u[0] != u[1]).float().mean() > 0.99  # each sequence has its own stream
    moved = uniforms(5, torch.arange(64), torch.ones(64, dtype=torch.long), 4096)
    assert (moved != u).float().mean() > 0.99


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8),
                                    SamplingParams(temperature=1.0, top_k=3),
                                    SamplingParams(temperature=1.0, top_p=0.75)])
def test_draws_follow_the_sampling_distribution(params):
    logits = torch.tensor([[0.3, 1.0, 2.0, -1.0, 0.5, 1.5]]).repeat(40000, 1)
    tokens, logprobs = sample(logits, params, seed=11, seq_keys=torch.arange(40000),
                              positions=torch.zeros(40000, dtype=torch.long))
    want = sampling_logprobs(logits[:1], params).exp()[0]  # [V]
    freq = torch.bincount(tokens, minlength=6).float() / 40000
    assert (freq - want).abs().max() < 0.012
    assert (freq[want == 0] == 0).all()  # never outside top-k / top-p
    assert torch.allclose(logprobs, want.log()[tokens])


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    keep = sampling_logprobs(logits, SamplingParams(top_p=0.8)).isfinite()[0]
    assert keep.tolist() == [True, True, False, False]
    keep = sampling_logprobs(logits, SamplingParams(top_p=0.81)).isfinite()[0]
    assert keep.tolist() == [True, True, True, False]


# ---------------------------------------------------------------------------------------------
# The plain path's reference (trace_kernels.ops.gumbel_sample), which the sampling kernel matches
# ---------------------------------------------------------------------------------------------
M32 = 0xFFFFFFFF


def scalar_uniform(seed: int, key: int, position: int, v: int) -> float:
    """The hash with Python ints, 32-bit words throughout: the definition the kernel implements."""
    def mix(x):
        x ^= x >> 16
        x = (x * 0x7FEB352D) & M32
        x ^= x >> 15
        x = (x * 0x846CA68B) & M32
        return x ^ (x >> 16)
    key, seed = key & (2**64 - 1), seed & (2**64 - 1)
    h = mix((v + 0x9E3779B9) & M32)
    h = mix(h ^ (position & M32))
    h = mix(h ^ (key & M32))
    h = mix(h ^ (key >> 32) ^ (seed & M32))
    h = mix(h ^ (seed >> 32))
    return ((h >> 9) + 0.5) / 2**23


def test_uniforms_match_the_32_bit_definition_for_64_bit_keys_and_seeds():
    keys = torch.tensor([0, 7, 2**40 + 3, -1, -(2**62) + 5])  # negative = keys >= 2**63 as int64
    positions = torch.tensor([0, 1, 2**31 + 9, 4095, 17])
    for seed in (0, 11, 2**32 + 1, 2**63 + 2**35 + 7, -3):
        u = uniforms(seed, keys, positions, 40)  # [5, 40]
        for b in range(5):
            for v in (0, 1, 17, 39):
                assert u[b, v].item() == scalar_uniform(seed, int(keys[b]), int(positions[b]), v)
    high = uniforms(0, torch.tensor([2**32 + 5]), torch.zeros(1, dtype=torch.long), 64)
    assert not torch.equal(high, uniforms(0, torch.tensor([5]), torch.zeros(1, dtype=torch.long), 64))


def test_uniform_range_keeps_the_gumbel_noise_finite_and_within_the_kernel_bounds():
    h = torch.tensor([0, 511, 512, 2**31, M32 - 511, M32])  # the extreme hashes
    u = gs.hash_to_uniform(h)
    assert u.min().item() == 2.0**-24 and u.max().item() == 1 - 2.0**-24
    g = gs.gumbel_noise(u)
    assert torch.isfinite(g).all()
    assert gs.GUMBEL_MIN < g.min().item() < -2.81 and 16.63 < g.max().item() < gs.GUMBEL_MAX
    header = (Path(__file__).resolve().parents[2] / "cuda/include/trace_kernels/gumbel_sample.cuh").read_text()
    assert f"kGumbelMax = {gs.GUMBEL_MAX}f" in header and f"kGumbelMin = {gs.GUMBEL_MIN}f" in header


def test_temperature_scales_by_the_fp32_reciprocal():
    x = torch.randn(64, 513) * 7
    for t in (1.0, 0.7, 0.3, 1.9, 1e-3):
        inv = gs.inv_temperature(t)
        want = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(t, dtype=torch.float32)
        assert inv == want.item()
        assert torch.equal(gs.scale_logits(x, inv), x * want)  # one rounding: a product of FP32 values
    assert torch.equal(gs.scale_logits(x.bfloat16(), 1.0), x.bfloat16().float())  # T = 1 is exact


def test_plain_sample_is_the_reference_and_the_op_on_cpu():
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(9, 1000, generator=g) * 3).bfloat16()
    keys, positions = torch.randint(-2**62, 2**62, (9,), generator=g), torch.randint(0, 4096, (9,), generator=g)
    for t in (1.0, 0.7):
        tokens, logp = sample(logits, SamplingParams(temperature=t), 5, keys, positions)
        ref_tokens, ref_logp = gs.reference(logits, gs.inv_temperature(t), 5, keys, positions)
        op_tokens, op_logp = ops.gumbel_max_sample(logits, 5, keys, positions, t)
        assert torch.equal(tokens, ref_tokens) and torch.equal(op_tokens, ref_tokens)
        assert torch.equal(logp, ref_logp) and torch.equal(op_logp, ref_logp)
        s = logits.float() * gs.inv_temperature(t)
        noise = gs.gumbel_noise(uniforms(5, keys, positions, 1000))
        assert torch.equal(tokens, torch.argmax(s + noise, dim=-1))
        # a sequence's draw does not depend on its batch-mates
        sub_tokens, sub_logp = sample(logits[3:5], SamplingParams(temperature=t), 5, keys[3:5], positions[3:5])
        assert torch.equal(sub_tokens, tokens[3:5]) and torch.equal(sub_logp, logp[3:5])


def test_reference_ties_go_to_the_lowest_index_and_nan_wins():
    keys, positions = torch.tensor([4, 4]), torch.tensor([9, 9])
    noise = gs.gumbel_noise(uniforms(0, keys, positions, 64))[0]  # [V], the same for both rows
    x = torch.randn(2, 64) - 100
    i, j = 10, 40
    x[:, i] = 50.0
    x[:, j] = 50.0 + noise[i] - noise[j]
    while (x[0, j] + noise[j]).item() != (x[0, i] + noise[i]).item():  # exact tie of s + noise
        x[:, j] = torch.nextafter(x[:, j], torch.tensor(1e9 if (x[0, j] + noise[j]) < (x[0, i] + noise[i]) else -1e9))
    x[1, 50] = float("nan")
    x[1, 60] = float("nan")
    tokens, _ = gs.reference(x, 1.0, 0, keys, positions)
    assert tokens.tolist() == [i, 50]


def test_sampler_knob_and_kernel_choice(monkeypatch):
    logits = torch.randn(2, 16)
    assert not sampler.use_kernel(logits, SamplingParams())  # CPU: the torch path
    monkeypatch.setenv(sampler.SAMPLER_ENV, "torch")
    assert not sampler.use_kernel(logits, SamplingParams())
    monkeypatch.setenv(sampler.SAMPLER_ENV, "fast")
    with pytest.raises(ValueError, match="TRACE_KERNELS_SAMPLER"):
        sampler.use_kernel(logits, SamplingParams())
    assert sampler._plain(SamplingParams(top_k=16), 16) and not sampler._plain(SamplingParams(top_k=15), 16)
    assert not sampler._plain(SamplingParams(top_p=0.9), 16)


def test_op_rejects_bad_input_before_any_launch():
    x, keys, pos = torch.randn(3, 32), torch.arange(3), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError, match="2 dimensions"):
        ops.gumbel_max_sample(x[0], 0, keys, pos)
    with pytest.raises(TypeError, match="dtype"):
        ops.gumbel_max_sample(x.double(), 0, keys, pos)
    with pytest.raises(TypeError, match="dtype"):
        ops.gumbel_max_sample(x, 0, keys.int(), pos)
    with pytest.raises(ValueError, match="entries for 3 rows"):
        ops.gumbel_max_sample(x, 0, keys[:2], pos)
    with pytest.raises(ValueError, match="V < 2"):
        ops.gumbel_max_sample(x[:, :0], 0, keys, pos)
    for t in (0.0, -1.0, float("inf"), float("nan"), 1e-45):
        with pytest.raises(ValueError, match="temperature"):
            ops.gumbel_max_sample(x, 0, keys, pos, t)
    with pytest.raises(TypeError, match="seed"):
        ops.gumbel_max_sample(x, 0.5, keys, pos)


def test_the_kernels_skip_rule_never_drops_the_winner():
    """The kernel hashes noise only for ids with fl(s + GUMBEL_MAX) >= fl(chunk max + GUMBEL_MIN);
    in FP32 on the reference's values, the argmax is never among the skipped ids."""
    from trace_kernels.codegen.ops import gumbel_sample as codegen_gumbel
    g = torch.Generator().manual_seed(1)
    rows, vocab, chunk = 24, 3 * codegen_gumbel.CHUNK + 100, codegen_gumbel.CHUNK
    scales = torch.tensor([1.0, 4.0, 8.0, 30.0]).repeat_interleave(rows // 4)[:, None]
    s = torch.randn(rows, vocab, generator=g) * scales  # [B, V] FP32, T = 1
    s[::5, 7] += 60.0  # peaked rows
    keys, positions = torch.arange(rows) * 977, torch.full((rows,), 33)
    noisy = s + gs.gumbel_noise(uniforms(2, keys, positions, vocab))  # [B, V]
    tokens = torch.argmax(noisy, dim=-1)
    pad = -vocab % chunk
    chunk_max = torch.nn.functional.pad(s, (0, pad), value=float("-inf")).view(rows, -1, chunk).amax(-1)  # [B, C]
    floor = (chunk_max + gs.GUMBEL_MIN).repeat_interleave(chunk, dim=1)[:, :vocab]  # [B, V]
    skipped = (s + gs.GUMBEL_MAX) < floor
    assert not skipped.gather(1, tokens[:, None]).any()
    assert torch.equal(torch.argmax(noisy.masked_fill(skipped, float("-inf")), dim=-1), tokens)
    assert skipped[scales[:, 0] >= 8].float().mean() > 0.5  # the rule does skip most ids of wide rows


@pytest.mark.nvcc
def test_sampling_kernel_compiles_without_spills(tmp_path, monkeypatch):
    """64 registers (two CTAs of 512 threads per SM, MIN_CTAS_PER_SM) and nothing spilled."""
    from trace_kernels import jit
    from trace_kernels.codegen.ops import gumbel_sample as codegen_gumbel
    from trace_kernels.jit import compiler
    monkeypatch.setenv("TRACE_KERNELS_CACHE_DIR", str(tmp_path))
    spec = codegen_gumbel.spec("bf16")
    assert spec.name == "gumbel_max_sample_bf16_sm90a"
    entry = jit.build(spec)
    report = compiler.parse_ptxas((entry.folder / "ptxas.txt").read_text())
    assert 0 < report.registers <= 65536 // (codegen_gumbel.CTA * codegen_gumbel.MIN_CTAS_PER_SM)
    assert report.spill_stores == report.spill_loads == report.stack_frame == 0
