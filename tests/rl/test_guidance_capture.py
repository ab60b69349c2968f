"""Host side of the engine's guidance capture on CPU: the pinned slab pool's allocation and reuse,
its limit, the engine's up-front guidance budget check, and the decode step's cached block tables."""
import pytest
import torch

from trace_rl.config import load_preset
from trace_rl.engine import EngineConfig, RolloutEngine, SamplingParams
from trace_rl.engine.guidance_capture import ALIGN, PinnedSlabPool
from trace_rl.model import MoEForCausalLM


def spans(views):
    return sorted((v.data_ptr(), v.data_ptr() + v.numel()) for v in views)


def test_pool_views_are_disjoint_and_reused_after_reset():
    pool = PinnedSlabPool(slab_bytes=4096, pin_memory=False)
    sizes = [1000, 17, 2048, 4000, 300, 5000]  # 5000 > slab: a slab of its own
    first = [pool.take(n) for n in sizes]
    assert [v.numel() for v in first] == sizes
    s = spans(first)
    assert all(a[1] <= b[0] for a, b in zip(s, s[1:])), "views overlap"
    bases = [slab.data_ptr() for slab in pool.slabs]
    assert all(min(v.data_ptr() - b for b in bases if v.data_ptr() >= b) % ALIGN == 0 for v in first)
    for i, v in enumerate(first):  # each view is writable memory of its own
        v.fill_(i)
    assert all(bool((v == i).all()) for i, v in enumerate(first))
    slabs = len(pool.slabs)
    pool.reset()
    again = [pool.take(n) for n in sizes]
    assert len(pool.slabs) == slabs, "the same batch again must not allocate"
    assert [v.data_ptr() for v in again] == [v.data_ptr() for v in first]


def test_pool_reserve_and_limit():
    pool = PinnedSlabPool(slab_bytes=1024, limit_bytes=4096, pin_memory=False)
    pool.reserve(3000)
    assert pool.pinned_bytes == 3072 and pool.used_bytes == 0
    for _ in range(3):
        pool.take(1000)
    assert len(pool.slabs) == 3
    pool.take(1000)
    with pytest.raises(MemoryError, match="guidance_host_gb"):
        pool.take(1000)


def test_pool_reserve_covers_the_tails_large_takes_leave():
    """reserve(n, largest_take) keeps its promise when takes do not pack a slab: 2 takes of 400 ALIGN
    units fill a 1024-unit slab only to 800, so 5 of them (2000 units) need 3 slabs where n alone
    asks for 2. (The rollout engine's prefill arenas are such takes: at 16K tokens a step, 118 MB
    each in 256 MB slabs.)"""
    slab, take = 1024 * ALIGN, 400 * ALIGN
    naive = PinnedSlabPool(slab_bytes=slab, pin_memory=False)
    naive.reserve(5 * take)  # small takes assumed
    assert len(naive.slabs) == 2
    for _ in range(5):
        naive.take(take)
    assert len(naive.slabs) == 3, "the tails left a take without room: a slab allocated mid-batch"
    pool = PinnedSlabPool(slab_bytes=slab, pin_memory=False)
    pool.reserve(5 * take, largest_take=take)
    reserved = len(pool.slabs)
    for _ in range(5):
        pool.take(take)
    assert len(pool.slabs) == reserved >= 3, "a reserved batch must not allocate"
    capped = PinnedSlabPool(slab_bytes=slab, limit_bytes=2 * slab, pin_memory=False)
    capped.reserve(5 * take, largest_take=take)  # stops at the limit instead of raising
    assert len(capped.slabs) == 2


def test_pool_reserve_for_takes_as_large_as_a_slab_stays_bounded():
    """Takes as large as a slab: new slabs hold two of them, so reserve pins at most ~2x what the
    takes use (a slab-sized bound would leave ALIGN usable bytes per slab and pin without end)."""
    slab = 1024 * ALIGN
    pool = PinnedSlabPool(slab_bytes=slab, pin_memory=False)
    pool.reserve(4 * slab, largest_take=slab)
    assert 4 * slab <= pool.pinned_bytes <= 8 * slab
    reserved = len(pool.slabs)
    for _ in range(4):
        pool.take(slab)
    assert len(pool.slabs) == reserved


@pytest.fixture(scope="module")
def model():
    return MoEForCausalLM(load_preset("tiny-kernels")).init_weights(seed=0).to(torch.bfloat16)


def test_generate_checks_the_guidance_budget_before_any_work(model):
    engine = RolloutEngine(model, EngineConfig(block_size=8, max_model_len=48, backend="kernels",
                                               guidance_host_gb=1e-6), mode="nvfp4", capture="compact")
    per_token = engine.guidance_capture.layout.bytes_per_token
    assert engine.guidance_bytes_for(10) == 10 * per_token
    budget_tokens = engine.guidance_limit_bytes // per_token
    prompt = [[1, 2, 3]]
    fits = SamplingParams(max_new_tokens=budget_tokens - 3, ignore_eos=True)
    out = engine.generate(prompt, fits, seed=0)
    assert out.guidance is not None
    too_many = SamplingParams(max_new_tokens=budget_tokens - 2, ignore_eos=True)
    with pytest.raises(ValueError, match="guidance_host_gb"):
        engine.generate(prompt, too_many, seed=0)
    with pytest.raises(ValueError, match="guidance_host_gb"):
        engine.reserve_guidance(budget_tokens + 1)
    with pytest.raises(ValueError, match="guidance_host_gb"):
        EngineConfig(guidance_host_gb=0.0)


def test_block_tables_are_built_once_per_batch(model):
    engine = RolloutEngine(model, EngineConfig(block_size=4, max_model_len=40), mode="bf16")
    runner = engine.runner
    built = []
    real = torch.zeros

    def counting_zeros(*shape, **kw):
        if len(shape) == 2 and shape[1] == runner.max_blocks_per_seq:
            built.append(shape)
        return real(*shape, **kw)

    torch.zeros = counting_zeros
    try:
        # the 36-token prompt reaches max_model_len after 4 new tokens, the other runs on alone
        out = engine.generate([[1, 2, 3, 4, 5], [6] * 36], SamplingParams(max_new_tokens=6, ignore_eos=True), seed=3)
    finally:
        torch.zeros = real
    assert [len(s.output_ids) for s in out.samples] == [6, 4]
    # prefill and decode of both sequences share one table; one more once the batch shrank
    assert len(built) == 2, built
    from trace_rl.engine.sequence import Sequence
    seqs = [Sequence(100 + i, i, 0, i, [1] * n, n + 8) for i, n in enumerate((5, 13))]
    for s in seqs:
        engine.blocks.allocate(s)
    tables = runner._block_tables(seqs)
    want = torch.zeros(2, runner.max_blocks_per_seq, dtype=torch.int64)
    for b, s in enumerate(seqs):
        want[b, :len(s.block_table)] = torch.tensor(s.block_table)
    assert torch.equal(tables, want)
    assert runner._block_tables(seqs) is tables  # same batch: no rebuild
    assert not torch.equal(runner._block_tables(seqs[::-1]), tables)
    for s in seqs:
        engine.blocks.release(s)
        assert s.block_table_tensor is None


def load_bench_rollout():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "profiling" / "bench_rollout.py"
    spec = importlib.util.spec_from_file_location("bench_rollout", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.parametrize("mode,capture", [("bf16", "off"), ("nvfp4", "compact")])
def test_bench_long_output_decode_points(model, mode, capture):
    """bench_rollout --long-outputs on CPU: synthetic prefilled sequences decode through the
    engine's own step (guidance captured for exactly the decoded positions), and give their
    pages back."""
    bench = load_bench_rollout()
    cfg = EngineConfig(block_size=4, max_model_len=64, max_num_seqs=3, backend="kernels" if mode == "nvfp4" else "auto")
    engine = RolloutEngine(model, cfg, mode=mode, capture=capture)
    bench.fill_cache_randomly(engine.cache, seed=1)
    pages = engine.cache.k[0]
    filled = pages.codes if pages.quantized else pages.data
    assert filled.float().abs().sum() > 0
    free = len(engine.blocks.free)
    seen = []
    if capture != "off":
        real = engine.guidance_capture.finalize
        engine.guidance_capture.finalize = lambda: seen.append(real()) or seen[-1]
    point = bench.time_decode_at(engine, batch=3, context_len=40, steps=4, warmup=2, seed=0)
    assert point["context_len"] == 40 and point["step_ms"] > 0 and point["tokens_per_s"] > 0
    assert len(engine.blocks.free) == free, "synthetic sequences must give their pages back"
    if capture != "off":
        (batch,) = seen
        table = batch.tables[(0, "k")]
        assert sorted(set(table.positions.tolist())) == list(range(40, 46))  # 2 warm-up + 4 timed steps
        assert len(set(table.seq_ids.tolist())) == 3
        assert point["guidance_finalize_ms"] is not None


def test_bench_capture_ab_pairs_two_engines(model):
    """bench_rollout --capture-ab / --capture-ab-generate on CPU: both arms run the same number
    of interleaved steps (or generate calls) and the report's cost is their ratio."""
    import argparse
    bench = load_bench_rollout()
    args = argparse.Namespace(block_size=4, max_batched_tokens=64, seed=0, ab_rounds=2, ab_steps=2,
                              ab_generate_rounds=2)
    preset_model = model
    row = bench.capture_ab_decode(preset_model, args, batch=2, context_len=12, device=torch.device("cpu"))
    assert row["rounds"] == 2 and len(row["round_costs"]) == 2
    assert row["step_ms_off"] > 0 and row["step_ms_compact"] > 0
    assert row["capture_cost"] == pytest.approx(row["step_ms_compact"] / row["step_ms_off"] - 1)
    gen = bench.capture_ab_generate(preset_model, args, batch=2, prompt_len=5, new_tokens=3, device=torch.device("cpu"))
    assert len(gen["runs"]["off"]) == len(gen["runs"]["compact"]) == 2
    assert gen["wall_cost"] == pytest.approx(gen["compact"]["wall_s"] / gen["off"]["wall_s"] - 1)
    assert gen["costs"]["compact"]["decode"] == pytest.approx(gen["decode_cost"])
    args.ab_generate_arms = "off,compact-nocopy"  # the diagnostic arms need the kernels' capture (CUDA)
    with pytest.raises(ValueError, match="kernels' guidance capture"):
        bench.capture_ab_generate(preset_model, args, batch=2, prompt_len=5, new_tokens=3, device=torch.device("cpu"))


def test_bench_arm_reports_later_generates_apart_from_the_first(model):
    """bench_rollout's arm on CPU: --generate-reps full generates; the first is reported apart, the
    arm's numbers are the median of the later ones (the steady state of an RL loop)."""
    import argparse
    import statistics
    bench = load_bench_rollout()
    args = argparse.Namespace(block_size=4, max_batched_tokens=64, seed=0, output_len=3, generate_reps=3,
                              refit_iters=0)
    row = bench.run_arm(model, args, "nvfp4", "compact", False, prompt_len=5, batch=2, device=torch.device("cpu"))
    later = row["later_generates"]
    assert row["generate_reps"] == 3 and len(later) == 2
    assert row["first_generate"]["decode_steps"] == later[0]["decode_steps"] == 2  # 3 new tokens: 1 from prefill
    for key in ("decode_tokens_per_s", "wall_s", "decode_step_ms"):
        assert row[key] == statistics.median(r[key] for r in later)
    assert row["guidance_bytes"] > 0 and row["sampling_ms"] is None


def test_copy_queue_paces_oldest_first():
    from trace_rl.engine.guidance_capture import CopyQueue
    q = CopyQueue()
    q.push("prefill", 100)
    q.push("empty", 0)  # nothing to copy: never queued
    q.push("decode1", 10)
    assert q.backlog == 110
    pieces, done = q.take(30)
    assert pieces == [("prefill", 0, 30)] and done == [] and q.backlog == 80
    pieces, done = q.take(75)
    assert pieces == [("prefill", 30, 100), ("decode1", 0, 5)] and done == ["prefill"] and q.backlog == 5
    q.push("decode2", 10)
    pieces, done = q.take(1000)
    assert pieces == [("decode1", 5, 10), ("decode2", 0, 10)] and done == ["decode1", "decode2"]
    assert q.backlog == 0 and not q.items
    assert q.take(10) == ([], [])
    q.push("x", 4)
    q.clear()
    assert q.backlog == 0 and q.take(10) == ([], [])


@pytest.mark.parametrize("bad", [dict(guidance_copy_mb_per_step=0), dict(guidance_copy_mb_per_step=1.5),
                                 dict(guidance_host_gb=-1.0)])
def test_guidance_knobs_reject_bad_values(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        EngineConfig(**bad)


def _random_arena(layout, n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, (n, layout.bytes_per_token), dtype=torch.uint8, generator=gen)


def test_finalize_sorts_rows_and_keeps_the_last_of_a_repeated_key():
    """AsyncGuidanceCapture.finalize on CPU against a per-row dictionary: every table row is the
    field of the last arena row recorded for its (seq_id, position), rows sorted by key."""
    from trace_rl.engine.guidance_capture import AsyncGuidanceCapture
    from trace_rl.engine.kernel_layout import GuidanceLayout
    layout = GuidanceLayout(load_preset("tiny-kernels"), "compact")
    cap = AsyncGuidanceCapture(layout, "cpu")
    gen = torch.Generator().manual_seed(5)
    steps = [(torch.tensor([3, 3, 3, 0, 0]), torch.tensor([0, 1, 2, 0, 1])),  # a prefill chunk
             (torch.tensor([0, 3]), torch.tensor([2, 3])),
             (torch.tensor([3, 0]), torch.tensor([4, 2]))]  # (0, 2) again: this row wins
    latest = {}
    for seq, pos in steps:
        arena = _random_arena(layout, seq.numel(), gen)
        cap.enqueue(arena, seq, pos, reused=False)
        for i, key in enumerate(zip(seq.tolist(), pos.tolist())):
            latest[key] = arena[i]
    batch = cap.finalize()
    keys = sorted(latest)
    assert batch.stats()["tokens"] == len(keys)
    for (layer, site), table in batch.tables.items():
        assert list(zip(table.seq_ids.tolist(), table.positions.tolist())) == keys
        for name, value in table.tensors().items():
            if name in ("seq_ids", "positions"):
                continue
            f = layout.fields[(layer, site, name)]
            want = torch.stack([latest[k][f.offset:f.offset + f.nbytes] for k in keys])
            got = value.to(torch.int16) if name == "experts" else value
            assert torch.equal(got.contiguous().view(torch.uint8).reshape(len(keys), -1), want), (layer, site, name)


def test_finalize_reuses_its_buffer_only_once_the_last_batch_is_gone():
    from trace_rl.engine.guidance_capture import AsyncGuidanceCapture
    from trace_rl.engine.kernel_layout import GuidanceLayout
    layout = GuidanceLayout(load_preset("tiny-kernels"), "compact")
    cap = AsyncGuidanceCapture(layout, "cpu")
    gen = torch.Generator().manual_seed(6)

    def one_batch():
        cap.enqueue(_random_arena(layout, 4, gen), torch.arange(4), torch.zeros(4, dtype=torch.int64), reused=False)
        batch = cap.finalize()
        cap.clear()
        return batch

    first = one_batch()
    table = next(iter(first.tables.values()))
    kept, first_ptr = table.payload.clone(), table.payload.data_ptr()
    view = table.payload[1:]  # outlives the batch: the buffer must not be reused under it
    del first, table
    second = one_batch()
    assert torch.equal(view, kept[1:]), "an earlier batch's memory was overwritten"
    assert next(iter(second.tables.values())).payload.data_ptr() != first_ptr
    del view
    ptr = next(iter(second.tables.values())).payload.data_ptr()
    del second
    third = one_batch()  # nothing references the buffer now: reused
    assert next(iter(third.tables.values())).payload.data_ptr() == ptr


def test_unpack_views_the_rows_and_the_store_writes_them(tmp_path):
    """Finalized tables are views of one buffer with shared key columns; the guidance file still
    gets each tensor in memory of its own and reads back equal."""
    from trace_rl.engine.guidance_capture import AsyncGuidanceCapture
    from trace_rl.engine.kernel_layout import GuidanceLayout
    from trace_rl.guidance_store import read_guidance, write_guidance
    layout = GuidanceLayout(load_preset("small"), "full")
    gen = torch.Generator().manual_seed(7)
    arena = _random_arena(layout, 3, gen)
    lo, hi = arena.data_ptr(), arena.data_ptr() + arena.numel()
    for fields in layout.unpack(arena).values():
        for name, v in fields.items():
            if name != "experts":
                assert lo <= v.data_ptr() < hi, name
    for rows in (1, 3):  # one row: its field views are contiguous, still not the file's own memory
        cap = AsyncGuidanceCapture(layout, "cpu")
        cap.enqueue(arena[:rows], torch.arange(rows), torch.zeros(rows, dtype=torch.int64), reused=False)
        batch = cap.finalize()
        write_guidance(tmp_path / f"g{rows}.safetensors", batch)
        back = read_guidance(tmp_path / f"g{rows}.safetensors")
        for key, t in batch.tables.items():
            for name, v in t.tensors().items():
                stored = back.tables[key].tensors()[name]
                assert torch.equal(stored.view(torch.uint8), v.contiguous().view(torch.uint8)), (key, name)


def test_batch_to_moves_shared_memory_once_and_keeps_the_views():
    """GuidanceBatch.to(copy=True) of the engine's tables: equal values, views of one new buffer
    per shared block of memory (fields of the sorted rows, the shared key columns), nothing left
    pointing at the old memory."""
    from trace_rl.engine.guidance_capture import AsyncGuidanceCapture
    from trace_rl.engine.kernel_layout import GuidanceLayout
    layout = GuidanceLayout(load_preset("small"), "compact")
    cap = AsyncGuidanceCapture(layout, "cpu")
    gen = torch.Generator().manual_seed(8)
    cap.enqueue(_random_arena(layout, 6, gen), torch.tensor([2, 2, 0, 1, 1, 1]),
                torch.tensor([0, 1, 0, 0, 1, 2]), reused=False)
    batch = cap.finalize()
    moved = batch.to("cpu", copy=True)
    old = {t.untyped_storage().data_ptr() for tab in batch.tables.values() for t in tab.tensors().values()}
    new_storages = set()
    for key, table in batch.tables.items():
        for name, v in table.tensors().items():
            w = moved.tables[key].tensors()[name]
            assert w.dtype == v.dtype and w.shape == v.shape and w.stride() == v.stride(), (key, name)
            assert torch.equal(w.contiguous().view(torch.uint8), v.contiguous().view(torch.uint8)), (key, name)
            assert w.untyped_storage().data_ptr() not in old
            new_storages.add(w.untyped_storage().data_ptr())
    # one buffer of rows, one pair of key columns, one experts tensor per MoE layer
    moe_layers = sum(1 for _, site in batch.tables if site == "moe_act")
    assert len(new_storages) == 1 + 2 + moe_layers
    assert batch.to("cpu") is not None and batch.to("cpu").tables[(0, "k")].payload.data_ptr() == \
        batch.tables[(0, "k")].payload.data_ptr()  # same device, no copy: the same memory
