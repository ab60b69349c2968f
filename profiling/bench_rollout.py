"""Rollout throughput (issue 6): decode tokens/s BF16 vs NVFP4, guidance capture on/off, CUDA graphs
on/off, the largest batch per mode that fits, refit seconds per GB of BF16 expert weights.

    python profiling/bench_rollout.py --quick --out profiling/results/rollout_h200_quick.json
    python profiling/bench_rollout.py --preset bench --prompt-lens 1024,4096,8192 --output-len 256 \\
        --long-outputs 32768,131072 --batch auto --out profiling/results/rollout_h200.json

One arm = (mode, capture, graphs) at one prompt length. Each arm builds an engine (nvfp4 runs the
``kernels`` backend on an H200 with a BF16 model: packed NVFP4 experts, fused MoE GEMMs, guidance
from the kernels' outputs), warms up (JIT builds, graph capture of the batch's bucket), then
generates ``batch`` random prompts with ignore_eos, so every sequence decodes exactly
--output-len tokens and the batch stays full, --generate-reps times with fresh prompts: the arm's
numbers are the median of the generates after the first, which is reported apart (`first_generate`:
one-time costs of a run's first full-length batch). Decode tokens/s = tokens sampled in decode steps /
host wall time of those steps (each step includes sampling and its one token sync; the sampler's
own time on the arm's batch is reported as sampling_ms).
--batch auto: the largest power of two (<= --max-batch) whose estimated memory (weights, KV pages,
attention and sampling working sets: auto_batch) fits --mem-fraction of free memory; on
out-of-memory the arm retries at half the batch (recorded). nvfp4 decode steps attend with the NVFP4 paged-KV kernels (kv_append +
decode_attention) where the engine enables them (arm suffix :nokv turns them off); bf16 attention
and all prefill attention run the torch paged reference (gather the pages, SDPA over max_model_len
keys), which dominates long contexts there. Refit (nvfp4, capture off): median of --refit-iters
``engine.refit(model)`` calls; ``last_refit`` gives the kernel part (refit_weights + layout
permutation, CUDA events) and s/GB over the engine's BF16 expert bytes.
--long-outputs: generations of 32K-128K tokens take minutes to hours each, so instead of running
them whole, each (mode, capture) arm sizes one engine for prompt + output tokens per sequence at
the largest batch that fits, fills its KV pages with random values standing in for the context,
and times decode steps (median of --long-steps, after 2 warm-up steps) with every sequence at
the start, the middle and the end of the generation; the whole generation's decode tokens/s is
Simpson's rule over the three (the step time is near linear in the context length, and the
three points show it). Nothing else about the step differs from a real generation.
Writes JSON with the GPU, date, commit, command, torch version and every arm (after each arm);
prints a table.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from trace_kernels.testing.provenance import git_commit, utc_now
from trace_rl.config import load_preset
from trace_rl.engine import EngineConfig, RolloutEngine, SamplingParams
from trace_rl.model import MoEForCausalLM

QUICK = dict(preset="bench", prompt_lens="1024", output_len=128, batch="64",
             arms="bf16:off:graphs,nvfp4:off:graphs,nvfp4:compact:graphs,nvfp4:off:eager,nvfp4:off:graphs:nokv,"
                  "bf16:off:eager",
             refit_iters=3, time_budget=150.0)


def free_device_memory() -> None:
    """Return the memory of engines the caller has just dropped to the device (between arms)."""
    gc.collect()
    torch.cuda.empty_cache()


def kv_bytes_per_token(config, mode: str) -> int:
    """KV cache bytes per token over all layers (K and V)."""
    d, h = config.head_dim, config.num_key_value_heads
    per_head = d * 2 if mode == "bf16" else d // 2 + d // 16 + 4  # codes + E4M3 scales + FP32 scale
    return 2 * config.num_hidden_layers * h * per_head


def attention_bytes_per_key(config) -> int:
    """Transient bytes per (sequence, key slot) of one layer's reference paged attention: the page
    gather and its dequantization (uint8 nibbles, int64 indices, FP32 values and products, BF16)
    for K and V, and the boolean mask."""
    return 2 * config.num_key_value_heads * config.head_dim * (2 + 8 + 4 + 4 + 2) + 8


def auto_batch(model, args, mode: str, prompt_len: int, kv_kernels: bool, device, max_len: int | None = None) -> int:
    """Largest power of two <= --max-batch whose memory fits --mem-fraction of free memory: the
    engine's weight copy (+ packed NVFP4 experts), the prefill chunk's reference attention, and per
    sequence its KV pages, the sampler's [V] temporaries and (without the decode kernels) the
    reference decode attention's working set over max_model_len keys."""
    c = model.config
    max_len = max_len or prompt_len + args.output_len
    free, _ = torch.cuda.mem_get_info(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    experts = sum(p.numel() * p.element_size() for _, p in model.expert_parameters())
    fixed = weights + (experts * 9 // 32 if mode == "nvfp4" else 0)
    fixed += max(1, args.max_batched_tokens // prompt_len) * max_len * attention_bytes_per_key(c)
    per_seq = max_len * kv_bytes_per_token(c, mode) + c.vocab_size * 48
    if not kv_kernels:
        per_seq += max_len * attention_bytes_per_key(c)
    fit = int((free * args.mem_fraction - fixed) // per_seq)
    batch = 1
    while batch * 2 <= min(fit, args.max_batch):
        batch *= 2
    return batch


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n, length), generator=gen).tolist()


def run_arm(model, args, mode: str, capture: str, graphs: bool, prompt_len: int, batch: int, device,
            kv_kernels: bool = True) -> dict:
    max_len = prompt_len + args.output_len
    cfg = EngineConfig(block_size=args.block_size, max_num_seqs=batch, max_model_len=max_len,
                       max_num_batched_tokens=max(args.max_batched_tokens, prompt_len), cuda_graphs=graphs,
                       kv_kernels=kv_kernels)
    engine = RolloutEngine(model, cfg, mode=mode, capture=capture, device=device)
    prompts = random_prompts(batch, prompt_len, model.config.vocab_size, args.seed)
    # the steady state of an RL loop, where every batch reuses the capture's page-locked host
    # memory: lock it before timing (the first batch of a run pays this once)
    engine.reserve_guidance(batch * max_len)
    # warm-up with the same batch size: JIT builds, autotuning and the graph of this bucket
    engine.generate(prompts, SamplingParams(max_new_tokens=3, ignore_eos=True), seed=1)
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.output_len, ignore_eos=True)
    cuda = device.type == "cuda"  # the CPU tests run an arm through the reference paths
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    # --generate-reps full-length generates, fresh prompts each: the first is reported on its own
    # (what a run's first RL batch sees), the arm's numbers are the median of the others (every
    # later batch of an RL loop)
    runs = []
    for rep in range(args.generate_reps):
        batch_prompts = prompts if rep == 0 else random_prompts(batch, prompt_len, model.config.vocab_size,
                                                                args.seed + 1000 * rep)
        segments, gc_timer = _segments_allocated(device), _GcTimer()
        gc.callbacks.append(gc_timer)
        t0 = time.perf_counter()
        out = engine.generate(batch_prompts, sp, group_size=1, seed=args.seed + rep)
        wall = time.perf_counter() - t0
        gc.callbacks.remove(gc_timer)
        runs.append(_generate_numbers(out.stats, wall) | {"new_cuda_segments": _segments_allocated(device) - segments,
                                                          "python_gc_s": gc_timer.seconds})
        guidance = out.stats.get("guidance")
        del out  # an RL loop drops a batch before generating the next
    steady = runs[1:] or runs
    row = {"mode": mode, "capture": capture, "graphs": graphs, "backend": engine.backend,
           "kv_kernels": engine.kv_kernels,
           "cuda_graphs_used": engine.runner.use_graphs, "batch": batch, "prompt_len": prompt_len,
           "output_len": args.output_len,
           **{k: statistics.median(r[k] for r in steady) for k in runs[0]},
           "generate_reps": args.generate_reps, "first_generate": runs[0], "later_generates": runs[1:],
           "kv_cache_bytes": engine.cache.nbytes(),
           "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None}
    row["sampling_ms"] = sampling_ms(batch, model.config.vocab_size, device) if cuda else None
    if guidance is not None:
        row.update(guidance_bytes=guidance["guidance_bytes"], guidance_bits_per_element=guidance["bits_per_element"],
                   guidance_bytes_per_token=guidance["bytes_per_token"])
    if mode == "nvfp4" and capture == "off" and args.refit_iters:
        times, kernel = [], []
        for _ in range(args.refit_iters):
            times.append(engine.refit(model))
            kernel.append(engine.last_refit.get("quantize_seconds", float("nan")))
        gb = engine.expert_bytes() / 1e9
        row.update(refit_s_median=statistics.median(times), refit_kernel_s_median=statistics.median(kernel),
                   expert_gb=gb, refit_s_per_gb=statistics.median(times) / gb,
                   refit_kernel_s_per_gb=statistics.median(kernel) / gb)
    del engine
    free_device_memory()
    return row


def _generate_numbers(stats: dict, wall: float) -> dict:
    """One generate's throughput numbers (host wall time of the call, and the engine's stats; the
    decode steps' median and slowest host time show whether a slow generate is slow at every step)."""
    steps_ms = sorted(1e3 * t for t in stats["decode_step_s"]) or [float("nan")]
    return {"wall_s": wall,
            "prefill_tokens_per_s": stats["prefill_tokens"] / stats["prefill_s"],
            "decode_tokens_per_s": stats["decode_tokens"] / stats["decode_s"],
            "decode_step_ms": 1e3 * stats["decode_s"] / max(stats["decode_steps"], 1),
            "decode_step_ms_median": statistics.median(steps_ms), "decode_step_ms_max": steps_ms[-1],
            "capture_host_s": stats.get("capture_host_s", 0.0),
            "decode_steps": stats["decode_steps"]}


class _GcTimer:
    """A gc.callbacks entry that adds up the seconds Python's garbage collector runs."""

    def __init__(self):
        self.seconds, self._start = 0.0, None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None


def _segments_allocated(device) -> int:
    """cudaMalloc calls of torch's caching allocator so far (0 off CUDA)."""
    return torch.cuda.memory_stats(device).get("segment.all.allocated", 0) if device.type == "cuda" else 0


def sampling_ms(batch: int, vocab: int, device, reps: int = 10) -> float:
    """Median ms of the engine's sampler alone on random logits [batch, vocab] (part of every
    decode step, outside the captured graph)."""
    from trace_rl.engine.sampler import sample
    logits = torch.randn(batch, vocab, device=device, dtype=torch.bfloat16)
    keys = torch.arange(batch, device=device)
    positions = torch.full((batch,), 1000, device=device)
    sp = SamplingParams(temperature=1.0)
    times = []
    for _ in range(reps + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        sample(logits, sp, 0, keys, positions)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times[2:])


def run_fitting(model, args, mode, capture, graphs, prompt_len, device, kv_kernels=True) -> dict:
    """run_arm at the requested (or auto) batch; halve it on out-of-memory."""
    batch = (auto_batch(model, args, mode, prompt_len, kv_kernels, device)
             if args.batch == "auto" else int(args.batch))
    retries = 0
    while True:
        try:
            row = run_arm(model, args, mode, capture, graphs, prompt_len, batch, device, kv_kernels)
            row["oom_retries"] = retries
            return row
        except torch.cuda.OutOfMemoryError:
            free_device_memory()
            if batch == 1:
                raise
            batch //= 2
            retries += 1


# ---------------------------------------------------------------------------------------------
# Long outputs (--long-outputs): decode-step time at points of a long generation
# ---------------------------------------------------------------------------------------------

def fill_cache_randomly(cache, seed: int) -> None:
    """Random finite pages (NVFP4: any codes, E4M3 block scales 2^-5..2^3, row scales ~1e-3;
    BF16: normal), standing in for a prefilled context: a decode step's cost does not depend on
    the values it reads."""
    gen = torch.Generator(device=cache.k[0].scale.device if cache.quantized else cache.k[0].data.device)
    gen.manual_seed(seed)
    for pages in cache.k + cache.v:
        if pages.quantized:
            pages.codes.random_(0, 256, generator=gen)
            pages.block_scales.view(torch.uint8).random_(0x10, 0x58, generator=gen)
            pages.scale.uniform_(5e-4, 2e-3, generator=gen)
        else:
            pages.data.normal_(generator=gen)


def synthetic_running(engine, batch: int, context_len: int, budget: int, seed: int):
    """A scheduler whose running sequences look prefilled: context_len cached tokens (the random
    pages above) plus one sampled token, pages reserved for `budget` tokens."""
    from trace_rl.engine.scheduler import Scheduler
    from trace_rl.engine.sequence import Sequence, Status
    vocab = engine.model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    scheduler = Scheduler(engine.config, engine.blocks)
    for i in range(batch):
        prompt = torch.randint(3, vocab, (context_len,), generator=gen).tolist()
        seq = Sequence(engine._next_seq_id, i, 0, i << 20, prompt, budget)
        engine._next_seq_id += 1
        engine.blocks.allocate(seq)
        seq.status, seq.num_cached = Status.RUNNING, context_len
        seq.append(int(torch.randint(3, vocab, (1,), generator=gen)), 0.0)
        scheduler.running.append(seq)
    return scheduler


def decode_step_seconds(engine, scheduler, sampling: SamplingParams, seed: int, routing, n: int) -> list[float]:
    """Host wall seconds of each of n decode steps of the scheduler's running sequences."""
    from trace_rl.engine.engine import new_step_stats
    out = []
    for _ in range(n):
        stats = new_step_stats()
        engine._step(scheduler, sampling, seed, set(), routing, stats)
        out.append(stats["decode_s"])
    return out


def time_decode_at(engine, batch: int, context_len: int, steps: int, warmup: int, seed: int) -> dict:
    """Median decode-step ms (host wall: forward, guidance copy, sampling, the token sync) over
    `steps` steps of `batch` sequences that start at `context_len` tokens; guidance finalize ms."""
    from trace_rl.engine.engine import _RoutingLog
    budget = context_len + 1 + warmup + steps + 1
    scheduler = synthetic_running(engine, batch, context_len, budget, seed)
    sp = SamplingParams(temperature=1.0, max_new_tokens=budget, ignore_eos=True)
    capture = engine.guidance_capture
    if capture is not None:
        capture.clear()
    routing = _RoutingLog()
    try:
        times = decode_step_seconds(engine, scheduler, sp, seed, routing, warmup + steps)[warmup:]
        finalize_ms = None
        if capture is not None:
            t0 = time.perf_counter()
            capture.finalize()
            finalize_ms = 1e3 * (time.perf_counter() - t0)
            capture.clear()
    finally:
        for seq in list(scheduler.running):
            scheduler.retire(seq)
    step_ms = 1e3 * statistics.median(times)
    return {"context_len": context_len, "step_ms": step_ms, "tokens_per_s": batch / step_ms * 1e3,
            "step_ms_min": 1e3 * min(times), "step_ms_max": 1e3 * max(times), "guidance_finalize_ms": finalize_ms}


def run_long(model, args, mode: str, capture: str, output_len: int, device) -> dict:
    """One engine sized for prompt + output_len tokens per sequence at the largest batch that fits
    (halved on out-of-memory); decode-step time at the start, middle and end of the generation.
    The whole generation's decode tokens/s follows by Simpson's rule over the three points
    (exact when the step time is quadratic in the context length; it is near linear)."""
    prompt, steps, warmup = args.long_prompt, args.long_steps, 2
    max_len = prompt + output_len + 1 + warmup + steps + 1
    batch = (auto_batch(model, args, mode, prompt, True, device, max_len=max_len)
             if args.batch == "auto" else int(args.batch))
    while True:
        engine = None
        try:
            cfg = EngineConfig(block_size=args.block_size, max_num_seqs=batch, max_model_len=max_len,
                               max_num_batched_tokens=args.max_batched_tokens, cuda_graphs=True)
            engine = RolloutEngine(model, cfg, mode=mode, capture=capture, device=device)
            fill_cache_randomly(engine.cache, args.seed)
            engine.reserve_guidance(batch * (warmup + steps + 1))
            points = [time_decode_at(engine, batch, L, steps, warmup, args.seed)
                      for L in (prompt, prompt + output_len // 2, prompt + output_len)]
            break
        except torch.cuda.OutOfMemoryError:
            del engine
            free_device_memory()
            if batch == 1:
                raise
            batch //= 2
    t0, t1, t2 = (p["step_ms"] for p in points)
    mean_step_ms = (t0 + 4 * t1 + t2) / 6
    row = {"mode": mode, "capture": capture, "backend": engine.backend, "kv_kernels": engine.kv_kernels,
           "prompt_len": prompt, "output_len": output_len, "batch": batch, "steps_per_point": steps,
           "kv_cache_bytes": engine.cache.nbytes(), "points": points,
           "generation_decode_tokens_per_s": batch / mean_step_ms * 1e3,
           "generation_decode_s_estimate": output_len * mean_step_ms / 1e3}
    del engine
    free_device_memory()
    return row


def summarize_long(rows: list[dict]) -> list[str]:
    lines = []
    by = {(r["output_len"], r["mode"], r["capture"]): r for r in rows}
    for out in sorted({r["output_len"] for r in rows}):
        bf, fp, fpc = (by.get((out, m, c)) for m, c in (("bf16", "off"), ("nvfp4", "off"), ("nvfp4", "compact")))
        if bf and fp:
            lines.append(f"output {out}: nvfp4 / bf16 whole-generation decode tokens/s = "
                         f"{fp['generation_decode_tokens_per_s'] / bf['generation_decode_tokens_per_s']:.2f}x "
                         f"(batch {fp['batch']} vs {bf['batch']})")
        if fp and fpc and fp["batch"] == fpc["batch"]:
            lines.append(f"output {out}: guidance capture costs "
                         f"{100 * (1 - fpc['generation_decode_tokens_per_s'] / fp['generation_decode_tokens_per_s']):.1f}% "
                         f"of nvfp4 decode tokens/s")
    return lines


# ---------------------------------------------------------------------------------------------
# Guidance capture cost, paired (--capture-ab): two engines alive at once, steps interleaved
# ---------------------------------------------------------------------------------------------

def guidance_sink(engine):
    """Where the engine's guidance goes: the kernels' async capture, or the reference recorder."""
    return engine.guidance_capture if engine.guidance_capture is not None else engine.recorder


def capture_ab_decode(model, args, batch: int, context_len: int, device) -> dict:
    """Median decode-step ms of an nvfp4 engine without and with compact capture, measured in
    alternating rounds (the order flips every round) on two engines that exist side by side, so
    clock drift and run-to-run noise cancel (arms timed one after the other differed by up to
    +-10% in step time with identical work). Synthetic prefilled context, as --long-outputs."""
    from trace_rl.engine.engine import _RoutingLog
    rounds, steps, warmup = args.ab_rounds, args.ab_steps, 2
    budget = context_len + 1 + warmup + rounds * steps + 1
    cfg = EngineConfig(block_size=args.block_size, max_num_seqs=batch, max_model_len=budget,
                       max_num_batched_tokens=args.max_batched_tokens, cuda_graphs=True)
    arms = ("off", "compact")
    engines = {c: RolloutEngine(model, cfg, mode="nvfp4", capture=c, device=device) for c in arms}
    scheds, routing, times = {}, {c: _RoutingLog() for c in arms}, {c: [] for c in arms}
    sp = SamplingParams(temperature=1.0, max_new_tokens=budget, ignore_eos=True)
    try:
        for c, e in engines.items():
            fill_cache_randomly(e.cache, args.seed)
            e.reserve_guidance(batch * (budget - context_len))
            scheds[c] = synthetic_running(e, batch, context_len, budget, args.seed)

        def run(c: str, n: int) -> list[float]:
            return decode_step_seconds(engines[c], scheds[c], sp, args.seed, routing[c], n)

        for c in arms:
            run(c, warmup)  # graph capture of the bucket
        per_round = []
        for r in range(rounds):
            med = {}
            for c in (arms if r % 2 == 0 else arms[::-1]):
                t = run(c, steps)
                times[c] += t
                med[c] = statistics.median(t)
            per_round.append(med["compact"] / med["off"] - 1)
        guidance_sink(engines["compact"]).finalize()
    finally:
        for c, sch in scheds.items():
            for seq in list(sch.running):
                sch.retire(seq)
        if "compact" in engines:
            guidance_sink(engines["compact"]).clear()
    off, on = (1e3 * statistics.median(times[c]) for c in arms)
    row = {"batch": batch, "context_len": context_len, "rounds": rounds, "steps_per_round": steps,
           "step_ms_off": off, "step_ms_compact": on, "capture_cost": on / off - 1,
           "round_costs": per_round, "round_cost_median": statistics.median(per_round),
           "round_cost_min": min(per_round), "round_cost_max": max(per_round)}
    del engines
    free_device_memory()
    return row


DRAIN_STEPS = 40  # decode steps that send the prefill's leftover guidance (~1 GiB at 32 MB a step)


def _ab_engine(model, cfg, arm: str, device) -> RolloutEngine:
    """An nvfp4 engine for one --ab-generate-arms arm: off | compact | compact-nocopy (guidance
    stays on the device until finalize: no copy during the loop) | compact-noqueue (the step
    writes guidance on the device, nothing is copied or kept: the in-graph cost alone)."""
    capture, _, variant = arm.partition("-")
    engine = RolloutEngine(model, cfg, mode="nvfp4", capture=capture, device=device)
    cap = engine.guidance_capture
    if variant and cap is None:
        raise ValueError(f"arm {arm!r} needs the kernels' guidance capture (a CUDA device)")
    if variant == "nocopy":
        cap.copy_bytes_per_step, cap.max_backlog_bytes = 0, 1 << 62
    elif variant == "noqueue":
        cap.enqueue = lambda *a, **k: None
    elif variant:
        raise ValueError(f"unknown arm {arm!r}")
    return engine


def capture_ab_generate(model, args, batch: int, prompt_len: int, new_tokens: int, device) -> dict:
    """Whole generate calls (prefill, decode, guidance finalize) in rounds over nvfp4 engines that
    exist side by side (--ab-generate-arms, the order rotating every round; one untimed full
    generate each first), --ab-generate-rounds each: what capture costs a rollout batch end to
    end, including moving the prefill's guidance and building the tables. Costs are against "off"."""
    cfg = EngineConfig(block_size=args.block_size, max_num_seqs=batch, max_model_len=prompt_len + new_tokens,
                       max_num_batched_tokens=max(args.max_batched_tokens, prompt_len), cuda_graphs=True)
    arms = tuple(getattr(args, "ab_generate_arms", "off,compact").split(","))
    if "off" not in arms:
        raise ValueError("--ab-generate-arms needs the 'off' arm (costs are relative to it)")
    engines = {a: _ab_engine(model, cfg, a, device) for a in arms}
    prompts = random_prompts(batch, prompt_len, model.config.vocab_size, args.seed)
    sp = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, ignore_eos=True)
    for e in engines.values():
        e.reserve_guidance(batch * (prompt_len + new_tokens))
        e.generate(prompts, sp, seed=args.seed + 1)  # warm-up: graphs, pinned slabs, finalize's buffer
    runs = {a: [] for a in arms}
    for r in range(args.ab_generate_rounds):
        for a in arms[r % len(arms):] + arms[:r % len(arms)]:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.time()  # wall clock, to line runs up with a clock/power log
            t0 = time.perf_counter()
            out = engines[a].generate(prompts, sp, seed=args.seed)
            wall = time.perf_counter() - t0
            st = out.stats
            steps = st["decode_step_s"]
            head = steps[:DRAIN_STEPS]
            runs[a].append({"started_unix": started, "wall_s": wall, "prefill_s": st["prefill_s"],
                            "decode_s": st["decode_s"],
                            "rest_s": wall - st["prefill_s"] - st["decode_s"],
                            "finalize_s": st.get("guidance_finalize_s", 0.0),
                            "capture_host_s": st.get("capture_host_s", 0.0),
                            "step_ms_median": 1e3 * statistics.median(steps),
                            "first_steps_ms_mean": 1e3 * statistics.fmean(head),
                            "later_steps_ms_mean": 1e3 * statistics.fmean(steps[DRAIN_STEPS:] or head)})
            del out
    med = {a: {k: statistics.median(x[k] for x in runs[a]) for k in runs[a][0] if k != "started_unix"} for a in arms}
    cost = lambda a, k: med[a][k] / med["off"][k] - 1
    row = {"batch": batch, "prompt_len": prompt_len, "new_tokens": new_tokens, "rounds": args.ab_generate_rounds,
           "arms": list(arms), **{a: med[a] for a in arms}, "runs": runs,
           "costs": {a: {"decode": cost(a, "decode_s"), "decode_step_median": cost(a, "step_ms_median"),
                         "prefill": cost(a, "prefill_s"), "wall": cost(a, "wall_s"),
                         "paired_decode": [y["decode_s"] / x["decode_s"] - 1 for x, y in zip(runs["off"], runs[a])],
                         "paired_step_median": [y["step_ms_median"] / x["step_ms_median"] - 1
                                                for x, y in zip(runs["off"], runs[a])]}
                     for a in arms if a != "off"}}
    if "compact" in arms:  # the headline pair, as earlier reports had it
        row.update(decode_cost=cost("compact", "decode_s"), decode_step_median_cost=cost("compact", "step_ms_median"),
                   prefill_cost=cost("compact", "prefill_s"), wall_cost=cost("compact", "wall_s"))
    del engines
    free_device_memory()
    return row


def summarize(rows: list[dict]) -> list[str]:
    lines = []
    key = lambda r: (r["prompt_len"], r["mode"], r["capture"], r["graphs"])
    by = {key(r): r for r in rows if r["kv_kernels"] or r["mode"] == "bf16"}
    by.update({key(r): r for r in rows if key(r) not in by})
    for p in sorted({r["prompt_len"] for r in rows}):
        def tps(mode, capture="off", graphs=True):
            r = by.get((p, mode, capture, graphs))
            return r["decode_tokens_per_s"] if r else None
        bf, fp, fpc = tps("bf16"), tps("nvfp4"), tps("nvfp4", "compact")
        if bf and fp:
            lines.append(f"prompt {p}: nvfp4 / bf16 decode tokens/s = {fp / bf:.2f}x")
        if fp and fpc:
            # arms run one after the other (unpaired); --capture-ab-generate measures the capture cost paired
            first = lambda mode, capture: by[(p, mode, capture, True)].get("first_generate", {}).get("decode_tokens_per_s")
            f_fp, f_fpc = first("nvfp4", "off"), first("nvfp4", "compact")
            lines.append(f"prompt {p}: nvfp4 decode tokens/s with compact capture {100 * (fpc / fp - 1):+.1f}% "
                         + (f"(first generate of each arm: {100 * (f_fpc / f_fp - 1):+.1f}%) " if f_fp and f_fpc else "")
                         + "(unpaired arms)")
        for mode in ("bf16", "nvfp4"):
            g, e = tps(mode), tps(mode, graphs=False)
            if g and e:
                lines.append(f"prompt {p}: CUDA graphs speed {mode} decode up {g / e:.2f}x")
        kv = {r["kv_kernels"]: r["decode_tokens_per_s"] for r in rows
              if (r["prompt_len"], r["mode"], r["capture"], r["graphs"]) == (p, "nvfp4", "off", True)}
        if True in kv and False in kv:
            lines.append(f"prompt {p}: paged-KV decode kernels speed nvfp4 decode up {kv[True] / kv[False]:.2f}x")
    return lines


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one short run of every comparison (< 3 min on an H200)")
    p.add_argument("--preset", default="bench")
    p.add_argument("--device", default="cuda")
    p.add_argument("--prompt-lens", default="1024,4096,8192")
    p.add_argument("--output-len", type=int, default=4096)
    p.add_argument("--batch", default="auto", help="sequences per arm, or 'auto' (largest that fits)")
    p.add_argument("--max-batch", type=int, default=512)
    p.add_argument("--mem-fraction", type=float, default=0.7)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=16384, help="prompt tokens per prefill step")
    p.add_argument("--arms", default="bf16:off:graphs,nvfp4:off:graphs,nvfp4:compact:graphs,nvfp4:off:eager,"
                   "nvfp4:off:graphs:nokv",
                   help="comma-separated mode:capture:graphs|eager[:nokv] (nokv: torch paged attention in nvfp4)")
    p.add_argument("--refit-iters", type=int, default=5)
    p.add_argument("--generate-reps", type=int, default=3,
                   help="full-length generates per arm: the first is reported apart (first_generate), the arm's "
                        "numbers are the median of the others")
    p.add_argument("--time-budget", type=float, default=0.0, help="seconds; skip arms once spent (0: none)")
    p.add_argument("--long-outputs", default="",
                   help="comma-separated output lengths (e.g. 32768,131072): per --long-arms arm, the decode-step "
                        "time at the start, middle and end of a generation that long (synthetic prefilled context)")
    p.add_argument("--long-prompt", type=int, default=1024, help="prompt length of the --long-outputs generations")
    p.add_argument("--long-steps", type=int, default=24, help="timed decode steps per point")
    p.add_argument("--long-arms", default="bf16:off,nvfp4:off,nvfp4:compact", help="comma-separated mode:capture")
    p.add_argument("--capture-ab", default="",
                   help="comma-separated BATCH:CONTEXT: paired decode-step cost of compact capture (two engines, "
                        "interleaved rounds; synthetic context)")
    p.add_argument("--capture-ab-generate", default="",
                   help="comma-separated BATCH:PROMPT:NEW: paired whole-generate cost of compact capture")
    p.add_argument("--ab-rounds", type=int, default=8)
    p.add_argument("--ab-steps", type=int, default=8, help="decode steps per engine per round")
    p.add_argument("--ab-generate-rounds", type=int, default=2)
    p.add_argument("--ab-generate-arms", default="off,compact",
                   help="comma-separated: off (needed), compact, compact-nocopy, compact-noqueue")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args(argv)
    if args.quick:
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in (argv if argv is not None else sys.argv[1:])}
        for k, v in QUICK.items():
            if k not in given:
                setattr(args, k, v)
    device = torch.device(args.device)
    if device.type != "cuda":
        raise SystemExit("bench_rollout measures GPU throughput; run it on a CUDA device")
    start = time.perf_counter()
    with torch.device(device):
        model = MoEForCausalLM(load_preset(args.preset)).to(torch.bfloat16)
    model.init_weights(seed=args.seed)
    rows, skipped = [], []
    for prompt_len in [int(x) for x in args.prompt_lens.split(",") if x]:
        for arm in args.arms.split(","):
            mode, capture, graphs, *rest = arm.split(":")
            if args.time_budget and time.perf_counter() - start > args.time_budget:
                skipped.append(f"{arm}@{prompt_len}")
                continue
            r = run_fitting(model, args, mode, capture, graphs == "graphs", prompt_len, device,
                            kv_kernels="nokv" not in rest)
            rows.append(r)
            save(args, rows, [], [], skipped, start)
            kv = "kv-kernels" if r["kv_kernels"] else "torch-attn"
            print(f"prompt {prompt_len:5d} {mode:5s} {capture:7s} {graphs:6s} [{r['backend']}, {kv}] batch {r['batch']:4d}: "
                  f"decode {r['decode_tokens_per_s']:9.0f} tok/s ({r['decode_step_ms']:.2f} ms/step, "
                  f"sampling {r['sampling_ms']:.2f}), "
                  f"prefill {r['prefill_tokens_per_s']:9.0f} tok/s, peak {r['peak_memory_bytes'] / 2**30:.1f} GiB"
                  + (f", guidance {r['guidance_bits_per_element']:.3f} bit/el {r['guidance_bytes_per_token']:.0f} B/tok"
                     if "guidance_bytes" in r else "")
                  + (f", refit {r['refit_s_per_gb']:.4f} s/GB (kernels {r['refit_kernel_s_per_gb']:.4f})"
                     if "refit_s_per_gb" in r else ""), flush=True)
    long_rows = []
    for output_len in [int(x) for x in args.long_outputs.split(",") if x]:
        for arm in args.long_arms.split(","):
            mode, capture = arm.split(":")
            if args.time_budget and time.perf_counter() - start > args.time_budget:
                skipped.append(f"long {arm}@{output_len}")
                continue
            r = run_long(model, args, mode, capture, output_len, device)
            long_rows.append(r)
            save(args, rows, long_rows, [], skipped, start)
            pts = ", ".join(f"L={p['context_len']}: {p['step_ms']:.2f} ms" for p in r["points"])
            print(f"long output {output_len:6d} {mode:5s} {capture:7s} batch {r['batch']:4d}: {pts}; "
                  f"whole generation {r['generation_decode_tokens_per_s']:9.0f} tok/s "
                  f"(~{r['generation_decode_s_estimate']:.0f} s of decode)", flush=True)
    ab_rows = []
    for item in [x for x in args.capture_ab.split(",") if x]:
        batch, context = (int(v) for v in item.split(":"))
        r = capture_ab_decode(model, args, batch, context, device)
        ab_rows.append({"kind": "decode", **r})
        save(args, rows, long_rows, [], skipped, start, ab_rows)
        print(f"capture A/B decode batch {batch} context {context}: {r['step_ms_off']:.3f} -> {r['step_ms_compact']:.3f} ms "
              f"per step, cost {100 * r['capture_cost']:.1f}% (per round: median {100 * r['round_cost_median']:.1f}%, "
              f"{100 * r['round_cost_min']:.1f}% .. {100 * r['round_cost_max']:.1f}%)", flush=True)
    for item in [x for x in args.capture_ab_generate.split(",") if x]:
        batch, prompt, new = (int(v) for v in item.split(":"))
        r = capture_ab_generate(model, args, batch, prompt, new, device)
        ab_rows.append({"kind": "generate", **r})
        save(args, rows, long_rows, [], skipped, start, ab_rows)
        o = r["off"]
        for a in [x for x in r["arms"] if x != "off"]:
            c, k = r[a], r["costs"][a]
            print(f"capture A/B generate batch {batch} prompt {prompt} new {new}, {a}: decode {o['decode_s']:.3f} -> "
                  f"{c['decode_s']:.3f} s ({100 * k['decode']:+.1f}%), prefill {o['prefill_s']:.3f} -> {c['prefill_s']:.3f} s "
                  f"({100 * k['prefill']:+.1f}%), wall {o['wall_s']:.3f} -> {c['wall_s']:.3f} s ({100 * k['wall']:+.1f}%; "
                  f"finalize and host work {o['rest_s']:.3f} -> {c['rest_s']:.3f} s, finalize {c['finalize_s']:.3f} s, "
                  f"capture host calls {c['capture_host_s']:.3f} s); median step {o['step_ms_median']:.3f} -> "
                  f"{c['step_ms_median']:.3f} ms ({100 * k['decode_step_median']:+.1f}%), first {DRAIN_STEPS} steps "
                  f"{o['first_steps_ms_mean']:.3f} -> {c['first_steps_ms_mean']:.3f} ms, later "
                  f"{o['later_steps_ms_mean']:.3f} -> {c['later_steps_ms_mean']:.3f} ms", flush=True)
    summary = summarize(rows) + summarize_long(long_rows)
    print("\n".join(summary))
    if skipped:
        print(f"skipped (time budget): {', '.join(skipped)}")
    return save(args, rows, long_rows, summary, skipped, start, ab_rows)


def save(args, rows, long_rows, summary, skipped, start, ab_rows=()) -> dict:
    """The JSON report (also written after every arm, so a run cut short keeps what it measured)."""
    device = torch.device(args.device)
    result = {
        "benchmark": "bench_rollout",
        "device": torch.cuda.get_device_name(device),
        "date": utc_now(),
        "commit": git_commit(),
        "command": " ".join(["python", *sys.argv]),
        "torch": torch.__version__,
        "preset": args.preset, "dtype": "bfloat16",
        "args": {k: v for k, v in vars(args).items()},
        "results": rows, "long_outputs": long_rows, "capture_ab": list(ab_rows), "summary": summary, "skipped": skipped,
        "total_s": time.perf_counter() - start,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
