"""Registers and hot-path SASS instructions per element of every memory-kernel variant (no GPU).

    python profiling/sass_hot_path.py                # BF16, D = 2048, every variant
    python profiling/sass_hot_path.py --cuobjdump /tmp/cuobj/bin/cuobjdump

Compiles each kernel twice with the project's nvcc flags: as shipped (the ptxas report: registers,
spills, stack) and from a copy of cuda/include in which the cold paths are assumed away (non-finite
input, block steps outside the exact-threshold / Markstein ranges, the __fdiv_rn slow path, which
becomes one multiply), so the static SASS is close to what each thread executes. Optional outputs
are fixed per mode: "plain" (no guidance bits / BF16 operand / counters / rollout codes),
"counters" (guided: counters only), "outputs" (quantize: bits + BF16 operand), "all".
Instructions per element: quantize = whole kernel / elements per thread; guided = the difference
between 2 slots per thread and 1 over both bodies of the software-pipelined loop (two register sets
in turn: 2 x 16 elements), the per-element cost without the fixed part.
cuobjdump needs nvdisasm beside it (or on PATH); CUDA's pip wheels nvidia-cuda-cuobjdump and
nvidia-cuda-nvdisasm carry both (unzip them anywhere; do not install into the project's venv).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from trace_kernels import paths
from trace_kernels.codegen.ops import guided_fake_quantize, kv_append, quantize, refit_weights
from trace_kernels.jit import compiler

# (text in cuda/include, replacement) that removes a cold path from the hot-path build
COLD_PATHS = [
    ("t.exact = d >= 0x1p-100f && d <= 0x1p120f;", "t.exact = true;"),
    ("__device__ __forceinline__ bool is_finite(float v) { return fabsf(v) <= 3.402823466e38f; }",
     "__device__ __forceinline__ bool is_finite(float v) { return true; }"),
    ("return Divisor{d, __frcp_rn(d), d >= 0x1p-40f && d <= 0x1p40f};", "return Divisor{d, __frcp_rn(d), true};"),
    ("__device__ __forceinline__ bool fast_divisible(float x) {",
     "__device__ __forceinline__ bool fast_divisible(float x) { return true;"),
    ("__fdiv_rn(", "__fmul_rn("),
    ("const bool fast = c.ok && d != 0.f && !(nonfinite & 0x80008000u);", "const bool fast = true;"),  # guided v3
]
OPTIONAL = ("dequant", "mantissa_bits", "counters", "rollout_codes")
MODE_ON = {"plain": (), "counters": ("counters",), "outputs": ("dequant", "mantissa_bits"), "all": OPTIONAL,
           "full": ("rollout_codes",)}
INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/")


# kv_append only (its own build): rows take the fast block path, and no guidance is written
KV_APPEND_HOT = [
    ("bool row_scale_fast(float s) {", "bool row_scale_fast(float s) { return true;"),
    ("guidance.mantissa_bits != nullptr", "false"),
]


def hot_path_headers(mode: str, into: Path, extra: list[tuple[str, str]] = ()) -> Path:
    shutil.copytree(paths.include_dir(), into)
    for header in (into / "trace_kernels").glob("*.cuh"):
        text = header.read_text()
        for old, new in [*COLD_PATHS, *extra]:
            text = text.replace(old, new)
        for name in OPTIONAL:
            text = re.sub(rf"(?<![\w.]){name} != nullptr", "true" if name in MODE_ON[mode] else "false", text)
        header.write_text(text)
    return into


def compile_spec(spec, include: list[str], folder: Path, cuobjdump: str | None) -> tuple[compiler.PtxasReport, int]:
    source = folder / f"{spec.name}.cu"
    source.write_text(spec.render())
    cubin = source.with_suffix(".cubin")
    result = subprocess.run(["nvcc", *compiler.flags(spec), *include, "-o", str(cubin), str(source)],
                            capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(result.stdout + result.stderr)
    count = 0
    if cuobjdump:
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True).stdout
        count = sum(1 for line in sass.splitlines() if INSTRUCTION.match(line))
    return compiler.parse_ptxas(result.stdout + result.stderr), count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--d", type=int, default=2048)
    args = parser.parse_args(argv)
    if args.cuobjdump:
        os.environ["PATH"] = str(Path(args.cuobjdump).parent) + os.pathsep + os.environ["PATH"]
    else:
        print("no cuobjdump: registers only", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="sass_hot_path_"))
    includes = {mode: [f"-I{hot_path_headers(mode, work / f'include_{mode}')}"] for mode in MODE_ON}
    shipped = compiler.include_flags(quantize.spec(args.dtype, args.d))

    def per_element(spec, mode, slots_param=None, elements=None, slot_elements=8, slot_pair=(2, 4), bodies=1,
                    extra_params=None):
        if slots_param is None:
            return compile_spec(spec, includes[mode], work, args.cuobjdump)[1] / elements
        counts = []
        for slots in slot_pair:  # the slot difference drops the fixed per-thread part
            variant = dataclasses.replace(spec, name=f"{spec.name}_s{slots}",
                                          params={**spec.params, slots_param: slots, **(extra_params or {})})
            counts.append(compile_spec(variant, includes[mode], work, args.cuobjdump)[1])
        return (counts[1] - counts[0]) / ((slot_pair[1] - slot_pair[0]) * slot_elements * bodies)

    print(f"{'kernel':48s} {'regs':>4s} {'spill':>5s} {'stack':>5s}  hot-path SASS per element")
    for v in quantize.VARIANTS:
        spec = quantize.spec(args.dtype, args.d, v)
        report, _ = compile_spec(spec, shipped, work, None)
        tpr = spec.params["tpr"]
        elements = -(-(args.d // 16) // tpr) * 16
        cells = {mode: per_element(spec, mode, elements=elements) for mode in ("plain", "outputs")}
        print(f"{spec.name:48s} {report.registers:4d} {report.spill_stores:5d} {report.stack_frame:5d}  "
              + "  ".join(f"{mode} {value:.1f}" for mode, value in cells.items()))
    labels = {"plain": "compact", "counters": "compact+counters", "all": "full+counters", "full": "full"}
    # (spec, mode counted): one kernel per guidance mode (v6's for the trainer's call, v7's for the others)
    guided = [(guided_fake_quantize.spec(args.dtype, args.d, mode=mode), (hot,))
              for mode, hot in (("compact", "plain"), ("compact_counters", "counters"), ("full", "full"),
                                ("full_counters", "all"))]
    for spec, modes in guided:
        report, _ = compile_spec(spec, shipped, work, None)
        slot_elements = spec.launch["elements_per_unit"]
        pipelined = {"slot_pair": (1, 2), "bodies": 2} if spec.params["variant"] >= 4 else {}  # v4's loop
        if spec.params["variant"] >= 5:  # 2 slots would spill at their occupancy: count them at 2 CTAs per SM
            pipelined["extra_params"] = {"min_ctas_per_sm": 2}
        cells = {mode: per_element(spec, mode, slots_param="slots", slot_elements=slot_elements, **pipelined)
                 for mode in modes}
        print(f"{spec.name:48s} {report.registers:4d} {report.spill_stores:5d} {report.stack_frame:5d}  "
              + "  ".join(f"{labels[m]} {x:.1f}" for m, x in cells.items()))
    for v in refit_weights.VARIANTS:
        spec = refit_weights.spec(args.dtype, v)
        report, _ = compile_spec(spec, shipped, work, None)
        elements = spec.params["slots"] * 8  # per thread per tile
        total = compile_spec(spec, includes["plain"], work, args.cuobjdump)[1]
        print(f"{spec.name:48s} {report.registers:4d} {report.spill_stores:5d} {report.stack_frame:5d}  "
              f"whole kernel {total} SASS for {elements} elements per thread and tile (both phases)")
    # kv_append (Hkv 4, D 128, no guidance): blocks per thread 2 and 4 differ by 2 blocks per thread
    kv_include = [f"-I{hot_path_headers('plain', work / 'include_kv_append', KV_APPEND_HOT)}"]
    counts = {}
    for v in ("b2", "b4"):
        spec = kv_append.spec("nvfp4", 4, 128, v)
        report, _ = compile_spec(spec, shipped, work, None)
        counts[v] = compile_spec(spec, kv_include, work, args.cuobjdump)[1]
        print(f"{spec.name:48s} {report.registers:4d} {report.spill_stores:5d} {report.stack_frame:5d}  "
              f"whole kernel {counts[v]} SASS for {kv_append.VARIANTS[v] * 16} elements per thread")
    print(f"{'kv_append hot path':48s} {'':16s}  {(counts['b4'] - counts['b2']) / 2:.0f} SASS per 16-element block")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
