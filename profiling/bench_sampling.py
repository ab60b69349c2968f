"""The rollout sampler's plain path (T > 0, no top-k / top-p): torch ops vs the fused kernel.

    python profiling/bench_sampling.py --out profiling/results/sampling_h200.json

For each batch B (default 64, 256, 512) at V = 151936 (Qwen3's vocabulary), BF16 logits [B, V]:
  torch  = trace_rl.engine.sampler.sample with TRACE_KERNELS_SAMPLER=torch (the reference:
           ~25 elementwise ops over [B, V] int64 / FP32 temporaries), eager, CUDA events;
  kernel = the same call with the kernel (trace_kernels.ops.gumbel_max_sample), timed over
           CUDA-graph replays (device time) and eagerly (what the engine pays per step, host
           launch overhead included);
  copy   = torch copy_ of the logits (read + write), the memory system's reference.
Every timing is the median over many calls rotating over fresh input sets whose total is >= 4x L2.
TB/s = logits bytes (read once) / time. Two logit distributions: randn (sigma 1: no id can be
skipped, the kernel's worst case) and randn * 8 (most ids are too far below the row's max to win,
so the kernel hashes noise for few of them). The tokens of both paths are checked equal once per
case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch

from trace_kernels.testing.bench import time_eager, time_graph, variants_for
from trace_kernels.testing.provenance import git_commit, utc_now
from trace_rl.engine import SamplingParams, sampler


@contextlib.contextmanager
def sampler_choice(choice: str):
    saved = os.environ.get(sampler.SAMPLER_ENV)
    os.environ[sampler.SAMPLER_ENV] = choice
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(sampler.SAMPLER_ENV)
        else:
            os.environ[sampler.SAMPLER_ENV] = saved


def bench_case(batch: int, vocab: int, scale: float, params: SamplingParams, l2: int, replays: int) -> list[dict]:
    logit_bytes = batch * vocab * 2
    sets = variants_for(logit_bytes, l2)
    logits = [(torch.randn(batch, vocab, device="cuda") * scale).bfloat16() for _ in range(sets)]  # [B, V] each
    keys = torch.randint(-2**63, 2**63 - 1, (batch,), device="cuda", dtype=torch.int64)
    positions = torch.randint(0, 4096, (batch,), device="cuda", dtype=torch.int64)
    case = {"batch": batch, "vocab": vocab, "logits": f"randn*{scale:g}", "temperature": params.temperature,
            "logit_bytes": logit_bytes, "input_sets": sets}
    rows = []

    def record(path, ms, moved_bytes=logit_bytes, **extra):
        rows.append({**case, "path": path, "ms": ms, "tb_per_s": moved_bytes / ms / 1e9, **extra})

    def draw(i):
        return sampler.sample(logits[i], params, 1, keys, positions)

    dst = torch.empty_like(logits[0])
    record("copy", time_graph(lambda i: dst.copy_(logits[i]), sets, replays=replays), 2 * logit_bytes)
    with sampler_choice("torch"):
        torch_tokens = draw(0)[0]
        record("torch", time_eager(draw, sets, replays=replays))
    torch.cuda.empty_cache()
    with sampler_choice("auto"):
        if not sampler.use_kernel(logits[0], params):
            raise RuntimeError("the sampling kernel does not run here (no sm_90 GPU, cuda-python or nvcc?)")
        equal = bool(torch.equal(draw(0)[0], torch_tokens))
        record("kernel (graph)", time_graph(draw, sets, replays=replays), tokens_equal_torch=equal)
        record("kernel (eager)", time_eager(draw, sets, replays=replays), tokens_equal_torch=equal)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="64,256,512")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--scales", default="1,8", help="logits = randn * scale (comma separated)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--out", default="profiling/results/sampling_h200.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    params = SamplingParams(temperature=args.temperature)
    results = []
    for scale in (float(s) for s in args.scales.split(",")):
        for batch in (int(b) for b in args.batches.split(",")):
            results += bench_case(batch, args.vocab, scale, params, props.L2_cache_size, args.replays)
            torch.cuda.empty_cache()  # the case's logit sets and the torch path's temporaries
    report = {
        "gpu": props.name, "sms": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
        "date": utc_now(),
        "commit": git_commit(), "torch": torch.__version__,
        "command": "python profiling/bench_sampling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "method": "median ms per call rotating fresh BF16 logit sets (>= 4x L2); torch and kernel (eager): CUDA "
                  "events around each call; kernel (graph) and copy: CUDA-graph replays; TB/s = logits bytes "
                  "(copy: read + write) / time",
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{'logits':9s} {'B':>4s} {'path':15s} {'ms':>9s} {'TB/s':>6s} {'x torch':>8s}")
    torch_ms = {(r["logits"], r["batch"]): r["ms"] for r in results if r["path"] == "torch"}
    for r in results:
        speedup = torch_ms[(r["logits"], r["batch"])] / r["ms"]
        check = "" if "tokens_equal_torch" not in r else ("  tokens == torch" if r["tokens_equal_torch"]
                                                          else "  TOKENS DIFFER FROM TORCH")
        print(f"{r['logits']:9s} {r['batch']:4d} {r['path']:15s} {r['ms']:9.4f} {r['tb_per_s']:6.2f} "
              f"{speedup:8.1f}{check}")
    return 0 if all(r.get("tokens_equal_torch", True) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
