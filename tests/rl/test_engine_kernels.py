"""The kernel-backed nvfp4 engine's host-side logic on CPU (the kernel ops run their references on
CPU tensors): packed-weight layout with the gate/up interleave, sync-free routing, the guidance
arena, backend selection, guidance equal to the reference recorder's bit for bit, log-probs against
a full forward with the same quantizer, and refit in place. The same checks on the real kernels
are in test_engine_gpu.py."""
import pytest
import torch

from trace_kernels import kv_codes, moe_layout, moe_routing, nvfp4
from trace_rl.config import load_preset
from trace_rl.engine import EngineConfig, RolloutEngine, SamplingParams
from trace_rl.engine.kernel_layout import (GuidanceLayout, empty_moe_weights, kernel_routing, kernel_support,
                                           kv_kernel_support)
from trace_rl.engine.kernel_moe import EMULATED_OPS, KernelQuantizer
from trace_rl.engine.sampler import sampling_logprobs
from trace_rl.model import MoEForCausalLM
from trace_rl.quant import GuidanceRecorder

from guidance_checks import assert_guidance_equal, bytes_of  # tests/rl/guidance_checks.py

PROMPTS = [[1, 5, 6, 7, 8], [1, 9, 10], [1, 11, 12, 13, 14, 15, 16]]



@pytest.fixture(scope="module")
def model():
    return MoEForCausalLM(load_preset("tiny-kernels")).init_weights(seed=0).to(torch.bfloat16)


def kernel_engine(model, capture="compact", backend="kernels", **kw):
    return RolloutEngine(model, EngineConfig(block_size=8, max_model_len=48, backend=backend, **kw),
                         mode="nvfp4", capture=capture)


@pytest.fixture
def count_decode_attention(monkeypatch):
    """Counts the decode steps' attention calls that go through the paged-KV kernel path."""
    import trace_rl.engine.model_runner as runner_module
    calls = []

    class Counting(runner_module.KernelDecodeAttention):
        def __call__(self, layer, q, k, v):
            calls.append(layer)
            return super().__call__(layer, q, k, v)

    monkeypatch.setattr(runner_module, "KernelDecodeAttention", Counting)
    return calls


def random_nvfp4(E, N, K, gen):
    codes = torch.randint(0, 256, (E, N, K // 2), dtype=torch.uint8, generator=gen)
    bscales = torch.randint(0, 0x7F, (E, N, K // 16), dtype=torch.uint8, generator=gen)  # finite E4M3
    return codes, bscales.view(torch.float8_e4m3fn), torch.rand(E, generator=gen) + 0.1


@pytest.mark.parametrize("E,I,H", [(3, 64, 128), (2, 128, 64)])
def test_gate_up_packing_equals_interleave_then_pack(E, I, H):
    """store_fragments_(groups=2), the reference of the engine's refit (ops.refit_weights_packed_ on
    w_gate_up, gate rows then up rows), folds the gate/up interleave into the pack permutation."""
    gen = torch.Generator().manual_seed(E * I + H)
    codes, bscales, scale = random_nvfp4(E, 2 * I, H, gen)
    want = moe_layout.pack_weights(
        moe_layout.interleave_gate_up(codes[:, :I], codes[:, I:]),
        moe_layout.interleave_gate_up(bscales.view(torch.uint8)[:, :I],
                                      bscales.view(torch.uint8)[:, I:]).view(torch.float8_e4m3fn),
        scale)
    dst = empty_moe_weights(E, 2 * I, H, "cpu")
    dst.codes.fill_(0xAB)  # poisoned: every byte must be written
    ptrs = [dst.codes.data_ptr(), dst.block_scales.data_ptr(), dst.scale.data_ptr()]
    moe_layout.store_fragments_(dst, codes, bscales, scale, groups=2)
    assert torch.equal(dst.codes, want.codes)
    assert torch.equal(dst.block_scales.view(torch.uint8), want.block_scales.view(torch.uint8))
    assert torch.equal(dst.scale, want.scale)
    assert ptrs == [dst.codes.data_ptr(), dst.block_scales.data_ptr(), dst.scale.data_ptr()]
    with pytest.raises(ValueError):
        moe_layout.store_fragments_(empty_moe_weights(E, 2 * I, 2 * H, "cpu"), codes, bscales, scale, groups=2)


@pytest.mark.parametrize("N,k,E", [(1, 2, 8), (37, 4, 16), (64, 8, 128)])
def test_kernel_routing_equals_moe_routing(N, k, E):
    gen = torch.Generator().manual_seed(N + k)
    experts = torch.rand(N, E, generator=gen).topk(k, dim=1).indices  # distinct per token
    weights = torch.softmax(torch.randn(N, k, generator=gen), dim=1)
    got, want = kernel_routing(experts, weights, E), moe_routing.route(experts, E, weights)
    for f in ("row_index", "offsets", "slot_rows", "row_weight"):
        a, b = getattr(got, f), getattr(want, f)
        assert a.dtype == b.dtype and torch.equal(a, b), f


@pytest.mark.parametrize("mode", ["compact", "full"])
def test_guidance_layout_round_trip(model, mode):
    """GuidanceParts -> one arena -> unpack gives back every field bit for bit (moe_act's sorted
    rows gathered into (token, slot) order); fields tile the row without overlap, each aligned."""
    cfg = load_preset("small")  # dense layer 0: no MoE sites there
    layout = GuidanceLayout(cfg, mode)
    assert (0, "moe_in") not in layout.tables and (1, "moe_act") in layout.tables and (0, "k") in layout.tables
    spans = sorted((f.offset, f.offset + f.nbytes) for f in layout.fields.values())
    assert spans[0][0] == 0 and spans[-1][1] == layout.bytes_per_token
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(f.offset % f.dtype.itemsize == 0 for f in layout.fields.values())
    gen = torch.Generator().manual_seed(1)
    N = 5
    want = {}
    for (layer, site, name), f in layout.fields.items():
        if name == "experts":
            v = torch.randint(0, cfg.num_experts, (N, *f.shape), generator=gen)
        elif f.dtype == torch.float32:
            v = torch.randn(N, *f.shape, generator=gen)
        else:
            v = torch.randint(0, 0x7F, (N, *f.shape), dtype=torch.uint8, generator=gen).view(f.dtype)
        want[(layer, site, name)] = v
    parts = layout.collector()
    for layer, site in layout.tables:
        w = [want[(layer, site, name)] for name in ("scale", "block_scales", "payload")]
        if site == "moe_act":  # hand the rows over in a shuffled "sorted" order, with their slot map
            k = w[0].shape[1]
            order = torch.randperm(N * k, generator=gen)  # sorted row i holds flat slot order[i]
            slot_rows = torch.empty(N * k, dtype=torch.int64)
            slot_rows[order] = torch.arange(N * k)
            shuffled = [v.reshape(N * k, *v.shape[2:])[order] for v in w]
            parts.add_rows(layer, site, *shuffled, rows=slot_rows.view(N, k))
            parts.add_experts(layer, want[(layer, site, "experts")])
        else:
            parts.add_rows(layer, site, *w)
    arena = parts.assemble()
    assert arena.shape == (N, layout.bytes_per_token)
    for (layer, site), fields in layout.unpack(arena).items():
        for name, v in fields.items():
            w = want[(layer, site, name)]
            assert v.dtype == (torch.int64 if name == "experts" else w.dtype)
            assert torch.equal(bytes_of(v.contiguous()), bytes_of(w)), (layer, site, name)
    bad = layout.collector()
    with pytest.raises(ValueError, match="expected"):  # a payload one byte short per row
        bad.add_rows(0, "k", want[(0, "k", "scale")], want[(0, "k", "block_scales")],
                     want[(0, "k", "payload")][..., :-1])
    with pytest.raises(ValueError, match="expected"):
        bad.add_rows(1, "moe_in", want[(1, "moe_in", "scale")].double(), want[(1, "moe_in", "block_scales")],
                     want[(1, "moe_in", "payload")])
    bad.add_rows(0, "k", *(want[(0, "k", n)] for n in ("scale", "block_scales", "payload")))
    with pytest.raises(ValueError, match="tokens"):
        bad.add_rows(0, "v", *(want[(0, "v", n)][:N - 1] for n in ("scale", "block_scales", "payload")))
    with pytest.raises(ValueError, match="lacks"):
        bad.assemble()


def test_kernel_support_and_backend_choice(model):
    assert kernel_support(load_preset("tiny-kernels"), torch.bfloat16) is None
    assert kernel_support(load_preset("bench"), torch.bfloat16) is None
    assert "multiples of 64" in kernel_support(load_preset("tiny"), torch.bfloat16)
    assert "BF16" in kernel_support(load_preset("tiny-kernels"), torch.float32)
    assert kv_kernel_support(load_preset("tiny-kernels"), 16) is None
    assert "head_dim" in kv_kernel_support(load_preset("tiny"), 16)
    assert kernel_engine(model, backend="auto").backend == "reference"  # no GPU here
    with pytest.raises(ValueError, match="multiples of 64"):
        kernel_engine(MoEForCausalLM(load_preset("tiny")).to(torch.bfloat16))
    with pytest.raises(ValueError, match="nvfp4 kernel path"):
        RolloutEngine(model, EngineConfig(backend="kernels"), mode="bf16")
    with pytest.raises(ValueError, match="backend"):
        EngineConfig(backend="cutlass")


@pytest.mark.parametrize("kv_kernels", [True, False])
@pytest.mark.parametrize("capture", ["compact", "full"])
def test_kernel_guidance_equals_reference_recorder(model, capture, kv_kernels, count_decode_attention):
    """What the kernels' outputs put in the arena, copied out and keyed by (sequence, position,
    slot), equals GuidanceRecorder's record of nvfp4.quantize on the very inputs the kernels saw."""
    eng = kernel_engine(model, capture, kv_kernels=kv_kernels)
    eng.runner.shadow = GuidanceRecorder(capture)
    batch = eng.generate(PROMPTS, SamplingParams(max_new_tokens=6), group_size=2, seed=4)
    assert eng.kv_kernels == kv_kernels and (len(count_decode_attention) > 0) == kv_kernels
    assert_guidance_equal(batch.guidance, eng.runner.shadow.finalize())
    # experts of each slot are the routing the sample reports
    s = batch.samples[1]
    n = len(s.prompt_ids) + len(s.output_ids) - 1
    ex, found = batch.guidance.experts(0, torch.full((n,), s.seq_id), torch.arange(n))
    assert found.all() and torch.equal(ex, s.routing[0][:n].long())
    assert batch.guidance.stats()["tokens"] == sum(len(x.prompt_ids) + len(x.output_ids) - 1
                                                   for x in batch.samples)


def test_capture_does_not_change_tokens(model):
    sp = SamplingParams(temperature=1.0, max_new_tokens=8)
    on = kernel_engine(model, "compact").generate(PROMPTS, sp, group_size=2, seed=2)
    off = kernel_engine(model, "off").generate(PROMPTS, sp, group_size=2, seed=2)
    assert off.guidance is None and on.guidance is not None
    assert [s.output_ids for s in on.samples] == [s.output_ids for s in off.samples]
    for a, b in zip(on.samples, off.samples):
        assert torch.equal(a.logprobs, b.logprobs)


def full_forward_logprobs(model, eng, sample, params):
    quant = KernelQuantizer(eng.packed, EMULATED_OPS)  # no KV pages: K/V come back dequantized
    ids = torch.tensor([sample.prompt_ids + sample.output_ids])
    with torch.no_grad():
        logits = model(ids, quant=quant, seq_ids=torch.tensor([sample.seq_id])).logits[0]
    n = len(sample.prompt_ids)
    logp = sampling_logprobs(logits[n - 1:-1], params)
    return logp.gather(1, torch.tensor(sample.output_ids)[:, None]).squeeze(1)


@pytest.mark.parametrize("kv_kernels", [True, False])
def test_kernel_engine_logprobs_match_full_forward(model, kv_kernels):
    params = SamplingParams(temperature=0.8, top_k=40, max_new_tokens=10)
    eng = kernel_engine(model, "off", kv_kernels=kv_kernels)
    batch = eng.generate(PROMPTS, params, group_size=2, seed=5)
    for s in batch.samples:
        ref = full_forward_logprobs(model, eng, s, params)
        assert torch.isfinite(s.logprobs).all()
        torch.testing.assert_close(s.logprobs, ref, atol=2e-2, rtol=2e-2)  # BF16 paged vs dense attention


def test_kernel_refit_in_place(model):
    eng = kernel_engine(model, "off")
    ptrs = eng.packed.data_ptrs()
    other = MoEForCausalLM(load_preset("tiny-kernels")).init_weights(seed=9).to(torch.bfloat16)
    seconds = eng.refit(other)
    assert seconds > 0 and eng.last_refit["quantize_seconds"] > 0 and eng.last_refit["expert_bytes"] > 0
    assert eng.packed.data_ptrs() == ptrs
    block = other.model.layers[1].mlp
    I = block.intermediate
    want = moe_layout.quantize_weights(moe_layout.interleave_gate_up(block.w_gate_up[:, :I], block.w_gate_up[:, I:]))
    got = eng.packed.gate_up[1]
    assert torch.equal(got.codes, want.codes) and torch.equal(got.scale, want.scale)
    assert torch.equal(got.block_scales.view(torch.uint8), want.block_scales.view(torch.uint8))
    want_down = moe_layout.quantize_weights(block.w_down)
    assert torch.equal(eng.packed.down[1].codes, want_down.codes)
    # generation after refit == a fresh engine on the new weights
    sp = SamplingParams(max_new_tokens=6)
    a = eng.generate(PROMPTS, sp, seed=3)
    b = kernel_engine(other, "off").generate(PROMPTS, sp, seed=3)
    assert [s.output_ids for s in a.samples] == [s.output_ids for s in b.samples]
    # the reference codes: per expert nvfp4.quantize(w[e], scale="tensor") of the source
    q = nvfp4.quantize(block.w_down[2], scale="tensor")
    codes, _, scale = moe_layout.unpack_weights(eng.packed.down[1])
    assert torch.equal(codes[2], q.codes) and torch.equal(scale[2], q.scale)


def test_dequantize_pages_equals_nvfp4_dequantize():
    from trace_rl.engine.kv_cache import code_table, dequantize_pages
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(7, 3, 64, generator=gen) * torch.logspace(-3, 3, 64)
    q = nvfp4.quantize(x)
    codes = q.codes.clone()
    codes[0, 0, :4] = 0x88  # -0 codes (never produced, but they decode)
    for dtype in (torch.bfloat16, torch.float32):
        want = nvfp4.dequantize(nvfp4.NVFP4Tensor(codes, q.block_scales, q.scale), dtype=dtype)
        got = dequantize_pages(kv_codes.encode_codes(codes), q.block_scales, q.scale, code_table("cpu"), dtype)
        assert torch.equal(got.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                           want.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))


@pytest.mark.parametrize("mode", ["bf16", "nvfp4"])
def test_bench_memory_plan_matches_the_cache(model, mode):
    """profiling/bench_rollout.py sizes its batch from kv_bytes_per_token: it must be what the
    engine's KV cache really takes."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "profiling" / "bench_rollout.py"
    spec = importlib.util.spec_from_file_location("bench_rollout", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    eng = RolloutEngine(model, EngineConfig(block_size=8, max_model_len=48), mode=mode)
    slots = eng.blocks.num_blocks * eng.blocks.block_size
    assert eng.cache.nbytes() == slots * bench.kv_bytes_per_token(model.config, mode)


def test_bf16_decode_attention_path(model, count_decode_attention):
    """bf16 mode's paged-KV kernel path (on by default only on an H200) through the ops' CPU
    references: BF16 pages appended by kv_append, decode_attention over them; log-probs match
    the plain model forward."""
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    eng = RolloutEngine(model, EngineConfig(block_size=8, max_model_len=48), mode="bf16")
    assert not eng.kv_kernels  # CPU: the torch attention unless asked
    eng.runner.kv_kernels = True
    batch = eng.generate(PROMPTS, params, group_size=2, seed=6)
    assert len(count_decode_attention) > 0
    with torch.no_grad():
        for s in batch.samples:
            ids = torch.tensor([s.prompt_ids + s.output_ids])
            logits = model(ids).logits[0]
            n = len(s.prompt_ids)
            ref = sampling_logprobs(logits[n - 1:-1], params).gather(1, torch.tensor(s.output_ids)[:, None]).squeeze(1)
            torch.testing.assert_close(s.logprobs, ref, atol=2e-2, rtol=2e-2)
