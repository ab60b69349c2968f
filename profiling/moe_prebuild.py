"""Compile the MoE GEMM kernels of the given presets into the JIT cache, in parallel; print ptxas.

Builds every table's kernels (specs_for_shape over TILE_TABLES, or --tables T1,T2), the quantize kernels the
quantize_after tiles launch, and the off-table tilings (EXTRA_TILES) that tests/gpu/test_moe_gemm.py exercises
and the benchmark's --extra-tokens times (not with --no-extras), so none compiles one by one. Lists the kernels
ptxas serialized (its C751x wgmma notes). With the extras and `tiny` (the tests' preset) it also builds the auto
table of moe_testing.ODD_CHUNKS_SHAPE (and its top-1 combine), which a GPU test launches.
With --tiles (sweep_moe_gemm_tiles.py's format, ';'-separated) it also builds those tilings' fused gate_up (as
launched) and down kernels, so a sweep on the GPU finds them in the cache.
Usage: moe_prebuild.py [--jobs N] [--tables T1,T2] [--no-extras] [--tiles TILES] PRESET...
"""

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from trace_kernels import jit, shapes
from trace_kernels.codegen.ops import moe_gemm as codegen
from trace_kernels.codegen.ops import quantize
from trace_kernels.jit import compiler

EXTRA_TILES = codegen.EXTRA_TILES


def launched_specs(shape, tiles, label: str | None = None) -> dict:
    """{name: spec} of each tile's kernels for every call kind, as the ops launch them (fit_chunks, launched_kind); a
    tile a kind cannot take (e.g. a resident activation tile larger than its K allows) is skipped, and named when a
    label is given."""
    specs = {}
    for tile in tiles:
        for kind in codegen.CALL_KINDS:
            fitted = codegen.fit_chunks(tile, codegen.gemm_dims(shape, kind)[1])
            try:
                spec = codegen.gemm_spec(shape, codegen.launched_kind(kind, fitted), fitted)
            except ValueError as exc:
                if label is not None:
                    print(f"skip {label} {kind} {fitted}: {exc}")
                continue
            specs[spec.name] = spec
    return specs


def kernel_specs(presets: list[str], tables: tuple[str, ...], extras: bool = True, tiles: str = "") -> dict:
    """{name: spec} of the MoE kernels main() builds (the GPU tests' set with extras and `tiny`); also
    prebuild_device_caches.py's `moe_tests` set."""
    specs = {}
    if tiles:
        from sweep_moe_gemm_tiles import explicit_tiles  # (imports torch)
        sweep_tiles = explicit_tiles(tiles)
    else:
        sweep_tiles = []
    for name in presets:
        shape = shapes.resolve(name)
        for spec in codegen.specs_for_shape(shape, tables) + quantize.specs_for_shape(shape):
            specs[spec.name] = spec
        for tile in sweep_tiles:
            for kind in ("gate_up_swiglu", "down_routed"):
                try:
                    spec = codegen.gemm_spec(shape, codegen.launched_kind(kind, tile), tile)
                except ValueError as exc:
                    print(f"skip {name} {kind} {tile}: {exc}")
                    continue
                specs[spec.name] = spec
        specs.update(launched_specs(shape, EXTRA_TILES if extras else (), name))
    if extras and "tiny" in presets:
        from trace_kernels.moe_testing import ODD_CHUNKS_SHAPE as odd  # (imports torch)
        for spec in codegen.specs_for_shape(odd, ("auto",)) + quantize.specs_for_shape(odd):
            specs[spec.name] = spec
        top1 = codegen.combine_spec(codegen.MoEDims(odd.experts, odd.hidden, odd.intermediate, 1))  # (its top-1 case)
        specs[top1.name] = top1
    return specs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--tables", default="", help="TILE_TABLES keys, comma separated (default: all)")
    parser.add_argument("--no-extras", dest="extras", action="store_false", help="skip EXTRA_TILES")
    parser.add_argument("--tiles", default="", help="explicit tilings, as sweep_moe_gemm_tiles.py --tiles takes them")
    parser.add_argument("presets", nargs="*", default=["tiny"])
    args = parser.parse_args()
    tables = tuple(args.tables.split(",")) if args.tables else tuple(codegen.TILE_TABLES)
    specs = kernel_specs(args.presets, tables, args.extras, args.tiles)
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        entries = list(pool.map(jit.build, specs.values()))
    serialized = []
    for spec, entry in zip(specs.values(), entries):
        report = (entry.folder / "ptxas.txt").read_text()
        lines = [ln.strip() for ln in report.splitlines() if "registers" in ln or "stack frame" in ln]
        print(spec.name, entry.cubin, "|", " | ".join(lines))
        if getattr(compiler.parse_ptxas(report), "wgmma_serialized", ()):  # (older trees: no such field)
            serialized.append(spec.name)
    print(f"serialized wgmma (ptxas C751x) in {len(serialized)} kernels: {serialized}")
    print(f"built {len(specs)} kernels in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
