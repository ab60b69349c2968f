"""Every kernel and engine benchmark of the project in one process, against the card's ceilings.

    python profiling/bench.py --quick --out runs/bench/bench_h200_quick.json     # < 6 min on an H200
    python profiling/bench.py --out profiling/results/bench_h200.json            # the full matrix
    python profiling/bench.py --from-json profiling/results --plots-dir runs/plots   # no GPU needed

First the two ceilings, measured in this run: copy bandwidth = an SM copy kernel (bitwise_not over
int16, read + write bytes) on 1 GiB buffers, the roofline of every memory-bound result (a
graph-captured copy_ of that size is a memcpy node that runs ~35% slower on the H200; it is recorded
too), and the BF16 matmul rate = torch.matmul 8192^3 on fresh random data. Then the benchmark
modules' own functions (bench_memory_kernels.bench_size, bench_moe_gemm.bench_shape,
bench_attention.bench_paged/bench_sdpa/bench_append, bench_sampling.bench_case, bench_rollout.main): same methods as their own
scripts (CUDA-graph replays or L2-flushed events, medians, rotating fresh random inputs larger than
L2). Every row is reported against its BF16 baseline (memory kernels: the same-size torch copy_;
MoE: torch._grouped_mm; attention: SDPA over a contiguous BF16 cache; sampling: the torch sampler;
rollout: the BF16 engine) and
against the roofline (profiling/plots.py). Writes one JSON (GPU, date, commit, command, raw module
results, unified report), PNG plots and a markdown table next to it; prints the table last.
--time-budget skips the remaining sections once spent (listed in the JSON's "skipped") and bounds the
rollout section's arms; the JSON is rewritten after every section, so a run cut short keeps its results.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the bench modules beside this file
import plots  # noqa: E402

from trace_kernels.testing.provenance import git_commit, utc_now  # noqa: E402

MB = 1 << 20
QUICK = {"memory_sizes_mb": (16, 256), "moe_shapes": ("qwen3-30b-a3b",), "moe_tokens": (1, 8, 64, 256, 1024, 16384),
         "moe_variants": ("auto",), "moe_reps": 10,
         "attention_cases": ((8, 4096), (8, 16384), (8, 32768), (32, 32768)),
         "append_tokens": 65536, "sampling_batches": (512,),
         "rollout_argv": ["--quick", "--arms", "bf16:off:graphs,nvfp4:off:graphs,nvfp4:compact:graphs",
                          "--refit-iters", "1", "--time-budget", "100"]}
FULL = {"memory_sizes_mb": (1, 4, 16, 64, 256, 1024), "moe_shapes": ("qwen3-30b-a3b", "qwen3-235b-a22b"),
        "moe_tokens": (1, 8, 32, 64, 128, 256, 1024, 4096, 16384), "moe_variants": ("auto", "v1", "ws"),
        "moe_reps": 20,
        "attention_cases": ((8, 4096), (8, 8192), (8, 16384), (8, 32768), (8, 65536), (8, 131072), (4, 131072),
                            (32, 32768)),
        "append_tokens": 262144, "sampling_batches": (64, 256, 512), "rollout_argv": ["--prompt-lens", "1024,4096", "--output-len", "1024"]}


def measure_roofline() -> dict:
    """SM-kernel copy and graph copy_ of 1 GiB (two rotating pairs), BF16 matmul 8192^3 (two fresh sets)."""
    import torch
    from trace_kernels.testing.bench import time_graph
    elems = (1 << 30) // 2
    src = [torch.randint(-2**15, 2**15, (elems,), device="cuda", dtype=torch.int16) for _ in range(2)]
    dst = [torch.empty_like(s) for s in src]
    sm_ms = time_graph(lambda j: torch.bitwise_not(src[j], out=dst[j]), 2)
    graph_ms = time_graph(lambda j: dst[j].copy_(src[j]), 2)
    src = dst = None  # free the 4 GiB before the matmul
    n = 8192
    a = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    b = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    mm_ms = time_graph(lambda j: torch.matmul(a[j], b[j], out=c), 2, replays=10)
    a = b = c = None
    torch.cuda.empty_cache()
    copied = 2 * elems * 2
    return {"sm_copy_bytes_per_s": copied / (sm_ms * 1e-3), "graph_copy_bytes_per_s": copied / (graph_ms * 1e-3),
            "copy_bytes": copied, "bf16_tflops": 2 * n ** 3 / (mm_ms * 1e-3) / 1e12, "matmul": f"bf16 {n}^3",
            "source": "measured in this run (SM copy = bitwise_not over int16, read + write bytes)"}


def run_memory(cfg: dict, l2: int) -> dict:
    import bench_memory_kernels as bmk
    args = bmk.parse_args(["--no-host-overhead"])  # the script's defaults, without its eager host timings
    rows = []
    for size_mb in cfg["memory_sizes_mb"]:
        rows += bmk.bench_size(size_mb * MB, l2, args)
    return {"results": rows, "copy_study": [], "command_equivalent": "bench_memory_kernels.bench_size per size"}


def run_moe(cfg: dict, bw: float) -> dict:
    import torch
    import bench_moe_gemm as bmg
    from trace_kernels import shapes
    timer = bmg.Timer(cfg["moe_reps"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for name in cfg["moe_shapes"]:
        rows += bmg.bench_shape(shapes.resolve(name), list(cfg["moe_tokens"]), timer, bw, gen, False,
                                list(cfg["moe_variants"]))
        torch.cuda.empty_cache()
    return {"results": rows, "copy_bandwidth_bytes_per_s": bw}


def run_attention(cfg: dict, bw: float, l2: int) -> dict:
    """Paged decode with the default kernel of each page format (attention.DEFAULT_*_VARIANT), SDPA over a
    contiguous BF16 cache, and kv_append."""
    import bench_attention as bat
    from trace_kernels import attention
    decode = []
    for batch, length in cfg["attention_cases"]:
        row = {"batch": batch, "length": length}
        for name, timed in (("nvfp4", lambda: bat.bench_paged("nvfp4", batch, length, l2,
                                                             variant=attention.default_variant(
                                                                 "nvfp4", bat.HQ, bat.HKV, bat.D, bat.P))),
                            ("bf16", lambda: bat.bench_paged("bf16", batch, length, l2,
                                                            variant=attention.DEFAULT_BF16_VARIANT)),
                            ("sdpa_bf16", lambda: bat.bench_sdpa(batch, length, l2))):
            row[name] = timed()
            row[name]["roofline_ms"] = row[name]["bytes"] / bw * 1e3
        times = ", ".join(f"{k} {row[k]['ms']:.4f} ms" for k in plots.ATTENTION_KERNELS if k in row)
        print(f"attention B={batch} L={length}: {times}", flush=True)
        decode.append(row)
    append = [bat.bench_append(fmt, cfg["append_tokens"], g, l2) for fmt, g in (("nvfp4", False), ("nvfp4", True),
                                                                               ("bf16", False))]
    return {"decode": decode, "kv_append": append, "shape": {"hq": bat.HQ, "hkv": bat.HKV, "d": bat.D, "page": bat.P}}


def run_sampling(cfg: dict, l2: int) -> dict:
    """The rollout sampler's plain path at Qwen3's vocabulary: torch path vs the fused kernel."""
    import bench_sampling as bsa
    from trace_rl.engine import SamplingParams
    rows = []
    for batch in cfg["sampling_batches"]:
        rows += bsa.bench_case(batch, 151936, 1.0, SamplingParams(temperature=1.0), l2, replays=30)
    return {"results": rows, "command_equivalent": "bench_sampling.bench_case per batch, randn logits"}


def run_rollout(cfg: dict, seconds_left: float | None) -> dict:
    """bench_rollout.main; with a time budget, its arms stop where the budget ends."""
    import bench_rollout as bro
    argv = list(cfg["rollout_argv"])
    if seconds_left is not None:
        if "--time-budget" in argv:
            i = argv.index("--time-budget")
            argv[i + 1] = str(min(float(argv[i + 1]), seconds_left))
        else:
            argv += ["--time-budget", str(seconds_left)]
    return bro.main(argv)


def redraw(source: Path, plots_dir: Path) -> int:
    raw, meta = plots.load_results(source)
    report = {**meta, **plots.unify(raw, meta["roofline"])}
    files = plots.draw(report, plots_dir)
    lines = plots.table(report)
    (plots_dir / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("wrote " + ", ".join(str(f) for f in [*files, plots_dir / "table.md"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short version of every section (< 6 min on an H200)")
    p.add_argument("--sections", default="memory,moe,attention,sampling,rollout")
    p.add_argument("--time-budget", type=float, default=0.0, help="seconds; skip later sections once spent (0: none)")
    p.add_argument("--out", default="runs/bench/bench.json")
    p.add_argument("--plots-dir", default=None, help="PNG plots + table.md (default: the JSON's folder)")
    p.add_argument("--from-json", default=None,
                   help="redraw plots + table from a bench.py JSON or a folder of the modules' JSON (no GPU)")
    args = p.parse_args(argv)
    if args.from_json:
        return redraw(Path(args.from_json), Path(args.plots_dir or "runs/plots"))

    import torch
    if not torch.cuda.is_available():
        print("bench.py measures a GPU: no CUDA device (use --from-json to redraw committed results)", file=sys.stderr)
        return 2
    cfg = QUICK if args.quick else FULL
    props = torch.cuda.get_device_properties(0)
    start = time.perf_counter()
    roofline = measure_roofline()
    print(f"{props.name}: SM copy {roofline['sm_copy_bytes_per_s'] / 1e12:.2f} TB/s (graph copy_ "
          f"{roofline['graph_copy_bytes_per_s'] / 1e12:.2f}), BF16 matmul {roofline['bf16_tflops']:.0f} TFLOP/s",
          flush=True)
    bw = roofline["sm_copy_bytes_per_s"]
    def seconds_left() -> float | None:
        return max(1.0, args.time_budget - (time.perf_counter() - start)) if args.time_budget else None

    runners = {"memory": lambda: run_memory(cfg, props.L2_cache_size), "moe": lambda: run_moe(cfg, bw),
               "attention": lambda: run_attention(cfg, bw, props.L2_cache_size),
               "sampling": lambda: run_sampling(cfg, props.L2_cache_size),
               "rollout": lambda: run_rollout(cfg, seconds_left())}
    raw, seconds, skipped, errors = {}, {}, [], {}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> dict:  # after every section: a run cut short keeps what it measured
        report = {"gpu": props.name, "sms": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
                  "date": utc_now(), "commit": git_commit(), "torch": torch.__version__,
                  "command": "python profiling/bench.py " + " ".join(argv), "quick": args.quick, "config": cfg,
                  "roofline": roofline, "seconds": seconds, "skipped": skipped, "errors": errors,
                  "total_s": time.perf_counter() - start, "raw": raw}
        report.update(plots.unify(raw, roofline))
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(out)
        return report

    for section in [s for s in args.sections.split(",") if s]:
        if args.time_budget and time.perf_counter() - start > args.time_budget:
            skipped.append(section)
            continue
        t0 = time.perf_counter()
        try:
            raw[section] = runners[section]()
        except Exception as exc:  # report it, keep the other sections
            errors[section] = f"{type(exc).__name__}: {exc}"[:500]
            print(f"{section} failed: {errors[section]}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        seconds[section] = time.perf_counter() - t0
        print(f"== {section} done in {seconds[section]:.0f} s", flush=True)
        save()
    report = save()
    plots_dir = Path(args.plots_dir) if args.plots_dir else out.parent
    files = plots.draw(report, plots_dir)
    lines = plots.table(report)
    (plots_dir / "table.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out}, " + ", ".join(f.name for f in files) + ", table.md")
    if skipped or errors:
        print(f"skipped: {skipped}; errors: {errors}")
    print("\n".join(lines))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
