"""Compile the MoE GEMM kernels of the given presets into the JIT cache, in parallel; print ptxas.

Also builds the off-table tilings (EXTRA_TILES) that tests/gpu/test_moe_gemm.py exercises and the
benchmark's --extra-tokens times, for every preset given, so neither compiles one by one. Both variants'
table kernels come from specs_for_shape(shape, every variant). Usage: moe_prebuild.py [--jobs N] PRESET...
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

from trace_kernels import jit, shapes
from trace_kernels.codegen.ops import moe_gemm as codegen
from trace_kernels.jit import compiler

EXTRA_TILES = codegen.EXTRA_TILES


def main() -> int:
    args = sys.argv[1:]
    jobs = 16
    if args[:1] == ["--jobs"]:
        jobs, args = int(args[1]), args[2:]
    specs = {}
    for name in args or ["tiny"]:
        shape = shapes.resolve(name)
        for spec in codegen.specs_for_shape(shape, tuple(codegen.TILE_TABLES)):
            specs[spec.name] = spec
        for tile in EXTRA_TILES:
            for kind in codegen.CALL_KINDS:
                fitted = codegen.fit_chunks(tile, codegen.gemm_dims(shape, kind)[1])  # as the op launches it
                spec = codegen.gemm_spec(shape, codegen.launched_kind(kind, fitted), fitted)
                specs[spec.name] = spec
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        entries = list(pool.map(jit.build, specs.values()))
    serialized = []
    for spec, entry in zip(specs.values(), entries):
        report = (entry.folder / "ptxas.txt").read_text()
        lines = [ln.strip() for ln in report.splitlines() if "registers" in ln or "stack frame" in ln]
        print(spec.name, entry.cubin, "|", " | ".join(lines))
        if compiler.parse_ptxas(report).wgmma_serialized:
            serialized.append(spec.name)
    print(f"serialized wgmma (ptxas C751x) in {len(serialized)} kernels: {serialized}")
    print(f"built {len(specs)} kernels in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
