"""Where a decode launch's time goes: per-CTA timestamps of the NVFP4 decode kernel on the GPU.

    python profiling/decode_timeline.py --out profiling/results/attention_decode_timeline_h200.json

Builds the decode kernel (default: the default variant at issue 5's shape Hq 32 / Hkv 4 / D 128 / P 16; --heads for
another) a second time with TRACE_KERNELS_CTA_TIMELINE defined (cuda/include/trace_kernels/cta_timeline.cuh):
thread 0 of every CTA then records %globaltimer and clock64 at seven points (0 entry, 1 after split_range's wait for the
previous kernel and its read of the length, 2 q ready and the first copies issued, 3 the first tile landed, 4 the tile
loop done, 6 the warps' partial results in shared memory, 5 the split output stored); the split combine's CTAs record
their entry (0), the end of their wait for the decode grid (1) and their end (5). Both builds replace the normal ones in this process (runtime.install_kernel); the
script captures bench_attention's CUDA graph (every cache set, back to back, as the benchmark times it), replays it and
reads the last launch's stamps. Per case it reports the replay's median time
per call beside the decode grid's span and where each CTA spent its part: the spread of CTA starts, the wait, q, the
first tile's latency, the tile loop (per tile), the merge (its shared-memory buffer, then the outputs), the spread of
CTA ends; then when the combine's CTAs started, got past their wait and ended (same clock). The last sample's raw stamps
are kept (decode: per CTA the seven times in ns from the grid's first entry, its SM and its tile count).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
from pathlib import Path

import torch

import bench_attention as bench  # this folder (scripts run as python profiling/...)
from cta_timeline import (SLOTS, SYMBOL, build_timeline_kernel, clear_stamps,  # noqa: F401 (the tests use them here)
                          compile_with_stamps, pct, read_stamps)
from trace_kernels import attention, runtime
from trace_kernels.codegen.ops import decode_attention as codegen
from trace_kernels.testing.bench import time_graph, variants_for
from trace_kernels.testing.provenance import git_commit, utc_now

POINTS = ("entry", "waited", "q_ready", "first_tile", "loop_done", "stored", "merge_buffer")  # slots 0-6


def summarize(rows: list[list[int]]) -> dict:
    """Microseconds; medians over CTAs unless named otherwise."""
    t = [[r[i] for i in range(7)] for r in rows]
    t0 = min(r[0] for r in t)
    us = lambda ns: ns / 1e3  # noqa: E731
    ends = [r[5] - t0 for r in t]
    starts = [r[0] - t0 for r in t]
    tiles = [r[15] for r in rows]
    per_tile = [(r[4] - r[3]) / (n - 1) for r, n in zip(t, tiles) if n > 1]
    cycles_per_tile = [(r[12] - r[11]) / (n - 1) for r, n in zip(rows, tiles) if n > 1]
    ctas_per_sm: dict[int, int] = {}
    for r in rows:
        ctas_per_sm[r[7]] = ctas_per_sm.get(r[7], 0) + 1
    nonzero_steps = sorted({b - a for a, b in zip(sorted(starts), sorted(starts)[1:]) if b > a})
    by_sm: dict[int, list[int]] = {}  # rows are in the grid's linear order: the first of a pair was placed first
    for i, r in enumerate(rows):
        by_sm.setdefault(r[7], []).append(i)
    pairs = [(t[i][5], t[j][5]) for i, j in (v for v in by_sm.values() if len(v) == 2)]
    sm_ends = [max(t[i][5] for i in v) - t0 for v in by_sm.values()]
    return {
        "ctas": len(rows), "sms_used": len(ctas_per_sm), "max_ctas_per_sm": max(ctas_per_sm.values()),
        "tiles_per_cta": statistics.median(tiles),
        "span_us": us(max(ends)),
        "start_spread_us": {"p50": us(pct(starts, 0.5)), "p90": us(pct(starts, 0.9)), "max": us(max(starts))},
        "wait_us": us(statistics.median(r[1] - r[0] for r in t)),
        "q_us": us(statistics.median(r[2] - r[1] for r in t)),
        "first_tile_after_wait_us": us(statistics.median(r[3] - r[1] for r in t)),
        "loop_us": us(statistics.median(r[4] - r[3] for r in t)),
        "per_tile_us": us(statistics.median(per_tile)) if per_tile else None,
        "per_tile_cycles": statistics.median(cycles_per_tile) if cycles_per_tile else None,
        "merge_store_us": us(statistics.median(r[5] - r[4] for r in t)),
        "merge_buffer_us": us(statistics.median(r[6] - r[4] for r in t)),  # column sums, partials to shared memory
        "merge_outputs_us": us(statistics.median(r[5] - r[6] for r in t)),  # the per-element merge and its stores
        "end_us": {"min": us(min(ends)), "p10": us(pct(ends, 0.1)), "p50": us(pct(ends, 0.5)),
                   "p90": us(pct(ends, 0.9)), "max": us(max(ends))},
        "cta_life_us": {"p10": us(pct([r[5] - r[0] for r in t], 0.1)), "p50": us(pct([r[5] - r[0] for r in t], 0.5)),
                        "max": us(max(r[5] - r[0] for r in t))},
        "timer_step_ns": nonzero_steps[0] if nonzero_steps else None,
        # SMs running two CTAs: how often the one placed first ends first, by how much; when the SMs end
        "pairs": len(pairs), "pairs_first_placed_ends_first": sum(a < b for a, b in pairs),
        "pair_end_gap_us": us(statistics.median(b - a for a, b in pairs)) if pairs else None,
        "sm_end_us": {"min": us(min(sm_ends)), "p50": us(pct(sm_ends, 0.5)), "max": us(max(sm_ends))},
    }


def combine_summary(rows: list[list[int]], t0: int) -> dict | None:
    """The combine grid against the decode grid's clock (microseconds from the decode's first CTA entry); None when
    no combine kernel ran (one split)."""
    rows = [r for r in rows if r[0]]
    if not rows:
        return None
    us = lambda ns: (ns - t0) / 1e3  # noqa: E731
    return {"ctas": len(rows), "first_entry_us": us(min(r[0] for r in rows)),
            "first_past_wait_us": us(min(r[1] for r in rows)), "last_past_wait_us": us(max(r[1] for r in rows)),
            "end_us": us(max(r[5] for r in rows))}


def run_case(kernel: runtime.CudaKernel, combine: runtime.CudaKernel, batch: int, length: int, variant: str, l2: int,
             samples: int) -> dict:
    per_set = 2 * batch * length * bench.HKV * bench.token_head_bytes("nvfp4")
    sets = variants_for(per_set, l2, 4)
    g = torch.Generator().manual_seed(batch * 7 + length)
    data = [bench.make_set("nvfp4", batch, length, g) for _ in range(sets)]

    def fn(i: int) -> None:
        d = data[i]
        attention.decode_attention(d["q"], d["k"], d["v"], d["table"], d["lengths"], check_values=False,
                                   variant=variant)

    ms = time_graph(fn, sets)  # the benchmark's number, with the stamps compiled in
    geometry = bench.launch_geometry("nvfp4", batch, length, variant)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with runtime.capture_graph(graph, stream=stream):
        for i in range(sets):
            fn(i)
    timelines = []
    for _ in range(samples):
        clear_stamps(kernel)
        clear_stamps(combine)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        rows = read_stamps(kernel, geometry["ctas"])
        t0 = min(r[0] for r in rows)
        timelines.append({**summarize(rows), "combine": combine_summary(read_stamps(combine, batch * bench.HQ), t0)})
    del data, graph
    torch.cuda.empty_cache()
    keys = [k for k, v in timelines[0].items() if isinstance(v, (int, float)) and v is not None]
    median = {k: statistics.median(tl[k] for tl in timelines) for k in keys}
    raw = [[r[i] - t0 for i in range(7)] + [r[7], r[15]] for r in rows]  # the last sample's CTAs
    return {"batch": batch, "length": length, "sets": sets, "ms_per_call": ms, **geometry,
            "median_of_samples": median, "samples": timelines,
            "last_sample_ctas": {"fields": [*POINTS, "smid", "tiles"], "rows": raw}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="profiling/results/attention_decode_timeline_h200.json")
    parser.add_argument("--variant", default=None, help="NVFP4 decode variant (default: attention.default_variant)")
    parser.add_argument("--cases", default="8x8192,8x32768,4x131072,32x32768", help="BxL,...")
    parser.add_argument("--samples", type=int, default=5, help="graph replays whose last launch is read")
    parser.add_argument("--heads", default=None, metavar="HQxHKVxDxP", help="head shape (bench_attention.py --heads)")
    args = parser.parse_args()
    if args.heads:
        bench.set_heads(args.heads)
    variant = args.variant or attention.default_variant("nvfp4", bench.HQ, bench.HKV, bench.D, bench.P)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    with tempfile.TemporaryDirectory() as tmp:
        kernel = build_timeline_kernel(codegen.spec("nvfp4", bench.HQ, bench.HKV, bench.D, bench.P, variant), Path(tmp))
        combine = build_timeline_kernel(codegen.combine_spec(bench.D), Path(tmp))
        results = []
        for case in args.cases.split(","):
            batch, length = (int(x) for x in case.split("x"))
            r = run_case(kernel, combine, batch, length, variant, l2, args.samples)
            m, c = r["median_of_samples"], r["samples"][-1]["combine"]
            last = r["samples"][-1]
            if c is not None:
                merge = (f"combine entry {c['first_entry_us']:.1f} past wait {c['first_past_wait_us']:.1f}-"
                         f"{c['last_past_wait_us']:.1f} end {c['end_us']:.1f}")
            else:
                merge = "one split"
            print(f"{batch:3d} x {length:6d}: {r['ms_per_call'] * 1e3:7.1f} us per call, "
                  f"grid span {m['span_us']:6.1f}, {r['ctas']} CTAs, {m['tiles_per_cta']:.0f} tiles each "
                  f"| wait {m['wait_us']:.2f} q {m['q_us']:.2f} first tile {m['first_tile_after_wait_us']:.2f} "
                  f"loop {m['loop_us']:.1f} ({m['per_tile_us']:.2f}/tile) merge+store {m['merge_store_us']:.2f} "
                  f"(buffer {m['merge_buffer_us']:.2f}) | ends p10 {last['end_us']['p10']:.1f} "
                  f"p50 {last['end_us']['p50']:.1f} | pairs {last['pairs_first_placed_ends_first']}/{last['pairs']} "
                  f"first-placed first, gap {last['pair_end_gap_us'] or 0:.1f} | {merge}", flush=True)
            results.append(r)
    out = {"gpu": torch.cuda.get_device_name(0), "date": utc_now(), "commit": git_commit(), "variant": variant,
           "shape": {"hq": bench.HQ, "hkv": bench.HKV, "d": bench.D, "page": bench.P},
           "command": "python profiling/decode_timeline.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out" and v is not None),
           "points": POINTS, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    # arrays of numbers on one line each: the raw CTA rows would otherwise take a line per number
    text = re.sub(r"\[\s*([-0-9.eE+,\s]+?)\s*\]",
                  lambda m: "[" + ",".join(x.strip() for x in m.group(1).split(",")) + "]", json.dumps(out, indent=1))
    Path(args.out).write_text(text + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
