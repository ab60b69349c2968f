"""Where extend_attention's time goes beyond SDPA's (one case; prints a table and writes JSON).

    python profiling/extend_breakdown.py --out runs/extend_breakdown.json

Times, eagerly with CUDA events (median of 10), extend_attention over NVFP4 pages and SDPA over a contiguous
BF16 cache with the mask variants in between: the batch's own mask [B, 1, Tq, S] instead of one broadcast mask,
K/V as strided [B, S, Hkv, D] views as extend passes them, q as a strided view; and prints torch.profiler's
CUDA kernel table of extend_attention and of the baseline.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

import bench_attention as ba
from trace_kernels import attention
from trace_kernels.kv_gather import kv_gather
from trace_kernels.testing.bench import time_eager
from trace_kernels.testing.provenance import git_commit, utc_now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/extend_breakdown.json")
    parser.add_argument("--case", default="4,8192,1024", help="B,context,new tokens")
    args = parser.parse_args()
    b, ctx, new = (int(x) for x in args.case.split(","))
    s = ba.make_set("nvfp4", b, ctx, torch.Generator().manual_seed(1))
    q = torch.randn(b, new, ba.HQ, ba.D, dtype=torch.bfloat16, device="cuda")  # [B, Tq, Hq, D]
    keys, values = kv_gather(s["k"], s["v"], s["table"], s["lengths"], check_values=False)  # [B, S, Hkv, D]
    pos = torch.arange(ctx, device="cuda")
    one = pos[None, :] <= (ctx - new + torch.arange(new, device="cuda"))[:, None]  # [Tq, S]
    per_batch = one[None].expand(b, -1, -1).contiguous()  # [B, Tq, S]
    qt, kt, vt = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)  # strided views
    qc, kc, vc = qt.contiguous(), kt.contiguous(), vt.contiguous()
    sdpa = lambda q_, k_, v_, m: F.scaled_dot_product_attention(q_, k_, v_, attn_mask=m, enable_gqa=True)  # noqa: E731
    arms = {
        "extend_attention": lambda i: attention.extend_attention(q, s["k"], s["v"], s["table"], s["lengths"],
                                                                 check_values=False),
        "kv_gather": lambda i: kv_gather(s["k"], s["v"], s["table"], s["lengths"], check_values=False),
        "sdpa_contiguous_one_mask": lambda i: sdpa(qc, kc, vc, one[None, None]),
        "sdpa_contiguous_batch_mask": lambda i: sdpa(qc, kc, vc, per_batch[:, None]),
        "sdpa_strided_kv_batch_mask": lambda i: sdpa(qc, kt, vt, per_batch[:, None]),
        "sdpa_strided_q_kv_batch_mask": lambda i: sdpa(qt, kt, vt, per_batch[:, None]),
        "sdpa_strided_q_kv_one_mask": lambda i: sdpa(qt, kt, vt, one[None, None]),
    }
    times = {name: time_eager(fn, 1, replays=10) for name, fn in arms.items()}
    for name, ms in times.items():
        print(f"{name:32s} {ms:.3f} ms")
    tables = {}
    for name in ("extend_attention", "sdpa_contiguous_one_mask"):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                arms[name](0)
            torch.cuda.synchronize()
        tables[name] = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=90)
        print(f"\n{name} (3 calls)\n{tables[name]}")
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "date": utc_now(), "commit": git_commit(),
                   "command": f"python profiling/extend_breakdown.py --case {args.case} --out {args.out}",
                   "case": {"batch": b, "context": ctx, "new_tokens": new}, "ms": times, "profiles": tables}, f,
                  indent=1)


if __name__ == "__main__":
    main()
