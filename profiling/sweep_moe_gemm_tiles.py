"""Sweep MoE GEMM tilings (TN, stages, min CTAs/SM, warpgroups) per token count; pick TILE_TABLE rows.

    python profiling/sweep_moe_gemm_tiles.py --shape qwen3-30b-a3b --tokens 8,64,128,1024,16384 \
        --out profiling/results/moe_gemm_tile_sweep_h200.json

With --write-tables FILE it also writes the fastest tile per token count and swept GEMM as a tuned tables file
(trace_kernels.moe_tables): TRACE_KERNELS_MOE_TABLES=FILE then makes "auto" calls of that shape use it.

Builds every candidate kernel first (in parallel), then times the fused gate_up and the down GEMM
(+ combine) of each candidate as CUDA-graph replays, L2 flushed before each repetition, on one
random routing per T. Candidates that do not fit (shared memory) are skipped with the reason.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import itertools
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import torch

from bench_moe_gemm import Timer, random_packed_weights  # profiling/ is the script's folder
from trace_kernels import jit, moe_gemm as ops, moe_tables, shapes
from trace_kernels.codegen.ops import moe_gemm as codegen
from trace_kernels.moe_routing import route
from trace_kernels.moe_slot_rows import empty_slot_rows
from trace_kernels.moe_testing import random_topk
from trace_kernels.testing.provenance import git_commit, utc_now

# --tiles tuning: the tiles of auto's bands (the ws tiles below 1/8 routed row per expert, the one-warpgroup one with
# row_amax as auto's fused gate_up runs it (the other kinds' kernels ignore the knob), the one-warpgroup and
# weights-direct TN=8 tiles, the v1 rings gathering whole activation pieces, the prefill ring with and without
# step_pipeline, the prefill down GEMM's ws tile) and a stepped TN=64 ring, each v1 fused gate_up quantized afterwards
# as auto's are: the candidates a tuned table for another shape picks from (run_gpu_checks_moe_tuned_tables.sh)
TUNING_TILES = ("tile_tokens=8,stages=5,min_blocks=3,warpgroups=1,variant=ws,chunks_per_stage=2,row_amax=1;"
                "tile_tokens=8,stages=5,min_blocks=2,warpgroups=2,variant=ws,chunks_per_stage=2;"
                "tile_tokens=8,stages=4,min_blocks=4,warpgroups=1,quantize_after=1;"
                "tile_tokens=8,stages=1,min_blocks=8,warpgroups=1,weights_direct=3,quantize_after=1;"
                "tile_tokens=8,stages=2,chunks_per_stage=4,fused_min_blocks=4,quantize_after=1;"
                "tile_tokens=16,stages=2,chunks_per_stage=4,fused_min_blocks=4,n_step=8,quantize_after=1;"
                "tile_tokens=32,stages=2,chunks_per_stage=4,fused_min_blocks=4,n_step=8,quantize_after=1,gather_pieces=1;"
                "tile_tokens=32,stages=3,chunks_per_stage=2,fused_min_blocks=4,n_step=8,quantize_after=1,gather_pieces=1;"
                "tile_tokens=64,stages=4,n_step=8,quantize_after=1,gather_pieces=1;"
                "tile_tokens=128,stages=2,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1;"
                "tile_tokens=128,stages=2,chunks_per_stage=2,n_step=16,quantize_after=1,gather_pieces=1,"
                "step_pipeline=1;"
                "tile_tokens=128,stages=4,min_blocks=1,warpgroups=2,variant=ws,m_tiles=2,quantize_after=1")


def candidates(grid: dict, experts: int, k: int) -> list[codegen.TileConfig]:
    out = []
    keys = ("variant", "tile_tokens", "stages", "min_blocks", "warpgroups", "proxy_fence", "overlap",
            "chunks_per_stage", "m_tiles")
    for variant, tn, st, mb, wg, pf, ov, cps, mt in itertools.product(*(grid[k] for k in keys)):
        if variant == "v1" and mt != 1:  # ws-only knob
            continue
        if mt > 1 and ov:  # ws: two m tiles overlap within the stage instead
            continue
        if mt * tn > 256:  # accumulators alone would pass the consumer's register budget
            continue
        if variant == "ws" and not pf:  # v1-only knob
            continue
        tile = codegen.TileConfig(tn, st, mb, wg, bool(pf), bool(ov), variant, cps, mt)
        if ov and variant == "v1" and st < 3:
            continue
        if (codegen.smem_bytes(tile, wg, experts, k) + 1024) * mb <= 228 * 1024:  # min_blocks CTAs must fit an SM
            out.append(tile)
    return out


def explicit_tiles(text: str) -> list[codegen.TileConfig]:
    """'field=value,...;...' -> TileConfigs (ints; variant as text; booleans as 0/1)."""
    types = {f.name: f.type for f in dataclasses.fields(codegen.TileConfig)}
    tiles = []
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        fields = {}
        for item in entry.split(","):
            key, _, value = item.partition("=")
            if key not in types:
                raise ValueError(f"--tiles: unknown TileConfig field {key!r} in {entry!r}")
            kind = types[key] if isinstance(types[key], str) else types[key].__name__
            fields[key] = value if kind == "str" else bool(int(value)) if kind == "bool" else int(value)
        tiles.append(codegen.TileConfig(**fields))
    return tiles


def shape_tiles(shape, listed: list[codegen.TileConfig], kinds: tuple[str, ...]) -> list[codegen.TileConfig]:
    """The listed tiles that build for every swept GEMM of the shape (the others printed and skipped); a v1 ring whose
    stages of chunks do not divide a K (odd chunk counts) as stages of one chunk, as auto runs it."""
    tiles = []
    for t in dict.fromkeys(codegen.fit_chunks(codegen.fit_chunks(t, shape.hidden), shape.intermediate)
                           for t in listed):
        try:  # e.g. chunks_per_stage=2 or overlap needs K multiples that a shape may not have
            for kind in kinds:
                codegen.gemm_spec(shape, codegen.launched_kind(kind, t), t)
            tiles.append(t)
        except ValueError as exc:
            print(f"skip {t}: {exc}")
    return tiles


def tile_text(tile: codegen.TileConfig) -> str:
    """A tile in --tiles form: tile_tokens, stages and the fields that differ from their defaults (explicit_tiles reads
    it back)."""
    fields = dataclasses.fields(codegen.TileConfig)
    items = [(f.name, getattr(tile, f.name)) for f in fields
             if f.name in ("tile_tokens", "stages") or getattr(tile, f.name) != f.default]
    return ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in items)


def summarize_log(lines) -> list[str]:
    """A sweep log's timed rows ("T=  4096 TileConfig(...) gate_up ... ms down ... ms ...") with each tile in --tiles
    form, so that a device script prints them short whatever knobs the tiles set."""
    out = []
    for line in lines:
        head, sep, rest = line.partition(" TileConfig(")
        if not sep or not head.startswith("T="):
            continue
        call, _, tail = ("TileConfig(" + rest).partition(") ")
        node = ast.parse(call + ")", mode="eval").body
        tile = codegen.TileConfig(**{kw.arg: ast.literal_eval(kw.value) for kw in node.keywords})
        out.append(f"{head} {tile_text(tile)} {tail.strip()}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-30b-a3b")
    parser.add_argument("--tokens", default="8,64,128,1024,16384")
    parser.add_argument("--tile-tokens", default="8,16,32,64,128,256")
    parser.add_argument("--stages", default="4,8")
    parser.add_argument("--min-blocks", default="1,2,4")
    parser.add_argument("--warpgroups", default="1,2")
    parser.add_argument("--proxy-fence", default="1", help="1,0 also tries the kernels without fence.proxy.async")
    parser.add_argument("--overlap", default="0,1", help="0: wgmma.wait 0 per chunk; 1: overlapped main loop")
    parser.add_argument("--variant", default="v1", help="v1,ws: kernel variants (ws adds the knob below)")
    parser.add_argument("--chunks-per-stage", default="1", help="ws: K chunks of 64 per ring stage (1,2)")
    parser.add_argument("--m-tiles", default="1", help="ws: 64-row weight tiles per consumer warpgroup (1,2)")
    parser.add_argument("--kinds", default="gate_up_swiglu,down_routed",
                        help="GEMMs whose tilings are swept; with down_routed alone the gate_up that feeds it runs "
                             "the table tile (untimed)")
    parser.add_argument("--tiles", default="",
                        help="explicit TileConfig fields instead of the grid, tiles separated by ';', e.g. "
                             "'tile_tokens=32,stages=6,quantize_after=1;tile_tokens=32,stages=3,chunks_per_stage=2'; "
                             "'tuning': TUNING_TILES")
    parser.add_argument("--check-bitwise", action="store_true",
                        help="also compare every tile's outputs (the gate_up's h, quantized rows and guidance bits, the "
                             "down GEMM's combined output) with the first tile's at each T, bit for bit: all tilings "
                             "give the same bits by design, so a new tiling is checked against a tested one")
    parser.add_argument("--summarize", metavar="LOG", default="",
                        help="print LOG's timed rows with each tile in --tiles form, and exit (no GPU needed)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", default="profiling/results/moe_gemm_tile_sweep_h200.json")
    parser.add_argument("--write-tables", default="", metavar="FILE",
                        help="also write the fastest tile per token count as a tuned tables file (one entry per swept "
                             "GEMM; trace_kernels.moe_tables)")
    args = parser.parse_args(argv)
    if args.summarize:
        with open(args.summarize) as f:
            print("\n".join(summarize_log(f)))
        return 0
    shape = shapes.resolve(args.shape)
    ints = lambda text: tuple(int(v) for v in text.split(","))  # noqa: E731
    grid = {"tile_tokens": ints(args.tile_tokens), "stages": ints(args.stages), "min_blocks": ints(args.min_blocks),
            "warpgroups": ints(args.warpgroups), "proxy_fence": ints(args.proxy_fence), "overlap": ints(args.overlap),
            "variant": tuple(args.variant.split(",")), "chunks_per_stage": ints(args.chunks_per_stage),
            "m_tiles": ints(args.m_tiles)}
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= {"gate_up_swiglu", "down_routed"} or not kinds:
        parser.error(f"--kinds: gate_up_swiglu and/or down_routed, got {args.kinds!r}")
    sweep_gate_up = "gate_up_swiglu" in kinds
    tile_text = TUNING_TILES if args.tiles == "tuning" else args.tiles
    listed = explicit_tiles(tile_text) if tile_text else candidates(grid, shape.experts, shape.hidden)
    tiles = shape_tiles(shape, listed, kinds)
    specs = [codegen.gemm_spec(shape, codegen.launched_kind(kind, t), t) for t in tiles for kind in kinds]
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(jit.build, specs))
    print(f"built {len(specs)} kernels", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    e, h, i, k = shape.experts, shape.hidden, shape.intermediate, shape.top_k
    w_up, w_down = random_packed_weights(e, 2 * i, h, gen), random_packed_weights(e, h, i, gen)
    timer = Timer(args.reps)
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        routing = route(random_topk(t, e, k, torch.Generator().manual_seed(t)).cuda(), e,
                        torch.softmax(torch.randn(t, k, device="cuda", generator=gen), 1))
        m = routing.num_rows
        x = torch.randn(t, h, device="cuda", generator=gen).to(torch.bfloat16)
        s_a = torch.rand(t, device="cuda", generator=gen) * 1e-2 + 1e-3
        up = ops.empty_gate_up_output(m, i, "cuda")
        ys, y = empty_slot_rows(m, h, "cuda"), torch.empty(t, h, dtype=torch.bfloat16, device="cuda")
        if not sweep_gate_up:  # the down GEMM's input, once, from the table's tile
            ops.moe_gate_up(x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a, validate=False,
                            out=up)
        first_outputs = None
        for tile in tiles:
            if tile.tile_tokens > 8 * max(1, -(-m // e)) * 4:  # far wider than the rows per expert
                continue
            g = timer(lambda: ops.moe_gate_up(x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a,
                                              validate=False, out=up, tile=tile), graph=True) if sweep_gate_up else 0.0
            d = timer(lambda: ops.moe_down(up.a_next, w_down, routing, row_scale=up.q.scale, validate=False, out=y,
                                           slot_workspace=ys, tile=tile), graph=True)
            check = {}
            if args.check_bitwise:  # the outputs of the last timed launches
                outputs = [up.h, up.a_next, up.q.codes, up.q.block_scales, up.q.scale, up.mantissa_bits, y]
                if first_outputs is None:
                    first_outputs = [o.clone() for o in outputs]
                check = {"bitwise_equal_first": all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                                                    for a, b in zip(outputs, first_outputs))}
            rows.append({"tokens": t, "rows": m, **tile.__dict__, "down_ms": d,
                         **({"gate_up_fused_ms": g} if sweep_gate_up else {}), **check})
            print(f"T={t:6d} {tile}" + (f" gate_up {g:.4f} ms" if sweep_gate_up else "") + f" down {d:.4f} ms" +
                  (f" bitwise equal to the first tile: {check['bitwise_equal_first']}" if check else ""), flush=True)
        best = min((r for r in rows if r["tokens"] == t), key=lambda r: r.get("gate_up_fused_ms", 0.0) + r["down_ms"])
        print(f"T={t}: best {best}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "shape": shape.name, "command": " ".join(sys.argv),
                   "results": rows}, f, indent=1)
    if args.write_tables:
        timings = {"gate_up_swiglu": "gate_up_fused_ms", "down_routed": "down_ms"}
        entries = [moe_tables.entry(kind, e, *codegen.gemm_dims(shape, kind),
                                    moe_tables.best_rows(rows, timings[kind], e)) for kind in kinds]
        moe_tables.write(args.write_tables, entries, {"gpu": torch.cuda.get_device_name(), "shape": shape.name,
                                                      "date": utc_now(), "commit": git_commit(),
                                                      "command": " ".join(sys.argv), "sweep": args.out})
        print(f"tables for {', '.join(kinds)} -> {args.write_tables}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
