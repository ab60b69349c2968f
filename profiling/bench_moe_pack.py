"""The RL weight sync's packing step on the GPU: natural NVFP4 expert weights -> the MoE GEMM's packed,
encoded layout, with the moe_pack kernel and with the torch path (moe_layout.store_fragments_), for the
gate_up (interleaved) and down weights of each preset's MoE layer; copy bandwidth in the same run.

    python profiling/bench_moe_pack.py --out profiling/results/moe_pack_h200.json
"""

import argparse
import json
import os
import sys

import torch

from bench_moe_gemm import Timer, copy_bandwidth  # profiling/ is the script's folder
from trace_kernels import moe_layout, shapes
from trace_kernels.testing.provenance import git_commit, utc_now


def natural(e: int, n: int, k: int, gen: torch.Generator):
    codes = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)  # [E, N, K/2]
    scales = torch.randint(1, 0x7F, (e, n, k // 16), dtype=torch.uint8, device="cuda", generator=gen)  # [E, N, K/16]
    return codes, scales.view(torch.float8_e4m3fn), torch.rand(e, device="cuda", generator=gen)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="qwen3-30b-a3b,qwen3-235b-a22b")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default="profiling/results/moe_pack_h200.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    timer = Timer(args.reps)
    gen = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bandwidth(timer)
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s (read + write)", flush=True)
    rows = []
    for name in args.shapes.split(","):
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
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
