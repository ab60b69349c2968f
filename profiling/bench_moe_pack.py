"""The RL weight sync's packing step on the GPU: natural NVFP4 expert weights -> the MoE GEMM's packed,
encoded layout, with the moe_pack kernel and with the torch path (moe_layout.store_fragments_), for the
gate_up (interleaved) and down weights of each preset's MoE layer; copy bandwidth in the same run.

    python profiling/bench_moe_pack.py --out profiling/results/moe_pack_h200.json
    python profiling/bench_moe_pack.py --what refit --out profiling/results/refit_packed_h200.json

--what refit times the whole sync from BF16 expert weights w [E, N, K] per weight tensor, same run,
CUDA-graph replays rotating fresh input sets (working set >= 4x L2, trace_kernels.testing.bench):
  two_step   refit_weights into natural-layout staging + moe_pack into the packed buffers (before)
  fused      ops.refit_weights_packed_ (amax pass + quantize-and-pack pass, one op); its amax pass is also
             timed alone, and the quantize pass reported as the difference (on the same minimal bytes)
  copy       w.copy_ into a same-size buffer (read + write counted)
  speculative (--speculative-mixed FRACTION; negative skips it) the op's speculative variants (--speculative-variants,
             default v2), which pack with the previous sync's expert scales as a guess, on fresh weights (every
             guess valid and wrong: their worst case), steady ones (every expert's amax kept: every guess holds) and
             mixed (about FRACTION of the experts' amax moved per call; trace_kernels.testing.weight_sets), and v1 on
             the steady ones; each variant's output after each of four syncs in a row (mixed, then steady sets) is
             compared bit for bit with v1's on the same weights
Bandwidth on minimal bytes = read w once + write the packed codes, scales and per-expert scale once;
fraction = that bandwidth over the copy's. Both paths' outputs are compared bit for bit once.
"""

import argparse
import json
import os
import sys

import torch

from bench_memory_kernels import variant  # profiling/ is the script's folder
from bench_moe_gemm import timing_setup
from trace_kernels import moe_layout, shapes
from trace_kernels.codegen.ops import refit_packed as codegen_packed
from trace_kernels.testing.provenance import git_commit, utc_now


def natural(e: int, n: int, k: int, gen: torch.Generator):
    codes = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)  # [E, N, K/2]
    scales = torch.randint(1, 0x7F, (e, n, k // 16), dtype=torch.uint8, device="cuda", generator=gen)  # [E, N, K/16]
    return codes, scales.view(torch.float8_e4m3fn), torch.rand(e, device="cuda", generator=gen)


def bench_refit(names: list[str], reps: int, gen: torch.Generator, copy_bw: float, mixed: float,
                speculative: tuple[str, ...] = ("v2",)) -> list[dict]:
    """copy_bw: the run's device-to-device copy bandwidth (copy_bandwidth); a row's own copy of w, a
    CUDA-graph memcpy node, runs slower at GB sizes (2.8 TB/s at 3.2 GB), so fractions use the faster.
    mixed >= 0: also time the speculative variants on fresh, steady and mixed weights."""
    from trace_kernels import ops
    from trace_kernels.ops import refit_packed
    from trace_kernels.testing.bench import time_graph, variants_for
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for name in names:
        s = shapes.resolve(name)
        for weight, (n, k, groups) in {"gate_up": (2 * s.intermediate, s.hidden, 2),
                                       "down": (s.hidden, s.intermediate, 1)}.items():
            e = s.experts
            w_bytes = e * n * k * 2
            sets = variants_for(w_bytes, l2)
            ws = [torch.randn(e, n, k, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(sets)]  # fresh
            dst, ref = moe_layout.empty_weights(e, n, k, "cuda"), moe_layout.empty_weights(e, n, k, "cuda")
            staging = ops.allocate_refit_buffers(e, n, k, "cuda")
            sink = torch.empty_like(ws[0])

            def two_step(i):
                ops.refit_weights(ws[i], staging)
                moe_layout.store_fragments_(ref, staging.codes, staging.block_scales, staging.scale, groups)

            copy_ms = time_graph(lambda i: sink.copy_(ws[i]), sets, replays=reps)
            two_step_ms = time_graph(two_step, sets, replays=reps)
            with variant(codegen_packed, "v1"):  # its amax pass and its pack pass (PASSES)
                fused_ms = time_graph(lambda i: ops.refit_weights_packed_(ws[i], dst, groups), sets, replays=reps)
                refit_packed.PASSES = ("amax",)
                try:
                    amax_ms = time_graph(lambda i: ops.refit_weights_packed_(ws[i], dst, groups), sets, replays=reps)
                finally:
                    refit_packed.PASSES = ("amax", "pack")
                two_step(0)
                ops.refit_weights_packed_(ws[0], dst, groups)
            exact = all(torch.equal(a, b) for a, b in zip((dst.codes, dst.block_scales, dst.scale),
                                                           (ref.codes, ref.block_scales, ref.scale)))
            minimal = w_bytes + dst.codes.numel() + dst.block_scales.numel() + 4 * e  # read w + write packed
            row_copy_bw = 2 * w_bytes / (copy_ms * 1e-3)
            ref_bw = max(row_copy_bw, copy_bw)
            row = {"shape": s.name, "weight": weight, "experts": e, "n": n, "k": k, "groups": groups, "sets": sets,
                   "minimal_bytes": minimal, "copy_ms": copy_ms, "row_copy_bytes_per_s": row_copy_bw,
                   "copy_bytes_per_s": ref_bw, "bitexact": exact}
            for what, ms in (("two_step", two_step_ms), ("fused", fused_ms)):
                row[f"{what}_ms"] = ms
                row[f"{what}_bytes_per_s"] = minimal / (ms * 1e-3)
                row[f"{what}_fraction_of_copy"] = minimal / (ms * 1e-3) / ref_bw
            row["amax_pass_ms"] = amax_ms  # the fused op's first launch alone (refit v2's amax pass)
            row["quantize_pass_ms"] = fused_ms - amax_ms  # difference of medians
            row["quantize_pass_fraction_of_copy"] = minimal / ((fused_ms - amax_ms) * 1e-3) / ref_bw
            row["fused_speedup"] = two_step_ms / fused_ms
            row["fused_s_per_gb_bf16"] = fused_ms * 1e-3 / (w_bytes / 1e9)
            if mixed >= 0:
                row.update(bench_speculative(ws, dst, ref, groups, sets, reps, mixed, minimal, ref_bw, speculative))
            rows.append(row)
            print(f"{s.name:16s} {weight:8s} [{e}, {n}, {k}] two-step {two_step_ms:.3f} ms "
                  f"({100 * row['two_step_fraction_of_copy']:.0f}% of copy), fused {fused_ms:.3f} ms "
                  f"({row['fused_bytes_per_s'] / 1e9:.0f} GB/s, {100 * row['fused_fraction_of_copy']:.0f}% of copy, "
                  f"{row['fused_speedup']:.2f}x; quantize pass {row['quantize_pass_ms']:.3f} ms, "
                  f"{100 * row['quantize_pass_fraction_of_copy']:.0f}%), copy {ref_bw / 1e12:.2f} TB/s, bit-exact {exact}",
                  flush=True)
            for name in speculative if mixed >= 0 else ():
                print(f"{'':25s} {name} fresh / steady / mixed ({100 * row['moved_fraction']:.0f}% moved) "
                      f"{row[f'{name}_fresh_ms']:.3f} / {row[f'{name}_steady_ms']:.3f} / {row[f'{name}_mixed_ms']:.3f} ms "
                      f"({100 * row[f'{name}_fresh_fraction_of_copy']:.0f} / "
                      f"{100 * row[f'{name}_steady_fraction_of_copy']:.0f} / "
                      f"{100 * row[f'{name}_mixed_fraction_of_copy']:.0f}% of copy), v1 steady {row['v1_steady_ms']:.3f} "
                      f"ms, bit-exact {row[f'{name}_bitexact']}", flush=True)
            del ws, dst, ref, staging, sink
            torch.cuda.empty_cache()
    return rows


def bench_speculative(ws, dst, ref, groups: int, sets: int, reps: int, mixed: float, minimal: int,
                      ref_bw: float, speculative: tuple[str, ...]) -> dict:
    """The speculative variants on fresh (ws), steady and mixed sets, v1 on the steady ones; each variant's output after
    each of four syncs in a row (its guesses from the one before) compared with v1's (into ref) on the same weights."""
    from trace_kernels import ops
    from trace_kernels.testing.bench import time_graph
    from trace_kernels.testing.weight_sets import mixed_weight_sets, steady_weight_sets
    steady = steady_weight_sets(ws[0], sets)
    mixed_sets, moved = mixed_weight_sets(steady, mixed)
    out = {"moved_fraction": moved}
    timings = [(name, kind, inputs) for name in speculative
               for kind, inputs in (("fresh", ws), ("steady", steady), ("mixed", mixed_sets))]
    for name, kind, inputs in [*timings, ("v1", "steady", steady)]:
        with variant(codegen_packed, name):
            ms = time_graph(lambda i: ops.refit_weights_packed_(inputs[i], dst, groups), sets, replays=reps)
        out[f"{name}_{kind}_ms"] = ms
        out[f"{name}_{kind}_fraction_of_copy"] = minimal / (ms * 1e-3) / ref_bw
    for name in speculative:
        exact = True
        for w in (mixed_sets[-1], mixed_sets[0], steady[-1], steady[0]):  # after each previous sync (its guesses)
            with variant(codegen_packed, name):
                ops.refit_weights_packed_(w, dst, groups)
            with variant(codegen_packed, "v1"):
                ops.refit_weights_packed_(w, ref, groups)
            exact &= all(torch.equal(a, b) for a, b in zip((dst.codes, dst.block_scales, dst.scale),
                                                           (ref.codes, ref.block_scales, ref.scale)))
        out[f"{name}_bitexact"] = exact
    del steady, mixed_sets
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3-30b-a3b,qwen3-235b-a22b")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="profiling/results/moe_pack_h200.json")
    parser.add_argument("--what", default="pack", help="comma list: pack (natural -> packed), refit (the whole sync)")
    parser.add_argument("--speculative-mixed", type=float, default=0.25, metavar="FRACTION",
                        help="--what refit: time the speculative variant too, on mixed weights with about this "
                             "fraction of the experts' amax moved per call (negative: skip)")
    parser.add_argument("--speculative-variants", default="v2",
                        help="--what refit: comma list of the speculative variants to time")
    args = parser.parse_args(argv)
    what = set(args.what.split(","))
    if not what <= {"pack", "refit"}:
        parser.error(f"--what takes pack and/or refit, got {args.what}")
    setup = timing_setup(args.reps)
    if setup is None:
        return 2
    timer, gen, bw = setup
    rows = []
    for name in args.shapes.split(",") if "pack" in what else []:
        s = shapes.resolve(name)
        for weight, (n, k, groups) in {"gate_up": (2 * s.intermediate, s.hidden, 2),
                                       "down": (s.hidden, s.intermediate, 1)}.items():
            codes, scales, scale = natural(s.experts, n, k, gen)
            dst = moe_layout.empty_weights(s.experts, n, k, "cuda")
            nbytes = 2 * (codes.numel() + scales.numel())  # read natural + write packed
            kernel_ms = timer(lambda: moe_layout.store_fragments_(dst, codes, scales, scale, groups))
            torch_ms = timer(lambda: moe_layout.store_fragments_(dst, codes, scales, scale, groups, kernel=False))
            row = {"shape": s.name, "weight": weight, "experts": s.experts, "n": n, "k": k, "bytes": nbytes,
                   "kernel_ms": kernel_ms, "torch_ms": torch_ms, "kernel_fraction_of_copy": nbytes / bw * 1e3 / kernel_ms,
                   "speedup_vs_torch": torch_ms / kernel_ms}
            rows.append(row)
            print(f"{s.name:16s} {weight:8s} [{s.experts}, {n}, {k}] kernel {kernel_ms:.3f} ms "
                  f"({100 * row['kernel_fraction_of_copy']:.0f}% of copy), torch {torch_ms:.3f} ms "
                  f"({row['speedup_vs_torch']:.1f}x)", flush=True)
            del codes, scales, dst
            torch.cuda.empty_cache()
    report = {"gpu": torch.cuda.get_device_name(), "date": utc_now(), "commit": git_commit(),
              "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "torch": torch.__version__,
              "copy_bandwidth_bytes_per_s": bw, "reps": args.reps, "results": rows}
    if "refit" in what:
        report["refit_results"] = bench_refit(args.shapes.split(","), args.reps, gen, bw, args.speculative_mixed,
                                              tuple(args.speculative_variants.split(",")))
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
