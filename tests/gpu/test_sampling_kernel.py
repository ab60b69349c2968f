"""The Gumbel-max sampling kernel vs its torch reference on the same GPU (sm_90a; skipped without one).

Tokens must be identical (the kernel computes the reference's FP32 values with the same logf and
torch.argmax's tie / NaN rules); log-probs agree to FP32 rounding (the kernel sums exp in its own
order). Outputs are poisoned (TRACE_KERNELS_POISON_OUTPUTS=1); inputs are fresh random logits at
several scales, peaked rows, exact ties of s + noise built on purpose (same thread, neighbouring
lanes, other warps, other CTAs of the row), NaN / inf rows, 64-bit keys and seeds.
`-k "not large"` is the subset run under compute-sanitizer.
"""

from __future__ import annotations

import pytest
import torch

from trace_kernels import ops
from trace_kernels.codegen.ops import gumbel_sample as codegen_gumbel
from trace_kernels.ops import gumbel_sample as gs
from trace_rl.engine import SamplingParams, sampler

pytestmark = pytest.mark.gpu

SEEDS = (0, 7, 2**32 + 5, 2**63 + 2**40 + 1)


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("TRACE_KERNELS_POISON_OUTPUTS", "1")


def make_logits(rows: int, vocab: int, scale: float, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """randn * scale with a peaked row (one id far above the rest), a row whose maximum appears
    twice, and a row with a huge spread (most ids far below the top)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g, device="cuda") * scale  # [B, V]
    if rows > 1:
        x[1, (seed * 7919) % vocab] += 40.0 * max(scale, 1.0)
    if rows > 2:
        top = int(x[2].argmax())
        x[2, (top + vocab // 2) % vocab] = x[2, top]
    if rows > 3:
        x[3] *= 50.0
    return x.to(dtype)


def make_keys(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 1)
    keys = torch.randint(-2**63, 2**63 - 1, (rows,), generator=g, dtype=torch.int64)  # all 64 bits
    positions = torch.randint(0, 2**33, (rows,), generator=g, dtype=torch.int64)
    return keys.cuda(), positions.cuda()


def check_against_reference(logits, seed, keys, positions, temperature) -> None:
    tokens, logp = ops.gumbel_max_sample(logits, seed, keys, positions, temperature)
    ref_tokens, ref_logp = gs.reference(logits, gs.inv_temperature(temperature), seed, keys, positions)
    bad = (tokens != ref_tokens).nonzero().flatten().tolist()
    assert not bad, f"{len(bad)} rows differ, first {bad[0]}: {tokens[bad[0]]} vs {ref_tokens[bad[0]]}"
    torch.testing.assert_close(logp, ref_logp, atol=2e-5, rtol=1e-6, equal_nan=True)


CASES = [pytest.param(b, v, id=f"B{b}-V{v}" + ("-large" if b * v > 10**7 else ""))
         for b in (1, 7, 512) for v in (96, 1000, 151936)]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,vocab", CASES)
def test_tokens_equal_the_reference(rows, vocab, dtype, temperature):
    for i, scale in enumerate((0.5, 3.0, 30.0)):
        seed = SEEDS[i % len(SEEDS)]
        logits = make_logits(rows, vocab, scale, dtype, seed=rows * 7 + vocab + i)
        keys, positions = make_keys(rows, seed=vocab + i)
        check_against_reference(logits, seed, keys, positions, temperature)


def make_tie(x: torch.Tensor, noise: torch.Tensor, i: int, j: int) -> bool:
    """Set x[i], x[j] (float32 [V]) so that fl(x[j] + noise[j]) == fl(x[i] + noise[i]) exactly.
    Stepping x[j] by one ulp moves its rounded sum by one ulp, or by two where the exact sum sits
    half-way between two floats (ties to even); then no x[j] matches, and x[i] moves one ulp."""
    x[i] = 20.0
    for _ in range(8):
        b = x[i] + noise[i]
        x[j] = b - noise[j]
        for _ in range(64):  # step x[j] by ulps towards fl(x[j] + n_j) == b
            a = x[j] + noise[j]
            if a == b:
                return True
            x[j] = torch.nextafter(x[j], x[j] + (1.0 if a < b else -1.0))
        x[i] = torch.nextafter(x[i], x[i] + 1.0)
    return False


def test_make_tie_handles_round_half_even_sums():
    """The case that defeated plain ulp stepping (found on the H200): x[j] + n_j lands half-way
    between floats at every step, so only a move of x[i] allows an exact tie."""
    x = torch.zeros(2)
    noise = torch.tensor([0.4962176978588104, 0.9024686813354492])
    assert make_tie(x, noise, 0, 1) and x[1] + noise[1] == x[0] + noise[0]


@pytest.mark.parametrize("vocab", [96, 1000, 151936, 8192 * 3 + 1])
def test_constructed_ties_go_to_the_lowest_index(vocab):
    """Exact ties of fl(s + noise) between ids a thread, a warp, the CTA or two CTAs compare."""
    chunk, cta = codegen_gumbel.CHUNK, codegen_gumbel.CTA
    offsets = [1, 32, cta, 64, chunk, 5 * chunk + 17, vocab - 1]
    rows = len(offsets)
    keys, positions = make_keys(rows, seed=vocab)
    noise = gs.gumbel_noise(gs.uniforms(3, keys, positions, vocab))  # [B, V] on the GPU: its logf
    g = torch.Generator().manual_seed(vocab)
    x = (torch.randn(rows, vocab, generator=g) - 60).cuda()  # f32, T = 1: s = x
    want = []
    for r, off in enumerate(offsets):
        i = int(torch.randint(0, max(1, vocab - off), (1,), generator=g)) if off < vocab - 1 else 0
        j = min(i + off, vocab - 1)
        if j == i:
            i, j = 0, vocab - 1
        assert make_tie(x[r], noise[r], i, j), "no exact tie found"
        want.append(i)
    tokens, _ = gs.reference(x, 1.0, 3, keys, positions)
    assert tokens.tolist() == want  # the reference takes the lower index ...
    check_against_reference(x, 3, keys, positions, 1.0)  # ... and so does the kernel


@pytest.mark.parametrize("vocab", [1000, 151936])
def test_nan_and_infinite_rows(vocab):
    chunk = codegen_gumbel.CHUNK
    x = torch.randn(6, vocab, device="cuda")
    x[0, [vocab // 2, 3]] = float("nan")  # the first NaN wins
    x[1] = float("-inf")  # all -inf: id 0, log-prob NaN as log_softmax
    x[2, : min(chunk, vocab - 1)] = float("-inf")  # a whole chunk of -inf (e.g. masked ids)
    x[3, [vocab - 1, 5]] = float("inf")  # +inf: the first +inf wins
    x[4, vocab - 1] = float("nan")  # NaN in the last id
    x[5] = 0.0  # all equal: noise decides
    keys, positions = make_keys(6, seed=1)
    for dtype in (torch.float32, torch.bfloat16):
        logits = x.to(dtype)
        tokens, logp = ops.gumbel_max_sample(logits, 11, keys, positions, 1.0)
        ref_tokens, ref_logp = gs.reference(logits, 1.0, 11, keys, positions)
        assert torch.equal(tokens, ref_tokens), (tokens, ref_tokens)
        assert tokens[:4].tolist() == [3, 0, tokens[2].item(), 5] and tokens[4].item() == vocab - 1
        finite = torch.isfinite(ref_logp)
        assert finite.tolist() == [False, False, True, False, False, True]
        assert torch.equal(torch.isfinite(logp), finite)  # non-finite input: a non-finite log-prob
        torch.testing.assert_close(logp[finite], ref_logp[finite], atol=2e-5, rtol=1e-6)


def test_rows_are_independent_and_deterministic():
    logits = make_logits(64, 151936, 2.0, torch.bfloat16, seed=5)
    keys, positions = make_keys(64, seed=5)
    tokens, logp = ops.gumbel_max_sample(logits, 9, keys, positions, 0.7)
    again = ops.gumbel_max_sample(logits, 9, keys, positions, 0.7)
    assert torch.equal(tokens, again[0]) and torch.equal(logp, again[1])
    sub = ops.gumbel_max_sample(logits[10:13], 9, keys[10:13], positions[10:13], 0.7)  # contiguous slices
    assert torch.equal(sub[0], tokens[10:13]) and torch.equal(sub[1], logp[10:13])  # log-probs too: bit for bit


def test_sampler_uses_the_kernel_with_the_torch_paths_tokens(monkeypatch):
    logits = make_logits(37, 151936, 2.0, torch.bfloat16, seed=8)
    keys, positions = make_keys(37, seed=8)
    for params in (SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=151936)):
        monkeypatch.setenv(sampler.SAMPLER_ENV, "auto")
        assert sampler.use_kernel(logits, params)
        tokens, logp = sampler.sample(logits, params, 4, keys, positions)
        monkeypatch.setenv(sampler.SAMPLER_ENV, "torch")
        assert not sampler.use_kernel(logits, params)
        ref_tokens, ref_logp = sampler.sample(logits, params, 4, keys, positions)
        assert torch.equal(tokens, ref_tokens)
        torch.testing.assert_close(logp, ref_logp, atol=2e-5, rtol=1e-6)
    monkeypatch.setenv(sampler.SAMPLER_ENV, "auto")
    assert not sampler.use_kernel(logits, SamplingParams(top_k=50))
    assert not sampler.use_kernel(logits, SamplingParams(top_p=0.9))


def test_bad_input_raises_before_launch():
    x = torch.randn(4, 1000, device="cuda")
    keys, positions = make_keys(4, seed=0)
    with pytest.raises(ValueError, match="contiguous"):
        ops.gumbel_max_sample(x[:, ::2], 0, keys, positions)
    with pytest.raises(ValueError, match="is on cpu"):
        ops.gumbel_max_sample(x, 0, keys.cpu(), positions)
    with pytest.raises(TypeError, match="dtype"):
        ops.gumbel_max_sample(x, 0, keys, positions.int())
    with pytest.raises(ValueError, match="2 dimensions"):
        ops.gumbel_max_sample(x[None], 0, keys, positions)
    with pytest.raises(ValueError, match="temperature"):
        ops.gumbel_max_sample(x, 0, keys, positions, 0.0)
