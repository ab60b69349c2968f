"""One workload of a memory-bound kernel for Nsight Compute: a warm-up call, then one profiled call.

    ncu --section SpeedOfLight --section WarpStateStats --nvtx --nvtx-include 'regex:trace_kernels@.*/' \
        python profiling/ncu_memory_case.py quantize:v2 --mb 64

Cases: quantize, quantize+guidance (with the BF16 operand), guided-compact, guided-compact-counters,
guided-full (with counters), guided-full-nocounters, refit, refit_packed (a Qwen3-30B-A3B gate_up, whatever --mb),
kv_append, kv_append+guidance; each optionally `:variant` (kv_append: the default NVFP4 variant; the others: the codegen
module's VARIANTS). The BF16 input is [rows, 2048] (refit: [E, 1536, 2048])
of `--mb` MB, as in bench_memory_kernels.py, so the profiled launch is the one the benchmark times. refit's and
refit_packed's profiled call refits the same weights into the buffers the warm-up wrote, so a speculative variant's
guesses all hold (the benchmark's steady input).
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from trace_kernels import nvfp4, ops
from trace_kernels.codegen.ops import guided_fake_quantize as codegen_guided
from trace_kernels.codegen.ops import quantize as codegen_quantize
from trace_kernels.codegen.ops import refit_packed as codegen_packed
from trace_kernels.codegen.ops import refit_weights as codegen_refit

D, REFIT_N, REFIT_K = 2048, 1536, 2048
MB = 1 << 20


@contextlib.contextmanager
def launched_variant(module, name: str | None):
    saved = module.VARIANT
    module.VARIANT = name or saved
    try:
        yield
    finally:
        module.VARIANT = saved


def workload(case: str, size: int, kv_variant: str | None = None):
    """A zero-argument callable that launches the case once (kv_variant: the kv_append variant)."""
    rows = max(1, size // (2 * D))
    x = torch.randn(rows, D, device="cuda", dtype=torch.bfloat16)  # [rows, D]
    if case == "quantize":
        return lambda: ops.quantize(x)
    if case == "quantize+guidance":
        return lambda: ops.quantize(x, guidance=True, dequant=True)
    if case.startswith("guided-"):
        trainer = x * (1 + 1e-2 * torch.randn_like(x))
        mode = "full" if case.startswith("guided-full") else "compact"
        guidance = nvfp4.make_guidance(ops.quantize(x).q, mode)
        counters = case in ("guided-compact-counters", "guided-full")
        return lambda: ops.guided_fake_quantize(trainer, guidance, return_counters=counters)
    if case.startswith("kv_append"):  # 256K tokens x 4 kv heads x 128 into NVFP4 pages of 16, shuffled slots
        from trace_kernels import kv_cache
        from trace_kernels.kv_append import kv_append
        tokens, hkv, d, page = 262144, 4, 128, 16
        k, v = (torch.randn(tokens, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))  # [T, Hkv, D]
        slots = torch.randperm(tokens, device="cuda")  # [T]
        caches = [kv_cache.allocate_nvfp4_pages(tokens // page, page, hkv, d, device="cuda") for _ in range(2)]
        guidance = case == "kv_append+guidance"
        return lambda: kv_append(k, v, slots, *caches, guidance=guidance, check_values=False, variant=kv_variant)
    if case == "refit_packed":  # the engine's sync of one Qwen3-30B-A3B gate_up [128, 1536, 2048] (--mb is ignored)
        from trace_kernels import moe_layout
        w = torch.randn(128, 1536, 2048, device="cuda", dtype=torch.bfloat16)  # [E, 2 I, H]: [gate; up] rows
        dst = moe_layout.empty_weights(128, 1536, 2048, "cuda")
        return lambda: ops.refit_weights_packed_(w, dst, 2)
    if case == "refit":
        experts = max(1, size // (2 * REFIT_N * REFIT_K))
        w = torch.randn(experts, REFIT_N, REFIT_K, device="cuda", dtype=torch.bfloat16)  # [E, N, K]
        out = ops.allocate_refit_buffers(experts, REFIT_N, REFIT_K, "cuda")
        return lambda: ops.refit_weights(w, out)
    raise SystemExit(f"unknown case {case!r}")


MODULES = {"quantize": codegen_quantize, "quantize+guidance": codegen_quantize, "refit": codegen_refit,
           "refit_packed": codegen_packed}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", help="case[:variant]")
    parser.add_argument("--mb", type=int, default=64, help="input size in MB")
    args = parser.parse_args(argv)
    case, _, name = args.case.partition(":")
    module = MODULES.get(case, codegen_guided)
    with launched_variant(module, None if case.startswith("kv_append") else name or None):
        run = workload(case, args.mb * MB, (name or None) if case.startswith("kv_append") else None)
        run()  # warm-up: JIT load, first-touch of the outputs
        torch.cuda.synchronize()
        run()
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
