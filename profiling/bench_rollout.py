"""Rollout throughput: decode tokens/s BF16 vs NVFP4, guidance capture on/off, refit s/GB.

    python profiling/bench_rollout.py --preset bench --prompt-len 1024 --output-len 1024 \
        --batch 64 --out profiling/results/bench_rollout.json

Every generation uses ignore_eos, so each sequence decodes exactly --output-len tokens. Decode
tokens/s = tokens sampled in decode steps / wall time of the decode steps (host time around each
step, which includes the per-step token sync). Refit: median over --refit-iters of
``engine.refit(model)`` (device-synchronised), divided by the BF16 routed-expert bytes.
The NVFP4 mode currently runs the ``trace_kernels.nvfp4`` reference (fake-quantized BF16 experts,
NVFP4 KV pages dequantized by torch ops) until the fused kernels land, so it measures the
reference, not the target speed. Writes JSON with the GPU, date, commit and command.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from trace_rl.engine import EngineConfig, RolloutEngine, SamplingParams
from trace_rl.model import MoEForCausalLM


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_arm(model, args, mode: str, capture: str, device) -> dict:
    cfg = EngineConfig(block_size=args.block_size, max_num_seqs=args.batch,
                       max_model_len=args.prompt_len + args.output_len,
                       max_num_batched_tokens=max(args.max_batched_tokens, args.prompt_len),
                       cuda_graphs=not args.no_graphs)
    engine = RolloutEngine(model, cfg, mode=mode, capture=capture, device=device)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (args.prompt_len,), generator=gen).tolist()
               for _ in range(args.batch)]
    sp = SamplingParams(temperature=1.0, max_new_tokens=args.output_len, ignore_eos=True)
    engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, ignore_eos=True), seed=0)  # warm-up
    batch = engine.generate(prompts, sp, group_size=1, seed=args.seed)
    st = batch.stats
    row = {"mode": mode, "capture": capture, "batch": args.batch, "prompt_len": args.prompt_len,
           "output_len": args.output_len,
           "prefill_tokens_per_s": st["prefill_tokens"] / st["prefill_s"],
           "decode_tokens_per_s": st["decode_tokens"] / st["decode_s"],
           "decode_step_ms": 1e3 * st["decode_s"] / max(st["decode_steps"], 1),
           "kv_cache_bytes": engine.cache.nbytes(),
           "cuda_graphs": engine.runner.use_graphs}
    if "guidance" in st:
        g = st["guidance"]
        row.update(guidance_bytes=g["guidance_bytes"], guidance_bits_per_element=g["bits_per_element"],
                   guidance_bytes_per_token=g["bytes_per_token"])
    if mode == "nvfp4" and capture == "off":
        times = [engine.refit(model) for _ in range(args.refit_iters)]
        gb = engine.expert_bytes() / 1e9
        row.update(refit_s_median=statistics.median(times), expert_gb=gb,
                   refit_s_per_gb=statistics.median(times) / gb)
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bench")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=16384, help="prompt tokens per prefill step")
    p.add_argument("--arms", default="bf16:off,nvfp4:off,nvfp4:compact",
                   help="comma-separated mode:capture pairs")
    p.add_argument("--refit-iters", type=int, default=5)
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON output path")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    from trace_rl.config import load_preset
    with torch.device(device):
        model = MoEForCausalLM(load_preset(args.preset)).to(dtype)
    model.init_weights(seed=args.seed)
    rows = []
    for arm in args.arms.split(","):
        mode, capture = arm.split(":")
        rows.append(run_arm(model, args, mode, capture, device))
        r = rows[-1]
        print(f"{mode:6s} capture={capture:8s} decode {r['decode_tokens_per_s']:10.1f} tok/s "
              f"({r['decode_step_ms']:.2f} ms/step)  prefill {r['prefill_tokens_per_s']:10.1f} tok/s"
              + (f"  guidance {r['guidance_bits_per_element']:.3f} bit/el "
                 f"{r['guidance_bytes_per_token']:.0f} B/tok" if "guidance_bytes" in r else "")
              + (f"  refit {r['refit_s_per_gb']:.4f} s/GB" if "refit_s_per_gb" in r else ""))
    base = {(r["mode"], r["capture"]): r["decode_tokens_per_s"] for r in rows}
    if ("nvfp4", "off") in base and ("nvfp4", "compact") in base:
        slow = 1 - base[("nvfp4", "compact")] / base[("nvfp4", "off")]
        print(f"guidance capture slowdown: {100 * slow:.1f}%")
    result = {
        "benchmark": "bench_rollout",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        "torch": torch.__version__,
        "preset": args.preset, "dtype": args.dtype,
        "results": rows,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
