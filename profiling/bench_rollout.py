"""Rollout throughput (issue 6): decode tokens/s BF16 vs NVFP4, guidance capture on/off, CUDA graphs
on/off, the largest batch per mode that fits, refit seconds per GB of BF16 expert weights.

    python profiling/bench_rollout.py --quick --out profiling/results/rollout_h200_quick.json
    python profiling/bench_rollout.py --preset bench --prompt-lens 1024,4096,8192 --output-len 32768 \\
        --batch auto --out profiling/results/rollout_h200.json

One arm = (mode, capture, graphs) at one prompt length. Each arm builds an engine (nvfp4 runs the
``kernels`` backend on an H200 with a BF16 model: packed NVFP4 experts, fused MoE GEMMs, guidance
from the kernels' outputs), warms up (JIT builds, graph capture of the batch's bucket), then
generates ``batch`` random prompts with ignore_eos, so every sequence decodes exactly
--output-len tokens and the batch stays full. Decode tokens/s = tokens sampled in decode steps /
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
Writes JSON with the GPU, date, commit, command, torch version and every arm; prints a table.
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


def auto_batch(model, args, mode: str, prompt_len: int, kv_kernels: bool, device) -> int:
    """Largest power of two <= --max-batch whose memory fits --mem-fraction of free memory: the
    engine's weight copy (+ packed NVFP4 experts), the prefill chunk's reference attention, and per
    sequence its KV pages, the sampler's [V] temporaries and (without the decode kernels) the
    reference decode attention's working set over max_model_len keys."""
    c = model.config
    max_len = prompt_len + args.output_len
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
    # warm-up with the same batch size: JIT builds, autotuning and the graph of this bucket
    engine.generate(prompts, SamplingParams(max_new_tokens=3, ignore_eos=True), seed=1)
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.output_len, ignore_eos=True)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    out = engine.generate(prompts, sp, group_size=1, seed=args.seed)
    wall = time.perf_counter() - t0
    st = out.stats
    row = {"mode": mode, "capture": capture, "graphs": graphs, "backend": engine.backend,
           "kv_kernels": engine.kv_kernels,
           "cuda_graphs_used": engine.runner.use_graphs, "batch": batch, "prompt_len": prompt_len,
           "output_len": args.output_len, "wall_s": wall,
           "prefill_tokens_per_s": st["prefill_tokens"] / st["prefill_s"],
           "decode_tokens_per_s": st["decode_tokens"] / st["decode_s"],
           "decode_step_ms": 1e3 * st["decode_s"] / max(st["decode_steps"], 1),
           "decode_steps": st["decode_steps"],
           "kv_cache_bytes": engine.cache.nbytes(),
           "peak_memory_bytes": torch.cuda.max_memory_allocated(device)}
    row["sampling_ms"] = sampling_ms(batch, model.config.vocab_size, device)
    if "guidance" in st:
        g = st["guidance"]
        row.update(guidance_bytes=g["guidance_bytes"], guidance_bits_per_element=g["bits_per_element"],
                   guidance_bytes_per_token=g["bytes_per_token"])
    if mode == "nvfp4" and capture == "off" and args.refit_iters:
        times, kernel = [], []
        for _ in range(args.refit_iters):
            times.append(engine.refit(model))
            kernel.append(engine.last_refit.get("quantize_seconds", float("nan")))
        gb = engine.expert_bytes() / 1e9
        row.update(refit_s_median=statistics.median(times), refit_kernel_s_median=statistics.median(kernel),
                   expert_gb=gb, refit_s_per_gb=statistics.median(times) / gb,
                   refit_kernel_s_per_gb=statistics.median(kernel) / gb)
    del engine, out
    gc.collect()
    torch.cuda.empty_cache()
    return row


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
            gc.collect()
            torch.cuda.empty_cache()
            if batch == 1:
                raise
            batch //= 2
            retries += 1


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
            lines.append(f"prompt {p}: guidance capture costs {100 * (1 - fpc / fp):.1f}% of nvfp4 decode tokens/s")
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
    p.add_argument("--time-budget", type=float, default=0.0, help="seconds; skip arms once spent (0: none)")
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
    for prompt_len in [int(x) for x in args.prompt_lens.split(",")]:
        for arm in args.arms.split(","):
            mode, capture, graphs, *rest = arm.split(":")
            if args.time_budget and time.perf_counter() - start > args.time_budget:
                skipped.append(f"{arm}@{prompt_len}")
                continue
            r = run_fitting(model, args, mode, capture, graphs == "graphs", prompt_len, device,
                            kv_kernels="nokv" not in rest)
            rows.append(r)
            kv = "kv-kernels" if r["kv_kernels"] else "torch-attn"
            print(f"prompt {prompt_len:5d} {mode:5s} {capture:7s} {graphs:6s} [{r['backend']}, {kv}] batch {r['batch']:4d}: "
                  f"decode {r['decode_tokens_per_s']:9.0f} tok/s ({r['decode_step_ms']:.2f} ms/step, "
                  f"sampling {r['sampling_ms']:.2f}), "
                  f"prefill {r['prefill_tokens_per_s']:9.0f} tok/s, peak {r['peak_memory_bytes'] / 2**30:.1f} GiB"
                  + (f", guidance {r['guidance_bits_per_element']:.3f} bit/el {r['guidance_bytes_per_token']:.0f} B/tok"
                     if "guidance_bytes" in r else "")
                  + (f", refit {r['refit_s_per_gb']:.4f} s/GB (kernels {r['refit_kernel_s_per_gb']:.4f})"
                     if "refit_s_per_gb" in r else ""), flush=True)
    summary = summarize(rows)
    print("\n".join(summary))
    if skipped:
        print(f"skipped (time budget): {', '.join(skipped)}")
    result = {
        "benchmark": "bench_rollout",
        "device": torch.cuda.get_device_name(device),
        "date": utc_now(),
        "commit": git_commit(),
        "command": " ".join(["python", *sys.argv]),
        "torch": torch.__version__,
        "preset": args.preset, "dtype": "bfloat16",
        "args": {k: v for k, v in vars(args).items()},
        "results": rows, "summary": summary, "skipped": skipped,
        "total_s": time.perf_counter() - start,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
