"""Bandwidth of the three memory-bound kernels, every variant, against a device-to-device copy in
the same run, plus a study of the copy itself across sizes.

    python profiling/bench_memory_kernels.py --out profiling/results/memory_kernels_h200.json

For each size (input bytes, 1 MB .. 1 GB): BF16 x [rows, 2048] for quantize (plain, and with
guidance bits + BF16 operand) and guided_fake_quantize (compact and full guidance, each with and without
counters); expert weights [E, 1536, 2048] for refit_weights. Every kernel variant of
the codegen modules' VARIANTS is timed (rows "kernel [vN]").

Bandwidth = minimal bytes (every input read once, every output written once) / time; time = median
over CUDA-graph replays of calls rotating over fresh input sets (working set >= 4x L2), so neither
host overhead nor L2 reuse flatters a kernel. refit_weights v2 reads w twice (an amax pass and a
quantize pass): its rows also carry "moved_bytes" (4.56 B/element instead of 2.56) and the
bandwidth on those, but the target is judged on minimal bytes, as for every kernel.
refit_weights is timed on three kinds of input: fresh random weights (every expert's amax differs from the
previous call's); "steady" (--no-refit-steady skips it): sets that are one expert-weight tensor after different small
steps (most elements moved by about 1%, every expert's largest |w| kept), as an RL policy sync sees them from step to
step; and "mixed" (--refit-mixed FRACTION, 0 skips it): the steady sets with the amax of about that fraction of the
experts moved from one call to the next (the default config's RL loop moves 24% per step, profiling/amax_moves.py;
its rows carry the fraction measured over the rotation). Refit v8 and v9 (the default) take the previous call's
scales as a guess: fresh weights are their worst case, steady ones their usual one.
Copy = torch copy_ of the same input bytes (read + write counted). Target: >= 85% of the copy
bandwidth at >= 64 MB.

Copy study (--copy-study-mb): the copy at more sizes and by several methods, each rotating over
separate source/destination pairs: torch copy_ captured in a graph (a memcpy node), the same
eagerly (cudaMemcpyAsync), and an SM kernel that reads and writes every byte (bitwise_not on int16
views), to tell whether the slower 1 GB copy of earlier runs is the memcpy path or the memory system.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys

import torch

from trace_kernels import nvfp4, ops
from trace_kernels.codegen.ops import guided_fake_quantize as codegen_guided
from trace_kernels.codegen.ops import quantize as codegen_quantize
from trace_kernels.codegen.ops import refit_weights as codegen_refit
from trace_kernels.testing.bench import host_overhead_us, time_eager, time_graph, variants_for
from trace_kernels.testing.provenance import git_commit, utc_now
from trace_kernels.testing.weight_sets import mixed_weight_sets, steady_weight_sets

D = 2048
REFIT_N, REFIT_K = 1536, 2048
MB = 1 << 20


def wanted(args, op: str, name: str = "") -> bool:
    """--select: comma list of `op` or `op:variant` (op: quantize, guided_fake_quantize, refit_weights,
    quantize_cta); --skip the same. The copy always runs (every percentage is relative to it)."""
    def hit(patterns):
        return any(p in (op, f"{op}:{name}") for p in patterns)
    select = [p for p in args.select.split(",") if p]
    skip = [p for p in args.skip.split(",") if p]
    return (not select or hit(select)) and not hit(skip)


@contextlib.contextmanager
def variant(module, name: str):
    """Launch `name` of an op's kernel variants inside the block (module = its codegen module)."""
    saved = module.VARIANT
    module.VARIANT = name
    try:
        yield
    finally:
        module.VARIANT = saved


@contextlib.contextmanager
def min_cta(cta: int):
    """Launch quantize with `cta` threads per block inside the block (codegen MIN_CTA)."""
    saved = codegen_quantize.MIN_CTA
    codegen_quantize.MIN_CTA = cta
    try:
        yield
    finally:
        codegen_quantize.MIN_CTA = saved


def bench_size(size: int, l2: int, args) -> list[dict]:
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
    for v in codegen_quantize.VARIANTS:
        if not wanted(args, "quantize", v):
            continue
        with variant(codegen_quantize, v):
            extra = {"variant": v}
            if args.host_overhead:
                extra["host_us"] = host_overhead_us(lambda: ops.quantize(xs[0]))
            record(f"quantize [{v}]", time_graph(lambda i: ops.quantize(xs[i]), sets), q_bytes, extra)
            record(f"quantize+guidance+bf16 [{v}]",
                   time_graph(lambda i: ops.quantize(xs[i], guidance=True, dequant=True), sets),
                   q_bytes + elems // 8 + elems * 2, {"variant": v})

    if wanted(args, "quantize_cta"):  # the default variant at other block sizes (MIN_CTA; 256 is the default)
        for cta in (64, 128, 256):
            with min_cta(cta):
                extra = {"variant": codegen_quantize.VARIANT, "cta": cta}
                record(f"quantize cta={cta} [{codegen_quantize.VARIANT}]",
                       time_graph(lambda i: ops.quantize(xs[i]), sets), q_bytes, extra)
                record(f"quantize+guidance+bf16 cta={cta} [{codegen_quantize.VARIANT}]",
                       time_graph(lambda i: ops.quantize(xs[i], guidance=True, dequant=True), sets),
                       q_bytes + elems // 8 + elems * 2, extra)

    guided_variants = [v for v in codegen_guided.VARIANTS if wanted(args, "guided_fake_quantize", v)]
    compact = [ops.quantize(x, guidance=True).guidance() for x in xs] if guided_variants else []
    full = [nvfp4.make_guidance(ops.quantize(x).q, "full") for x in xs] if guided_variants else []
    trainer = [x * (1 + 1e-2 * torch.randn_like(x)) for x in xs] if guided_variants else []
    g_common = elems * 2 + elems // 16 + rows * 4 + elems * 2  # x, block scales, row scales, out
    for v in guided_variants:
        with variant(codegen_guided, v):
            record(f"guided_fake_quantize compact [{v}]",
                   time_graph(lambda i: ops.guided_fake_quantize(trainer[i], compact[i], return_counters=True), sets),
                   g_common + elems // 8 + 32, {"variant": v})
            record(f"guided_fake_quantize compact no-counters [{v}]",
                   time_graph(lambda i: ops.guided_fake_quantize(trainer[i], compact[i]), sets),
                   g_common + elems // 8, {"variant": v})
            record(f"guided_fake_quantize full [{v}]",
                   time_graph(lambda i: ops.guided_fake_quantize(trainer[i], full[i], return_counters=True), sets),
                   g_common + elems // 2 + 32, {"variant": v})
            record(f"guided_fake_quantize full no-counters [{v}]",
                   time_graph(lambda i: ops.guided_fake_quantize(trainer[i], full[i]), sets),
                   g_common + elems // 2, {"variant": v})
    del compact, full, trainer, xs

    n = REFIT_N if size >= REFIT_N * REFIT_K * 2 else max(1, size // (2 * REFIT_K))
    experts = max(1, size // (2 * n * REFIT_K))
    w_sets = variants_for(experts * n * REFIT_K * 2, l2)
    ws = [torch.randn(experts, n, REFIT_K, device="cuda", dtype=torch.bfloat16) for _ in range(w_sets)]
    buffers = ops.allocate_refit_buffers(experts, n, REFIT_K, "cuda")
    relems = experts * n * REFIT_K
    r_bytes = relems * 2 + relems // 2 + relems // 16 + experts * 4
    shape = {"experts": experts, "n": n, "k": REFIT_K}
    steady = steady_weight_sets(ws[0], w_sets) if args.refit_steady else None
    mixed, moved = mixed_weight_sets(steady, args.refit_mixed) if steady and args.refit_mixed > 0 else (None, 0.0)
    refit = importlib.import_module("trace_kernels.ops.refit_weights")
    for v in codegen_refit.VARIANTS:
        if not wanted(args, "refit_weights", v):
            continue
        pdls = args.refit_v8_pdl if v == "v8" else [True]  # v8: phase 1 as a programmatic dependent and as an ordinary launch
        for pdl in pdls:
            refit.V8_PDL = pdl
            with variant(codegen_refit, v):
                extra = {"variant": v, **shape}
                label = v
                if v == "v8":
                    extra["pdl"] = pdl
                    label += "" if pdl else " nopdl"
                if v == "v2":  # the amax pass reads w a second time
                    extra["moved_bytes"] = r_bytes + relems * 2
                if args.host_overhead:
                    extra["host_us"] = host_overhead_us(lambda: ops.refit_weights(ws[0], buffers))
                record(f"refit_weights [{label}]", time_graph(lambda i: ops.refit_weights(ws[i], buffers), w_sets),
                       r_bytes, extra)
                if steady is not None:
                    record(f"refit_weights steady [{label}]",
                           time_graph(lambda i: ops.refit_weights(steady[i], buffers), w_sets), r_bytes,
                           {**extra, "inputs": "steady"})
                if mixed is not None:
                    record(f"refit_weights mixed [{label}]",
                           time_graph(lambda i: ops.refit_weights(mixed[i], buffers), w_sets), r_bytes,
                           {**extra, "inputs": "mixed", "moved_fraction": moved})
        refit.V8_PDL = True
    del ws, steady, mixed, buffers
    torch.cuda.empty_cache()
    return results


def copy_study(sizes_mb: list[int], l2: int) -> list[dict]:
    """The copy by three methods at each size, rotating over separate source/destination pairs."""
    out = []
    for size_mb in sizes_mb:
        elems = size_mb * MB // 2
        sets = variants_for(elems * 2, l2)
        src = [torch.randint(-2**15, 2**15, (elems,), device="cuda", dtype=torch.int16) for _ in range(sets)]
        dst = [torch.empty_like(s) for s in src]
        methods = {
            "copy_ graph (memcpy node)": lambda i: time_graph(lambda j: dst[j].copy_(src[j]), sets),
            "copy_ eager (cudaMemcpyAsync)": lambda i: time_eager(lambda j: dst[j].copy_(src[j]), sets, replays=30),
            "SM kernel graph (bitwise_not)":
                lambda i: time_graph(lambda j: torch.bitwise_not(src[j], out=dst[j]), sets),
        }
        for name, timed in methods.items():
            ms = timed(0)
            out.append({"method": name, "mb": size_mb, "sets": sets, "ms": ms, "tb_per_s": 2 * elems * 2 / ms / 1e9})
        del src, dst
        torch.cuda.empty_cache()
    return out


def parse_args(argv=None) -> argparse.Namespace:
    """This script's options (profiling/bench.py's memory section takes their defaults from here)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", default="1,4,16,64,256,1024")
    parser.add_argument("--copy-study-mb", default="64,256,512,1024,2048", help="empty: skip the copy study")
    parser.add_argument("--select", default="", help="only these: op or op:variant, comma separated")
    parser.add_argument("--skip", default="", help="not these: op or op:variant, comma separated")
    parser.add_argument("--no-host-overhead", dest="host_overhead", action="store_false",
                        help="skip the eager host-overhead measurements")
    parser.add_argument("--guided-v7-geometry", default="", metavar="MODE=THREADSxCTAS[xSLOTS],...",
                        help="guided v7's (threads per CTA, CTAs per SM) for these modes, e.g. full_counters=128x4; "
                             "a third number: v3's loop with that many blocks per thread and pass (codegen's "
                             "V7_GEOMETRY)")
    parser.add_argument("--no-refit-steady", dest="refit_steady", action="store_false",
                        help="skip the refit rows on steady weights (an RL step's: every expert's amax kept)")
    parser.add_argument("--refit-mixed", type=float, default=0.25, metavar="FRACTION",
                        help="refit rows on steady weights with about this fraction of the experts' amax moved per "
                             "call (0: skip)")
    parser.add_argument("--refit-v8-pdl", default="1", metavar="1,0",
                        help="refit v8's phase 1 as a programmatic dependent launch (1) or an ordinary one (0), a row "
                             "each")
    parser.add_argument("--out", default="profiling/results/memory_kernels_h200.json")
    args = parser.parse_args(argv)
    args.refit_v8_pdl = [bool(int(p)) for p in args.refit_v8_pdl.split(",") if p]
    for item in (i for i in args.guided_v7_geometry.split(",") if i):
        mode, geometry = item.split("=")
        codegen_guided.V7_GEOMETRY[mode] = tuple(int(n) for n in geometry.split("x"))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    results = []
    for size_mb in (int(s) for s in args.sizes_mb.split(",")):
        results += bench_size(size_mb * MB, props.L2_cache_size, args)
    ops.raise_on_nonfinite()
    study = copy_study([int(s) for s in args.copy_study_mb.split(",") if s], props.L2_cache_size)
    copy_at = {r["input_mb"]: r["tb_per_s"] for r in results if r["kernel"] == "copy"}
    peak_copy = max(copy_at.values())
    for r in results:
        r["fraction_of_copy"] = r["tb_per_s"] / copy_at[r["input_mb"]]
        r["fraction_of_peak_copy"] = r["tb_per_s"] / peak_copy
        if "moved_bytes" in r:
            r["moved_tb_per_s"] = r["moved_bytes"] / r["ms"] / 1e9
            r["moved_fraction_of_copy"] = r["moved_tb_per_s"] / copy_at[r["input_mb"]]
    report = {
        "gpu": props.name, "sms": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
        "date": utc_now(),
        "commit": git_commit(), "torch": torch.__version__,
        "command": "python profiling/bench_memory_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "method": "median ms per call over CUDA-graph replays rotating fresh input sets; bytes = read once + write once",
        "target": ">= 0.85 of same-size copy bandwidth at >= 64 MB",
        "default_variants": {"quantize": codegen_quantize.VARIANT, "guided_fake_quantize": codegen_guided.VARIANT,
                             "refit_weights": codegen_refit.VARIANT},
        "results": results,
        "copy_study": study,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"{'kernel':46s} {'MB':>6s} {'ms':>9s} {'TB/s':>6s} {'copy%':>6s} {'peak%':>6s}")
    for r in results:
        moved = f"  (moved bytes: {100 * r['moved_fraction_of_copy']:.1f}%)" if "moved_bytes" in r else ""
        print(f"{r['kernel']:46s} {r['input_mb']:6.0f} {r['ms']:9.4f} {r['tb_per_s']:6.2f} "
              f"{100 * r['fraction_of_copy']:5.1f}% {100 * r['fraction_of_peak_copy']:5.1f}%{moved}")
    print(f"\ncopy study (read + write bytes / time; sets = rotating source/destination pairs)")
    print(f"{'method':34s} " + " ".join(f"{mb:>7d}" for mb in sorted({s['mb'] for s in study})) + "  MB")
    for method in dict.fromkeys(s["method"] for s in study):
        cells = {s["mb"]: s["tb_per_s"] for s in study if s["method"] == method}
        print(f"{method:34s} " + " ".join(f"{cells[mb]:7.2f}" for mb in sorted(cells)) + "  TB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
