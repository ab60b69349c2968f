"""Benchmark the NVFP4 MoE grouped GEMMs against BF16 torch._grouped_mm and the copy roofline.

    python profiling/bench_moe_gemm.py --shapes qwen3-30b-a3b,qwen3-235b-a22b \
        --tokens 1,8,32,64,128,256,1024,4096,16384 --out profiling/results/moe_gemm_h200.json

One run, same random routing (top-k, uniform) for every contender, fresh random inputs (never
zeros); CUDA events around each launch sequence, L2 flushed (256 MB write) before every repetition,
median of --reps. `*_ms` time CUDA-graph replays of the launch sequence (GPU time); `*_eager_ms`
time plain Python launches (includes host launch overhead). Contenders per (shape, T):
  nvfp4      moe_gate_up (fused SwiGLU + NVFP4 quantize + guidance) + moe_down (router weight +
             ordered combine), the kernels of this repo, validate=False (no host syncs), for every
             kernel variant in --variants (codegen.ops.moe_gemm.TILE_TABLES; each variant's table
             tile); top-level nvfp4_* fields are the first variant's, `variants` holds all of them
  nvfp4_plain_gate_up  the gate_up GEMM with the plain bf16 epilogue (fused-epilogue cost)
  nvfp4_combine        moe_down's second launch alone (the ordered combine of the per-slot rows; not for
                       fused_combine down tiles): how much of the down time re-reads the [M, H] FP16 pair rows
  bf16_grouped_mm      torch._grouped_mm gate_up + down on the same sorted rows (BF16 weights)
  roofline   bytes the NVFP4 path must move / copy bandwidth measured in the same run
Bytes counted for the roofline: NVFP4 weights (codes + E4M3 scales) of the experts that received
rows, the BF16 tokens, the fused epilogue's outputs (bf16 h, codes, block scales, row scales, bf16
operand, guidance bits), the down GEMM's bf16 operand read and the bf16 [T, H] output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import sys
from typing import NamedTuple

import torch

from trace_kernels import env, moe_gemm as ops, moe_tables
from trace_kernels import shapes
from trace_kernels.codegen.ops import moe_gemm as codegen
from trace_kernels.moe_layout import CODE_RECORD_BYTES, SCALE_RECORD_BYTES, MoEWeights
from trace_kernels.moe_routing import route, token_tiles
from trace_kernels.moe_slot_rows import empty_slot_rows
from trace_kernels.moe_testing import random_topk
from trace_kernels.runtime import capture_graph
from trace_kernels.testing.provenance import git_commit, utc_now


def random_packed_weights(e: int, n: int, k: int, gen: torch.Generator) -> MoEWeights:
    """Random packed NVFP4 bytes (speed does not depend on values): encoded codes uniform, encoded
    block scales uniform over the nonzero E4M3 scales 2^-9..448 (moe_encoding: bytes 0x68..0xF6)."""
    codes = torch.randint(0, 256, (e, n // 64, k // 64, CODE_RECORD_BYTES), dtype=torch.uint8, device="cuda",
                          generator=gen)
    scales = torch.randint(0x68, 0xF7, (e, n // 64, k // 64, SCALE_RECORD_BYTES), dtype=torch.uint8, device="cuda",
                           generator=gen)
    scale = torch.rand(e, device="cuda", generator=gen) * 1e-4 + 1e-5
    return MoEWeights(codes, scales, scale)


class Timer:
    def __init__(self, reps: int, warmup: int = 3):
        self.reps, self.warmup = reps, warmup
        self.flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")

    def __call__(self, fn, graph: bool = False) -> float:
        """Median milliseconds of fn() over reps, L2 flushed before each repetition.

        graph=True captures fn once into a CUDA graph and times its replays: the GPU time without
        the host's launch overhead (a Python launch costs tens of microseconds, comparable to a
        whole decode step).
        """
        for _ in range(self.warmup):
            fn()
        if graph:
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with capture_graph(g):
                fn()
            fn = g.replay
            fn()
        times = []
        for _ in range(self.reps):
            self.flush.fill_(1)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def copy_bandwidth(timer: Timer, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written per second."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / (ms * 1e-3)


def timing_setup(reps: int) -> tuple[Timer, torch.Generator, float] | None:
    """A run's timer, seeded CUDA generator and measured copy bandwidth (printed); None without a GPU."""
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return None
    timer = Timer(reps)
    bw = copy_bandwidth(timer)
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s (read + write)", flush=True)
    return timer, torch.Generator(device="cuda").manual_seed(0), bw


def nvfp4_bytes(e_active: int, hidden: int, inter: int, tokens: int, rows: int) -> int:
    w_elems = e_active * (2 * inter * hidden + hidden * inter)
    weights = w_elems // 2 + w_elems // 16
    tokens_in = tokens * hidden * 2
    fused_out = rows * inter * (2 + 0.5 + 1 / 16 + 2 + 1 / 8) + rows * 4
    down_in = rows * inter * 2
    out = tokens * hidden * 2
    return int(weights + tokens_in + fused_out + down_in + out)


class Arm(NamedTuple):
    variant: str  # tile table (codegen TILE_TABLES key)
    pdl: bool  # programmatic dependent launches between the layer's kernels
    down_tile: object  # a TileConfig replacing the table's down tile of its width, or None
    grid: str  # "" (moe_routing.token_tile_bound), "loose" (ceil(M / TN) + E, the bound before) or "exact"


def variant_arm(label: str, down_tiles: list | None = None) -> Arm:
    """`--variants` entry -> Arm: "auto" uses PDL between the layer's kernels (moe_gemm's pdl=True and
    FOLLOW_UP_PDL), "auto:nopdl" launches them plainly, "auto:downJ" runs --down-tiles' J-th tile instead of the
    table's down tile where that has the same TN (a v1 tile: not the ws tile below 1/8 routed row per expert), for
    layer A/Bs of a down tile before it is tabled. "auto:loose" launches the GEMMs' grids on the token-tile bound
    before 2026-12-05 (ceil(M / TN) + E), "auto:exact" on the routing's real token tiles (read on the host before
    timing, which a rollout cannot do): what the surplus CTAs of the bound cost."""
    variant, _, option = label.partition(":")
    down = re.fullmatch(r"down(\d+)", option)
    if option not in ("", "nopdl", "loose", "exact") and not down:
        raise ValueError(f"--variants entry {label!r}: the options are ':nopdl', ':downJ', ':loose' and ':exact'")
    if down and int(down.group(1)) >= len(down_tiles or ()):
        raise ValueError(f"--variants entry {label!r}: --down-tiles has {len(down_tiles or ())} tiles")
    return Arm(variant, option != "nopdl", down_tiles[int(down.group(1))] if down else None,
               option if option in ("loose", "exact") else "")


def grid_token_tiles(grid: str, offsets_cpu: torch.Tensor):
    """moe_gemm._grid_token_tiles for an Arm's grid: None (the op's bound), the bound before, or the real count."""
    if grid == "loose":
        return lambda m, experts, tile_tokens: -(-m // tile_tokens) + experts
    if grid == "exact":
        return lambda m, experts, tile_tokens: max(1, token_tiles(offsets_cpu, tile_tokens))
    return None


def down_tile_for(m: int, e: int, variant: str, k: int, n: int, override=None):
    """The down GEMM's tile of a layer: the table's, or the override where the table's is a v1 tile of its TN."""
    tile = codegen.tile_for_rows(m, e, variant, k=k, kind="down_routed", n=n)  # auto: its own table
    if override is not None and tile.variant == "v1" and tile.tile_tokens == override.tile_tokens:
        codegen.check_tile(override, k)
        return override
    return tile


def tile_label(tile) -> str:
    knobs = f"{tile.variant}_tn{tile.tile_tokens}_st{tile.stages}_mb{tile.min_blocks}_wg{tile.warpgroups}"
    knobs += "_qa1" if getattr(tile, "quantize_after", False) else ""
    knobs += "_cq1" if getattr(tile, "cluster_quant", False) else ""
    if tile.variant == "ws":
        knobs += f"_cps{tile.chunks_per_stage}_ov{int(tile.overlap)}"
        knobs += f"_mt{tile.m_tiles}" if tile.m_tiles > 1 else ""
        return knobs + ("_ae1" if getattr(tile, "async_epilogue", False) else "")
    knobs += f"_pf{int(tile.proxy_fence)}_ov{int(tile.overlap)}"
    knobs += f"_cps{tile.chunks_per_stage}" if tile.chunks_per_stage > 1 else ""
    return knobs + (f"_ns{tile.n_step}" if getattr(tile, "n_step", 0) else "")


def bench_shape(shape, tokens_list, timer: Timer, bw: float, gen: torch.Generator, sweep_tiles: bool,
                variants: list[str], extra_tokens: tuple[int, ...] = (), down_tiles: list | None = None) -> list[dict]:
    e, h, i, k = shape.experts, shape.hidden, shape.intermediate, shape.top_k
    w_up = random_packed_weights(e, 2 * i, h, gen)
    w_down = random_packed_weights(e, h, i, gen)
    bf_up = (torch.randn(e, 2 * i, h, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)  # [E, 2I, H]
    bf_down = (torch.randn(e, h, i, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)  # [E, H, I]
    rows = []
    for t in tokens_list:
        ids = random_topk(t, e, k, torch.Generator().manual_seed(t)).cuda()
        weights = torch.softmax(torch.randn(t, k, device="cuda", generator=gen), 1)
        routing = route(ids, e, weights)
        m = routing.num_rows
        x = torch.randn(t, h, device="cuda", generator=gen).to(torch.bfloat16)
        s_a = torch.rand(t, device="cuda", generator=gen) * 1e-2 + 1e-3
        offsets_cpu = routing.offsets.cpu()  # (one read-back: the active experts, the exact grid arm)
        e_active = int((offsets_cpu[1:] > offsets_cpu[:-1]).sum())
        up_out = ops.empty_gate_up_output(m, i, "cuda")
        ys = empty_slot_rows(m, h, "cuda")
        y = torch.empty(t, h, dtype=torch.bfloat16, device="cuda")
        plain = torch.empty(m, 2 * i, dtype=torch.bfloat16, device="cuda")
        nbytes = nvfp4_bytes(e_active, h, i, t, m)
        flops = 2 * m * (2 * i * h + h * i)
        row = {"shape": shape.name, "tokens": t, "rows": m, "experts_active": e_active, "variants": {}}
        for vi, label in enumerate(variants):
            variant, pdl, down_override, grid = variant_arm(label, down_tiles)
            tile = codegen.tile_for_rows(m, e, variant, k=h, kind="gate_up_swiglu", n=2 * i)
            down_tile = down_tile_for(m, e, variant, i, h, down_override)

            def nvfp4_layer(tile=tile, down_tile=down_tile, pdl=pdl):
                up = ops.moe_gate_up(x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a,
                                     validate=False, out=up_out, tile=tile, pdl=pdl)
                ops.moe_down(up.a_next, w_down, routing, row_scale=up.q.scale, validate=False, out=y,
                             slot_workspace=ys, tile=down_tile, pdl=pdl)

            def plain_gate_up(tile=tile):
                ops.moe_gemm(x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a, validate=False,
                             out=plain, tile=tile)

            def fused_gate_up(tile=tile):
                ops.moe_gate_up(x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a,
                                validate=False, out=up_out, tile=tile)

            res = {"tile": dataclasses.asdict(tile), "down_tile": dataclasses.asdict(down_tile), "pdl": pdl,
                   "grid": grid or "bound"}
            ops.FOLLOW_UP_PDL = pdl
            ops._grid_token_tiles = grid_token_tiles(grid, offsets_cpu)
            try:
                if vi == 0:
                    res["nvfp4_eager_ms"] = timer(nvfp4_layer)
                res["nvfp4_ms"] = timer(nvfp4_layer, graph=True)
                res["nvfp4_gate_up_fused_ms"] = timer(fused_gate_up, graph=True)
                res["nvfp4_gate_up_plain_ms"] = timer(plain_gate_up, graph=True)
                if not down_tile.fused_combine:  # the down time's share that reads the per-slot rows again

                    def combine(ys=ys, slot_rows=routing.slot_rows, y=y):
                        ops._launch_combine(ys, slot_rows, y, pdl=False)

                    res["nvfp4_combine_ms"] = timer(combine, graph=True)
            finally:
                ops.FOLLOW_UP_PDL = True
                ops._grid_token_tiles = None
            res["nvfp4_down_ms"] = res["nvfp4_ms"] - res["nvfp4_gate_up_fused_ms"]
            res["nvfp4_bandwidth_fraction"] = nbytes / bw * 1e3 / res["nvfp4_ms"]
            res["nvfp4_tflops"] = flops / (res["nvfp4_ms"] * 1e-3) / 1e12
            res["fused_epilogue_overhead"] = res["nvfp4_gate_up_fused_ms"] / res["nvfp4_gate_up_plain_ms"] - 1
            row["variants"][label] = res
            if vi == 0:
                row.update({k: v for k, v in res.items() if k != "tile"})
                row["tile_tokens"], row["stages"] = tile.tile_tokens, tile.stages
        if t in extra_tokens:  # A/B of the off-table tilings (EXTRA_TILES) of a width that suits this T
            row["extra_tiles_ms"] = {}
            for tl in codegen.EXTRA_TILES:
                if (tl.tile_tokens <= 32) != (m / e <= 32):
                    continue

                def layer(tl=tl):
                    up = ops.moe_gate_up(x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a,
                                         validate=False, out=up_out, tile=tl)
                    ops.moe_down(up.a_next, w_down, routing, row_scale=up.q.scale, validate=False, out=y,
                                 slot_workspace=ys, tile=tl)
                row["extra_tiles_ms"][tile_label(tl)] = timer(layer, graph=True)
            print(f"{shape.name:16s} T={t:6d} extra tiles (layer ms): "
                  + ", ".join(f"{k} {v:.4f}" for k, v in row["extra_tiles_ms"].items()), flush=True)
        if sweep_tiles:  # justify the tile table: every tile on this T
            from trace_kernels.codegen.ops.moe_gemm import TILE_TABLE
            row["gate_up_fused_ms_by_tile"], row["down_ms_by_tile"] = {}, {}
            for _, tl in TILE_TABLE:
                row["gate_up_fused_ms_by_tile"][tl.tile_tokens] = timer(lambda: ops.moe_gate_up(
                    x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a, validate=False,
                    out=up_out, tile=tl), graph=True)
                row["down_ms_by_tile"][tl.tile_tokens] = timer(lambda: ops.moe_down(
                    up_out.a_next, w_down, routing, row_scale=up_out.q.scale, validate=False, out=y,
                    slot_workspace=ys, tile=tl), graph=True)
        row["nvfp4_bytes"] = nbytes
        row["roofline_ms"] = nbytes / bw * 1e3
        xs = x[routing.row_index.long()]  # [M, H] sorted rows (gathered once, outside the timing)
        offs = routing.offsets[1:].contiguous()
        hmid = torch.randn(m, i, device="cuda", generator=gen).to(torch.bfloat16)
        try:
            def bf16_layer():
                torch._grouped_mm(xs, bf_up.transpose(1, 2), offs=offs)
                torch._grouped_mm(hmid, bf_down.transpose(1, 2), offs=offs)
            row["bf16_grouped_mm_eager_ms"] = timer(bf16_layer)
            row["bf16_grouped_mm_ms"] = timer(bf16_layer, graph=True)
            row["speedup_vs_bf16"] = row["bf16_grouped_mm_ms"] / row["nvfp4_ms"]
            row["bf16_tflops"] = flops / (row["bf16_grouped_mm_ms"] * 1e-3) / 1e12
            for res in row["variants"].values():
                res["speedup_vs_bf16"] = row["bf16_grouped_mm_ms"] / res["nvfp4_ms"]
        except Exception as exc:  # report, do not hide
            row["bf16_grouped_mm_error"] = f"{type(exc).__name__}: {exc}"[:300]
        per_variant = " | ".join(
            f"{v} {r['nvfp4_ms']:.4f} ms ({100 * r['nvfp4_bandwidth_fraction']:.0f}% bw, "
            f"x{r.get('speedup_vs_bf16', float('nan')):.2f}, fused {r['nvfp4_gate_up_fused_ms']:.4f} "
            f"plain {r['nvfp4_gate_up_plain_ms']:.4f}"
            + (f" combine {r['nvfp4_combine_ms']:.4f}" if "nvfp4_combine_ms" in r else "") + ")"
            for v, r in row["variants"].items())
        print(f"{shape.name:16s} T={t:6d} roofline {row['roofline_ms']:.4f} ms bf16 "
              f"{row.get('bf16_grouped_mm_ms', float('nan')):.4f} ms | {per_variant}"
              + (f" by tile gate_up {row['gate_up_fused_ms_by_tile']} down {row['down_ms_by_tile']}" if sweep_tiles else ""),
              flush=True)
        rows.append(row)
    return rows


def print_table(results: list[dict]) -> None:
    """Summary: per (shape, T) the roofline, BF16, and each variant's layer time, % of copy, speedup,
    fused-epilogue overhead."""
    variants = list(results[0]["variants"]) if results else []
    head = "shape            T      roof_ms  bf16_ms " + " ".join(f"{v:>6s}_ms %bw   xbf16 epi%" for v in variants)
    print(head)
    for r in results:
        cells = " ".join(f"{r['variants'][v]['nvfp4_ms']:9.4f} {100 * r['variants'][v]['nvfp4_bandwidth_fraction']:4.0f}"
                         f" {r['variants'][v].get('speedup_vs_bf16', float('nan')):6.2f}"
                         f" {100 * r['variants'][v]['fused_epilogue_overhead']:4.0f}" for v in variants)
        print(f"{r['shape']:16s} {r['tokens']:6d} {r['roofline_ms']:8.4f} {r.get('bf16_grouped_mm_ms', float('nan')):8.4f} "
              + cells)


def shape_list(text: str) -> list[str]:
    """--shapes: presets or config.json paths separated by commas; custom shapes ('E=..,H=..', which hold commas
    themselves) separated by semicolons."""
    return [s.strip() for s in text.split(";" if "=" in text else ",") if s.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3-30b-a3b,qwen3-235b-a22b",
                        help="presets or config.json paths, comma-separated; or custom shapes "
                             "'E=..,H=..,I=..,k=..,hq=..,hkv=..,hd=..' separated by ';'")
    parser.add_argument("--tokens", default="1,8,32,64,128,256,1024,4096,16384")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="profiling/results/moe_gemm_h200.json")
    parser.add_argument("--sweep-tiles", default="", help="shapes whose T also run every v1 table tile")
    parser.add_argument("--variants", default="v1,ws",
                        help="kernel variants to time (codegen TILE_TABLES keys; KEY:nopdl = without programmatic "
                             "dependent launches between the layer's kernels; KEY:loose / KEY:exact = the GEMMs' "
                             "grids on the token-tile bound before 2026-12-05 / on the real token tiles)")
    parser.add_argument("--extra-tokens", default="", help="T values that also time EXTRA_TILES (every shape)")
    parser.add_argument("--down-tiles", default="",
                        help="down tiles the --variants entries KEY:downJ run (sweep_moe_gemm_tiles.py --tiles format)")
    parser.add_argument("--no-warm-point", dest="warm_point", action="store_false",
                        help="skip the untimed first pass over the first shape's first T (without it the first arm "
                             "there ran 2-4%% slow on the H200, docs/moe_gemm.md)")
    args = parser.parse_args(argv)
    from sweep_moe_gemm_tiles import explicit_tiles  # (it imports this module: not at the top)
    down_tiles = explicit_tiles(args.down_tiles)
    for label in args.variants.split(","):
        variant_arm(label, down_tiles)  # bad entries fail before any timing
    shape_names = shape_list(args.shapes)
    try:
        resolved = [shapes.resolve(name) for name in shape_names]  # so do bad shapes
    except ValueError as error:
        parser.error(str(error))
    setup = timing_setup(args.reps)
    if setup is None:
        return 2
    timer, gen, bw = setup
    results = []
    extra = tuple(int(t) for t in args.extra_tokens.split(",") if t)
    token_list = [int(t) for t in args.tokens.split(",")]
    if args.warm_point:  # the same work as the first point, results dropped
        bench_shape(resolved[0], token_list[:1], timer, bw, gen, False, args.variants.split(","), (), down_tiles)
    for name, shape in zip(shape_names, resolved):
        results += bench_shape(shape, token_list, timer, bw, gen,
                               name in args.sweep_tiles.split(","), args.variants.split(","),
                               extra, down_tiles)
        with open(args.out + ".partial", "w") as f:  # survive a time-out of the next shape
            json.dump(results, f, indent=1)
        torch.cuda.empty_cache()
    report = {"gpu": torch.cuda.get_device_name(), "date": utc_now(),
              "commit": git_commit(), "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
              "torch": torch.__version__, "copy_bandwidth_bytes_per_s": bw, "reps": args.reps,
              "moe_tables": env.get("MOE_TABLES"),  # tuned tile tables auto's calls used (trace_kernels.moe_tables)
              "moe_builtin_tables": [f"{kind} E={e} N={n} K={k}: {os.path.basename(source)}"  # and the shipped ones
                                     for (kind, e, n, k), source, _, replaced in moe_tables.builtin() if not replaced],
              "results": results}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print_table(results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
