"""Bandwidth of the three memory-bound kernels against a device-to-device copy in the same run.

    python profiling/bench_memory_kernels.py --out profiling/results/memory_kernels_h200.json

For each size (input bytes, 1 MB .. 1 GB): BF16 x [rows, 2048] for quantize (plain, and with
guidance bits + BF16 operand) and guided_fake_quantize (compact, full guidance); expert weights
[E, 1536, 2048] for refit_weights. Bandwidth = (bytes read once + bytes written once) / time;
time = median over CUDA-graph replays of calls rotating over fresh input sets (working set >= 4x
L2), so neither host overhead nor L2 reuse flatters a kernel. Copy = torch copy_ of the same input
bytes (read + write counted). Target: >= 85% of the copy bandwidth at >= 64 MB.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

import torch

from trace_kernels import nvfp4, ops
from trace_kernels.testing.bench import host_overhead_us, time_graph, variants_for

D = 2048
REFIT_N, REFIT_K = 1536, 2048
MB = 1 << 20
SWEEP_SIZES = (256 * MB,)


def commit() -> str:
    explicit = os.environ.get("TRACE_KERNELS_BENCH_COMMIT")
    if explicit:
        return explicit
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown (working tree without git metadata)"


def bench_size(size: int, l2: int) -> list[dict]:
    rows = max(1, size // (2 * D))
    elems = rows * D
    sets = variants_for(elems * 2, l2)
    xs = [torch.randn(rows, D, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    results = []

    def record(name, ms, bytes_moved, extra=None):
        results.append({"kernel": name, "input_mb": size / MB, "ms": ms, "bytes": bytes_moved,
                        "tb_per_s": bytes_moved / ms / 1e9, **(extra or {})})

    dst = torch.empty_like(xs[0])
    record("copy", time_graph(lambda i: dst.copy_(xs[i]), sets), 2 * elems * 2)
    del dst

    q_bytes = elems * 2 + elems // 2 + elems // 16 + rows * 4
    record("quantize", time_graph(lambda i: ops.quantize(xs[i]), sets), q_bytes,
           {"host_us": host_overhead_us(lambda: ops.quantize(xs[0]))})
    record("quantize+guidance+bf16", time_graph(lambda i: ops.quantize(xs[i], guidance=True, dequant=True), sets),
           q_bytes + elems // 8 + elems * 2)

    compact = [ops.quantize(x, guidance=True).guidance() for x in xs]
    full = [nvfp4.make_guidance(ops.quantize(x).q, "full") for x in xs]
    trainer = [x * (1 + 1e-2 * torch.randn_like(x)) for x in xs]
    g_common = elems * 2 + elems // 16 + rows * 4 + elems * 2 + 32  # x, block scales, row scales, out, counters
    record("guided_fake_quantize compact",
           time_graph(lambda i: ops.guided_fake_quantize(trainer[i], compact[i], return_counters=True), sets),
           g_common + elems // 8)
    record("guided_fake_quantize full",
           time_graph(lambda i: ops.guided_fake_quantize(trainer[i], full[i], return_counters=True), sets),
           g_common + elems // 2)
    del compact, full, trainer, xs

    n = REFIT_N if size >= REFIT_N * REFIT_K * 2 else max(1, size // (2 * REFIT_K))
    experts = max(1, size // (2 * n * REFIT_K))
    w_sets = variants_for(experts * n * REFIT_K * 2, l2)
    ws = [torch.randn(experts, n, REFIT_K, device="cuda", dtype=torch.bfloat16) for _ in range(w_sets)]
    buffers = ops.allocate_refit_buffers(experts, n, REFIT_K, "cuda")
    relems = experts * n * REFIT_K
    record("refit_weights", time_graph(lambda i: ops.refit_weights(ws[i], buffers), w_sets),
           relems * 2 + relems // 2 + relems // 16 + experts * 4,
           {"experts": experts, "n": n, "k": REFIT_K, "host_us": host_overhead_us(lambda: ops.refit_weights(ws[0], buffers))})
    if size in SWEEP_SIZES:  # how many experts to refit at once (groups); the default plan is "auto"
        import importlib
        from trace_kernels.codegen.ops import refit_weights as refit_codegen
        from trace_kernels.runtime import driver, kernel_for
        refit = importlib.import_module("trace_kernels.ops.refit_weights")
        spec = refit_codegen.spec("bf16")
        resident = kernel_for(spec).max_active_blocks_per_sm(0, spec.launch["threads"]) * driver.multiprocessor_count(0)
        for groups in (1, 2, 4, 8, 16):
            if groups > experts:
                break
            refit.PLAN_OVERRIDE = (groups * (resident // groups), resident // groups)
            try:
                record(f"refit_weights groups={groups}", time_graph(lambda i: ops.refit_weights(ws[i], buffers), w_sets),
                       relems * 2 + relems // 2 + relems // 16 + experts * 4, {"experts": experts, "n": n, "k": REFIT_K})
            finally:
                refit.PLAN_OVERRIDE = None
    del ws, buffers
    torch.cuda.empty_cache()
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", default="1,4,16,64,256,1024")
    parser.add_argument("--out", default="profiling/results/memory_kernels_h200.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    results = []
    for size_mb in (int(s) for s in args.sizes_mb.split(",")):
        results += bench_size(size_mb * MB, props.L2_cache_size)
    ops.raise_on_nonfinite()
    copy_at = {r["input_mb"]: r["tb_per_s"] for r in results if r["kernel"] == "copy"}
    results = [r for r in results if r["kernel"]]
    peak_copy = max(copy_at.values())
    for r in results:
        r["fraction_of_copy"] = r["tb_per_s"] / copy_at[r["input_mb"]]
        r["fraction_of_peak_copy"] = r["tb_per_s"] / peak_copy
    report = {
        "gpu": props.name, "sms": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit(), "torch": torch.__version__,
        "command": "python profiling/bench_memory_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "method": "median ms per call over CUDA-graph replays rotating fresh input sets; bytes = read once + write once",
        "target": ">= 0.85 of same-size copy bandwidth at >= 64 MB",
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{'kernel':32s} {'MB':>6s} {'ms':>9s} {'TB/s':>6s} {'copy%':>6s} {'peak%':>6s}")
    for r in results:
        print(f"{r['kernel']:32s} {r['input_mb']:6.0f} {r['ms']:9.4f} {r['tb_per_s']:6.2f} "
              f"{100 * r['fraction_of_copy']:5.1f}% {100 * r['fraction_of_peak_copy']:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
