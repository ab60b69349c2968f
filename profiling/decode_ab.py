"""Same-process A/B of NVFP4 decode kernel builds: bitwise equality of their outputs, then their speed.

    python profiling/decode_ab.py --arm base=.ab_base/cuda/include --arm new=cuda/include \\
        --out profiling/results/attention_decode_ab_h200.json

Each arm is the decode kernel of --variant (at --heads, issue 5's shape Hq 32 / Hkv 4 / D 128 / P 16 by default)
compiled against its own header tree (NAME=INCLUDE_DIR[:MACRO,...], the folder holding trace_kernels/; macros become
-D flags), so two commits' headers run in one process with the same Python launcher and the same inputs. A tree's
DecodeParams must be a prefix of this launcher's (attention_decode_params.cuh says which trees match). First every arm
decodes the same random cases (random lengths, shuffled pages, split counts from 1 to the planner's) and the outputs
of every arm must be equal bit for bit to the first arm's (--allow-different to time arms whose numerics differ; the
error against the FP32 reference is printed for every arm). Then ROUNDS rounds time bench_attention's four cases per
arm (CUDA-graph medians), the arm order reversed every other round, at the planner's split count (each arm's from its
own kernel's occupancy, so arms whose occupancy differs split differently) and at each of --split-counts. (Arms NAME=DIR@RATE and +fused, the uneven split plan and the in-kernel split merge, went with those
on 2026-12-05.)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

import bench_attention as bench  # this folder (scripts run as python profiling/...)
from trace_kernels import attention, runtime
from trace_kernels.codegen.ops import decode_attention as codegen
from trace_kernels.jit import compiler
from trace_kernels.testing.provenance import git_commit, utc_now


def build_arm(spec, include_dir: str, macros: list[str], workdir: Path) -> runtime.CudaKernel:
    # the arm's folder first: every "trace_kernels/..." include resolves there
    cubin, report = compiler.compile_spec(spec, workdir, [f"-I{Path(include_dir).resolve()}",
                                                          *(f"-D{m}" for m in macros)])
    print(f"  {include_dir} {macros}: {report.registers} registers, spills {report.spill_stores}/{report.spill_loads}")
    return runtime.CudaKernel(spec.name, cubin.read_bytes())


class Arm(NamedTuple):
    name: str
    include_dir: str
    macros: list[str]


def parse_arm(text: str) -> Arm:
    """NAME=DIR[:MACRO,...]."""
    name, eq, rest = text.partition("=")
    folder, _, macros = rest.partition(":")
    if not eq or not name or not folder:
        raise ValueError(f"--arm {text!r}: expected NAME=DIR[:MACRO,...]")
    return Arm(name, folder, [m for m in macros.split(",") if m])


def bitwise_cases(generator: torch.Generator) -> list[dict]:
    """(B, max length, splits) with random lengths and shuffled pages; splits None = the planner's ((8, 16384) and
    (2, 131072): one wave of two CTAs per SM)."""
    cases = []
    for batch, max_len, splits in ((3, 5000, None), (2, 40000, None), (8, 8192, None), (5, 3000, 1), (4, 20000, 7),
                                   (1, 131072, None), (6, 777, None), (8, 16384, None), (2, 131072, None)):
        data = bench.make_set("nvfp4", batch, max_len, generator)
        data["lengths"] = torch.randint(1, max_len + 1, (batch,), generator=generator).to(torch.int32).cuda()
        cases.append({"batch": batch, "max_len": max_len, "splits": splits, "data": data})
    return cases


def decode(data: dict, variant: str, splits: int | None) -> torch.Tensor:
    return attention.decode_attention(data["q"], data["k"], data["v"], data["table"], data["lengths"],
                                      check_values=False, variant=variant, num_splits=splits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", action="append", required=True, metavar="NAME=DIR[:MACRO,...]")
    parser.add_argument("--variant", default=None, help="NVFP4 decode variant (default: attention.default_variant)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--split-counts", default="", metavar="S,...", help="also time these split counts")
    parser.add_argument("--allow-different", action="store_true", help="time arms whose outputs differ")
    parser.add_argument("--heads", default=None, metavar="HQxHKVxDxP", help="head shape (bench_attention.py --heads)")
    parser.add_argument("--out", default="profiling/results/attention_decode_ab_h200.json")
    args = parser.parse_args()
    if args.heads:
        bench.set_heads(args.heads)
    variant = args.variant or attention.default_variant("nvfp4", bench.HQ, bench.HKV, bench.D, bench.P)
    spec = codegen.spec("nvfp4", bench.HQ, bench.HKV, bench.D, bench.P, variant)
    try:
        settings = {arm.name: arm for arm in map(parse_arm, args.arm)}
    except ValueError as error:
        parser.error(str(error))
    arms: dict[str, runtime.CudaKernel] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in settings.values():
            arms[arm.name] = build_arm(spec, arm.include_dir, arm.macros, Path(tmp))

    g = torch.Generator().manual_seed(2026_12_04)
    cases = bitwise_cases(g)
    outputs: dict[str, list[torch.Tensor]] = {}
    errors: dict[str, list[float]] = {}
    for name, kernel in arms.items():
        runtime.install_kernel(kernel)
        outputs[name] = [decode(c["data"], variant, c["splits"]) for c in cases]
        errors[name] = []
        for c, out in zip(cases, outputs[name]):
            d = c["data"]
            ref = attention.decode_attention_reference(d["q"], d["k"], d["v"], d["table"], d["lengths"])
            errors[name].append(float((out.float() - ref).norm() / ref.norm()))
        print(f"{name}: relative error against the FP32 reference {max(errors[name]):.2e} (worst case)")
    if max(max(e) for e in errors.values()) > 1e-2:  # a wrong split plan is off by far more (GPU tests: < 3e-3)
        raise SystemExit("an arm is off the FP32 reference")
    first = next(iter(arms))
    equal = {name: [bool(torch.equal(a, b)) for a, b in zip(outputs[first], outs)] for name, outs in outputs.items()}
    for name, flags in equal.items():
        print(f"{name} bitwise equal to {first}: {flags}")
    if not all(all(f) for f in equal.values()) and not args.allow_different:
        raise SystemExit("outputs differ between arms (pass --allow-different to time them anyway)")
    del cases, outputs

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    timings: list[dict] = []
    order = list(arms)
    for rnd in range(args.rounds):
        for name in order:
            runtime.install_kernel(arms[name])
            for batch, length in bench.CASES:
                for splits in [None, *(int(x) for x in args.split_counts.split(",") if x)]:
                    r = bench.bench_paged("nvfp4", batch, length, l2, variant=variant, num_splits=splits)
                    timings.append({"round": rnd + 1, "arm": name, "batch": batch, "length": length, "ms": r["ms"],
                                    "tb_per_s": r["tb_per_s"], "splits": r["splits"], "planned": splits is None,
                                    "tiles_per_split": r["tiles_per_split"]})
                    print(f"round {rnd + 1} {name:>8} {batch:3d} x {length:6d}: {r['ms'] * 1e3:7.1f} us "
                          f"({r['tb_per_s']:.2f} TB/s, {r['splits']} splits of {r['tiles_per_split']} tiles"
                          f"{'' if splits else ', planned'})", flush=True)
        order.reverse()
    out = {"gpu": torch.cuda.get_device_name(0), "date": utc_now(), "commit": git_commit(), "variant": variant,
           "kernel": spec.name, "arms": args.arm, "bitwise_equal_to_first_arm": equal, "reference_errors": errors,
           "command": "python profiling/decode_ab.py " + " ".join(f"--arm {a}" for a in args.arm)
           + f" --rounds {args.rounds}" + (f" --variant {args.variant}" if args.variant else "")
           + (f" --split-counts {args.split_counts}" if args.split_counts else "")
           + (f" --heads {args.heads}" if args.heads else ""),
           "shape": {"hq": bench.HQ, "hkv": bench.HKV, "d": bench.D, "page": bench.P},
           "timings": timings}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
