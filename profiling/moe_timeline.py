"""Where an MoE layer's GEMM time goes: per-CTA timestamps of the v1 GEMM kernels and the combine on the GPU.

    python profiling/moe_timeline.py --shapes qwen3-30b-a3b --tokens 64,16384 --out runs/moe_timeline.json

Per (shape, T) the script builds the layer as bench_moe_gemm.py times it (auto tables, the fused gate_up, the down GEMM
and its combine, programmatic dependent launches, one CUDA graph, L2 flushed before each replay), notes the kernels it
launches, builds the v1 GEMMs and the combine a second time with TRACE_KERNELS_CTA_TIMELINE
(cuda/include/trace_kernels/cta_timeline.cuh), checks that they give the same bits, and replays the graph with them.
Thread 0 of every GEMM CTA records %globaltimer at POINTS: 0 entry, 1 its token tile found, 2 past the wait for the
previous kernel, 3 the first ring stage (direct tiles: every activation chunk) landed, 4 the main loop done, 5 its
epilogue stores issued, 6 (a fused gate_up's last CTA of a token tile) the tile's rows quantized. The combine's CTAs
record 0, 2 (past their wait) and 5. ws tiles (auto's below 1/8 routed row per expert) carry no stamps.

Per GEMM it reports the grid's span, the phases' medians over the CTAs with a token tile, and per SM how its time
splits between 0, 1, 2, ... CTAs in their main loops (`main_loop_ctas`: the share of SM time with none is time no
wgmma of that kernel can run), how much of a CTA's time outside its main loop another CTA of its SM spends in its own
(`cover`: 1 when the SM's CTAs take turns, low when they start and end together), and the SMs' idle tails. All times
are microseconds from the gate_up's first CTA entry; the JSON keeps the last replay's raw stamps.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import statistics
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

import bench_moe_gemm as bench  # this folder (scripts run as python profiling/...)
from cta_timeline import NOTE_SLOT, SM_SLOT, build_timeline_kernel, clear_stamps, pct, read_stamps, stamped_cubin
from trace_kernels import moe_gemm as ops, runtime, shapes
from trace_kernels.codegen.ops import moe_gemm as codegen
from trace_kernels.moe_routing import route
from trace_kernels.moe_slot_rows import empty_slot_rows
from trace_kernels.moe_testing import random_topk
from trace_kernels.testing.provenance import git_commit, utc_now

POINTS = ("entry", "tile_found", "waited", "first_data", "loop_done", "stored", "quantized")  # slots 0-6
ENTRY, FOUND, WAITED, FIRST, LOOP_DONE, STORED, QUANTIZED = range(7)


def cta_end(row: list[int]) -> int:
    """A CTA's last stamp: the quantization of a last CTA, else its epilogue stores (0: it never got there)."""
    return row[QUANTIZED] or row[STORED]


class Coverage:
    """The time during which at least `at_least` of a set of intervals [a, b) are open, inside any other interval."""

    def __init__(self, intervals: list[tuple[int, int]], at_least: int = 1):
        events = sorted([(a, 1) for a, b in intervals if b > a] + [(b, -1) for a, b in intervals if b > a])
        self.starts: list[int] = []  # the maximal segments where the count is at least at_least
        self.ends: list[int] = []
        count = 0
        for t, d in events:
            before, count = count, count + d
            if before < at_least <= count:
                self.starts.append(t)
            elif count < at_least <= before:
                self.ends.append(t)
        self.before = [0]  # before[j]: covered time of segments 0 .. j-1
        for a, b in zip(self.starts, self.ends):
            self.before.append(self.before[-1] + b - a)

    def covered_until(self, t: int) -> int:
        j = bisect.bisect_right(self.starts, t)  # segments starting at or before t
        if j == 0:
            return 0
        return self.before[j - 1] + min(t, self.ends[j - 1]) - self.starts[j - 1]

    def covered(self, a: int, b: int) -> int:
        return self.covered_until(b) - self.covered_until(a) if b > a else 0


def count_histogram(intervals: list[tuple[int, int]], start: int, end: int) -> dict[int, int]:
    """ns of [start, end] during which exactly c of the intervals are open, per c."""
    events = sorted([(max(a, start), 1) for a, b in intervals if b > a] + [(min(b, end), -1) for a, b in intervals
                                                                          if b > a])
    hist: dict[int, int] = {}
    count, last = 0, start
    for t, d in events:
        if t > last:
            hist[count] = hist.get(count, 0) + t - last
            last = t
        count += d
    if end > last:
        hist[count] = hist.get(count, 0) + end - last
    return hist


def summarize_gemm(rows: list[list[int]], t0: int) -> dict | None:
    """One GEMM launch's stamps (rows in the grid's linear order; cleared rows are CTAs past the recorded ones) ->
    microseconds from t0. None when no CTA recorded a token tile (an unstamped kernel)."""
    ran = [r for r in rows if r[ENTRY]]
    tiles = [r for r in ran if r[FOUND]]
    if not tiles:
        return None
    us = lambda ns: ns / 1e3  # noqa: E731
    first_entry = min(r[ENTRY] for r in ran)
    span_end = max(max(cta_end(r) for r in tiles), max(r[ENTRY] for r in ran))
    med = lambda f: us(statistics.median(f(r) for r in tiles))  # noqa: E731
    last_ctas = [r for r in tiles if r[QUANTIZED]]
    by_sm: dict[int, list[list[int]]] = {}
    for r in ran:
        by_sm.setdefault(r[SM_SLOT], []).append(r)
    main_hist: dict[int, int] = {}
    resident_hist: dict[int, int] = {}
    covers, tails = [], []
    loops_by_overlap: dict[int, list[int]] = {}  # fifth of the loop shared with another CTA's loop -> loop lengths
    for sm_rows in by_sm.values():
        sm_tiles = [r for r in sm_rows if r[FOUND]]
        mains = [(r[FIRST], r[LOOP_DONE]) for r in sm_tiles]
        for c, ns in count_histogram(mains, first_entry, span_end).items():
            main_hist[c] = main_hist.get(c, 0) + ns
        lives = [(r[ENTRY], cta_end(r) or r[ENTRY]) for r in sm_rows]
        for c, ns in count_histogram(lives, first_entry, span_end).items():
            resident_hist[c] = resident_hist.get(c, 0) + ns
        tails.append(span_end - max(e for _, e in lives))
        feeding, shared = Coverage(mains, 1), Coverage(mains, 2)
        for r in sm_tiles:
            outside = [(r[ENTRY], r[FIRST]), (r[LOOP_DONE], cta_end(r))]  # any main loop then is another CTA's
            total = sum(b - a for a, b in outside if b > a)
            if total > 0:
                covers.append(sum(feeding.covered(a, b) for a, b in outside) / total)
            loop = r[LOOP_DONE] - r[FIRST]  # inside it, a count of 2+ means another CTA's loop runs beside it
            if loop > 0:
                fifth = min(4, int(5 * shared.covered(r[FIRST], r[LOOP_DONE]) / loop))
                loops_by_overlap.setdefault(fifth, []).append(loop)
    sm_time = len(by_sm) * (span_end - first_entry)
    fractions = lambda hist: {str(c): round(ns / sm_time, 4) for c, ns in sorted(hist.items())}  # noqa: E731
    return {
        "ctas": len(ran), "ctas_with_tile": len(tiles), "sms_used": len(by_sm),
        "max_ctas_per_sm": max(len(v) for v in by_sm.values()),
        "first_entry_us": us(first_entry - t0), "last_end_us": us(span_end - t0), "span_us": us(span_end - first_entry),
        "phases_us": {  # medians over the CTAs with a token tile
            "find_tile": med(lambda r: r[FOUND] - r[ENTRY]),
            "to_wait_done": med(lambda r: r[WAITED] - r[FOUND]),
            "first_data": med(lambda r: r[FIRST] - r[WAITED]),
            "main_loop": med(lambda r: r[LOOP_DONE] - r[FIRST]),
            "epilogue": med(lambda r: r[STORED] - r[LOOP_DONE]),
            "life": med(lambda r: cta_end(r) - r[ENTRY]),
        },
        "last_cta_quantize_us": (us(statistics.median(r[QUANTIZED] - r[STORED] for r in last_ctas))
                                 if last_ctas else None),
        "last_ctas": len(last_ctas),
        "main_loop_share_of_life": round(statistics.median((r[LOOP_DONE] - r[FIRST]) / max(1, cta_end(r) - r[ENTRY])
                                                           for r in tiles), 4),
        "main_loop_ctas": fractions(main_hist),  # share of SM time (SMs used x span) with c CTAs in their main loops
        "resident_ctas": fractions(resident_hist),
        "cover": {"p10": round(pct(covers, 0.1), 4), "p50": round(pct(covers, 0.5), 4)} if covers else None,
        # the cost of sharing the SM: main-loop medians by the share of the loop another CTA's loop ran beside it
        "main_loop_us_by_shared_fifth": {f"{k / 5:.1f}-{(k + 1) / 5:.1f}": {"ctas": len(v), "median": us(
            statistics.median(v))} for k, v in sorted(loops_by_overlap.items())},
        "sm_idle_tail_us": {"p50": us(pct(tails, 0.5)), "max": us(max(tails))},
        "entry_spread_us": {"p50": us(pct([r[ENTRY] - first_entry for r in ran], 0.5)),
                            "max": us(max(r[ENTRY] - first_entry for r in ran))},
    }


def summarize_combine(rows: list[list[int]], t0: int) -> dict | None:
    ran = [r for r in rows if r[ENTRY]]
    if not ran:
        return None
    us = lambda ns: (ns - t0) / 1e3  # noqa: E731
    return {"ctas": len(ran), "first_entry_us": us(min(r[ENTRY] for r in ran)),
            "first_past_wait_us": us(min(r[WAITED] for r in ran)), "last_past_wait_us": us(max(r[WAITED] for r in ran)),
            "end_us": us(max(r[STORED] for r in ran))}


class Layer:
    """One (shape, T) layer as bench_moe_gemm.py runs auto: its inputs, buffers and launch sequence."""

    def __init__(self, shape, tokens: int, gen: torch.Generator, weights):
        e, h, i, k = shape.experts, shape.hidden, shape.intermediate, shape.top_k
        self.w_up, self.w_down = weights
        ids = random_topk(tokens, e, k, torch.Generator().manual_seed(tokens)).cuda()
        self.routing = route(ids, e, torch.softmax(torch.randn(tokens, k, device="cuda", generator=gen), 1))
        m = self.routing.num_rows
        self.x = torch.randn(tokens, h, device="cuda", generator=gen).to(torch.bfloat16)  # [T, H]
        self.s_a = torch.rand(tokens, device="cuda", generator=gen) * 1e-2 + 1e-3  # [T]
        self.up_out = ops.empty_gate_up_output(m, i, "cuda")
        self.ys = empty_slot_rows(m, h, "cuda")
        self.y = torch.empty(tokens, h, dtype=torch.bfloat16, device="cuda")  # [T, H]
        self.tile = codegen.tile_for_rows(m, e, "auto", k=h, kind="gate_up_swiglu", n=2 * i)
        self.down_tile = bench.down_tile_for(m, e, "auto", i, h)

    def __call__(self) -> None:
        up = ops.moe_gate_up(self.x, self.w_up, self.routing.offsets, row_index=self.routing.row_index,
                             row_scale=self.s_a, validate=False, out=self.up_out, tile=self.tile, pdl=True)
        ops.moe_down(up.a_next, self.w_down, self.routing, row_scale=up.q.scale, validate=False, out=self.y,
                     slot_workspace=self.ys, tile=self.down_tile, pdl=True)

    def outputs(self) -> list[torch.Tensor]:
        q = self.up_out.q
        return [self.up_out.h, q.codes, q.block_scales.view(torch.uint8), q.scale, self.up_out.mantissa_bits,
                self.ys.values, self.ys.exponents, self.y]


def kernels_of(layer: Layer) -> list[tuple[str, object]]:
    """(role, spec) of the GEMMs and the combine one call of the layer launches, in launch order."""
    seen: list[tuple[str, object]] = []
    plan, combine_plan = ops._plan, ops._combine_plan

    def spy_plan(kind, *args, **kwargs):
        spec, kernel = plan(kind, *args, **kwargs)
        seen.append(("gate_up" if kind.startswith("gate_up") else "down", spec))
        return spec, kernel

    def spy_combine(*args):
        spec, kernel = combine_plan(*args)
        seen.append(("combine", spec))
        return spec, kernel

    ops._plan, ops._combine_plan = spy_plan, spy_combine
    try:
        layer()
        torch.cuda.synchronize()
    finally:
        ops._plan, ops._combine_plan = plan, combine_plan
    return seen


def stamped_specs(shape) -> list:
    """Every kernel auto may launch for `shape` that carries stamps: its v1 GEMMs and the combine (not the ws tiles)."""
    return [spec for spec in codegen.specs_for_shape(shape, ("auto",)) if not spec.launch.get("persistent")]


def build_all(shape_names: list[str], workdir: Path) -> None:
    """The stamped cubins of stamped_specs for each shape into workdir, nvcc runs in parallel (no GPU needed: carry
    the folder to a GPU machine and pass it as --stamped-dir)."""
    specs = {spec.name: spec for name in shape_names for spec in stamped_specs(shapes.resolve(name))}
    workdir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for cubin in pool.map(lambda spec: stamped_cubin(spec, workdir), specs.values()):
            print(cubin, flush=True)


def run_case(shape, tokens: int, gen: torch.Generator, weights, timer, workdir: Path, samples: int,
             raw_max_ctas: int = 1 << 30) -> dict:
    layer = Layer(shape, tokens, gen, weights)
    roles = kernels_of(layer)
    baseline = [t.clone() for t in layer.outputs()]
    ms_plain = timer(layer, graph=True)
    stamped, originals = [], []
    for role, spec in roles:
        if spec.launch.get("persistent"):  # ws: no stamps in moe_gemm_ws.cuh
            continue
        originals.append(runtime.kernel_for(spec))
        kernel = build_timeline_kernel(spec, workdir)  # launched in the normal build's place (restored below)
        stamped.append((role, spec.name, kernel))
    ops._plans.clear()
    ops._combine_plan.cache_clear()
    try:
        for t in layer.outputs():  # poisoned: the stamped build must write every byte again
            t.view(torch.uint8).fill_(0xFF)
        layer()
        torch.cuda.synchronize()
        same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(layer.outputs(), baseline))
        if not same:
            raise RuntimeError(f"{shape.name} T={tokens}: the stamped kernels' outputs differ from the normal build's")
        ms_stamped = timer(layer, graph=True)
        graph = torch.cuda.CUDAGraph()
        with runtime.capture_graph(graph):
            layer()
        timelines = []
        for _ in range(samples):
            for _, _, kernel in stamped:
                clear_stamps(kernel)
            timer.flush.fill_(1)
            graph.replay()
            torch.cuda.synchronize()
            rows = {role: read_stamps(kernel) for role, _, kernel in stamped}
            gemm_rows = [r for role in ("gate_up", "down") if role in rows for r in rows[role] if r[ENTRY]]
            t0 = min(r[ENTRY] for r in gemm_rows)
            timelines.append({role: (summarize_combine(r, t0) if role == "combine" else summarize_gemm(r, t0))
                              for role, r in rows.items()})
        last_raw = {role: [[(x - t0 if x else -1) for x in r[:7]] + [r[SM_SLOT], r[NOTE_SLOT]] for r in rows[role]
                           if r[ENTRY]] for role in rows}
        last_raw = {role: v for role, v in last_raw.items() if len(v) <= raw_max_ctas}  # (the JSON's size)
        del graph
    finally:
        for kernel in originals:  # the cache's builds again for whatever runs next in this process
            runtime.install_kernel(kernel)
        ops._plans.clear()
        ops._combine_plan.cache_clear()
    return {"shape": shape.name, "tokens": tokens, "rows": layer.routing.num_rows,
            "kernels": {role: name for role, name, _ in stamped},
            "unstamped": [spec.name for role, spec in roles if spec.launch.get("persistent")],
            "layer_ms": ms_plain, "layer_ms_stamped": ms_stamped, "samples": timelines,
            # the last replay's stamps, ns from the gate_up's first entry (-1: never reached), of kernels of at most
            # raw_max_ctas CTAs
            "last_sample_ctas": {"fields": [*POINTS, "smid", "expert<<32|rows"], "rows": last_raw}}


def describe(r: dict) -> str:
    last = r["samples"][-1]
    parts = [f"{r['shape']:16s} T={r['tokens']:6d} layer {r['layer_ms'] * 1e3:8.1f} us (stamped "
             f"{r['layer_ms_stamped'] * 1e3:8.1f})"]
    for role in ("gate_up", "down"):
        s = last.get(role)
        if s is None:
            continue
        p = s["phases_us"]
        parts.append(f"  {role:7s} {s['first_entry_us']:8.1f}-{s['last_end_us']:8.1f} us, {s['ctas_with_tile']} CTAs "
                     f"({s['max_ctas_per_sm']}/SM max) | life {p['life']:.2f}: find {p['find_tile']:.2f} wait "
                     f"{p['to_wait_done']:.2f} first data {p['first_data']:.2f} loop {p['main_loop']:.2f} epilogue "
                     f"{p['epilogue']:.2f} | SM time with 0/1/2/3+ main loops {s['main_loop_ctas']} | cover "
                     f"{s['cover']} | idle tail p50 {s['sm_idle_tail_us']['p50']:.1f}")
    c = last.get("combine")
    if c is not None:
        parts.append(f"  combine entry {c['first_entry_us']:.1f} past wait {c['first_past_wait_us']:.1f}-"
                     f"{c['last_past_wait_us']:.1f} end {c['end_us']:.1f}")
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3-30b-a3b,qwen3-235b-a22b")
    parser.add_argument("--tokens", default="8,64,256,16384")
    parser.add_argument("--samples", type=int, default=3, help="graph replays whose stamps are read")
    parser.add_argument("--reps", type=int, default=10, help="replays per layer timing (median)")
    parser.add_argument("--out", default="runs/moe_timeline.json")
    parser.add_argument("--raw-max-ctas", type=int, default=2500,
                        help="keep the last replay's raw stamps of kernels with at most this many CTAs")
    parser.add_argument("--stamped-dir", default=None,
                        help="where the stamped cubins are (NAME_stamps.cubin, reused) or go (default: a temp folder)")
    parser.add_argument("--build-only", action="store_true",
                        help="compile the stamped cubins of every kernel auto may launch for --shapes into "
                             "--stamped-dir and exit (no GPU needed)")
    args = parser.parse_args()
    if args.build_only:
        if args.stamped_dir is None:
            parser.error("--build-only needs --stamped-dir")
        build_all(bench.shape_list(args.shapes), Path(args.stamped_dir))
        return
    timer, gen, bw = bench.timing_setup(args.reps) or (None, None, None)
    if timer is None:
        raise SystemExit(1)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.stamped_dir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for name in bench.shape_list(args.shapes):
            shape = shapes.resolve(name)
            e, h, i = shape.experts, shape.hidden, shape.intermediate
            weights = (bench.random_packed_weights(e, 2 * i, h, gen), bench.random_packed_weights(e, h, i, gen))
            for tokens in (int(t) for t in args.tokens.split(",")):
                r = run_case(shape, tokens, gen, weights, timer, workdir, args.samples, args.raw_max_ctas)
                print(describe(r), flush=True)
                results.append(r)
            del weights
            torch.cuda.empty_cache()
    out = {"gpu": torch.cuda.get_device_name(0), "date": utc_now(), "commit": git_commit(), "copy_bytes_per_s": bw,
           "command": "python profiling/moe_timeline.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
               if k not in ("out", "build_only", "stamped_dir")),
           "points": POINTS, "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    # arrays of numbers on one line each: the raw CTA rows would otherwise take a line per number
    text = re.sub(r"\[\s*([-0-9.eE+,\s]+?)\s*\]",
                  lambda m: "[" + ",".join(x.strip() for x in m.group(1).split(",")) + "]", json.dumps(out, indent=1))
    Path(args.out).write_text(text + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
