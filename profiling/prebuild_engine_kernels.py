"""Compile the kernels the rollout engine launches for some shapes and token counts, in parallel.

Per shape: the MoE GEMM tiles those token counts pick (tile_for_rows, both GEMMs), the combine,
quantize, refit and paged-KV kernels (append, gather, decode), and the trainer's guided fake-quant. Prints one line per kernel (ok / FAILED) and a total, so the
GPU scripts' tests and benchmarks do not compile kernels one at a time.
Usage: prebuild_engine_kernels.py SHAPE:TOKENS[,TOKENS...] ...  (SHAPE as trace_kernels.shapes.resolve
takes it; TOKENS are tokens per MoE call)
"""

import sys
import time

from trace_kernels import jit, shapes
from trace_kernels.codegen.ops import decode_attention, guided_fake_quantize, gumbel_sample, kv_append, kv_gather
from trace_kernels.codegen.ops import moe_gemm as mg
from trace_kernels.codegen.ops import quantize, refit_weights


def specs_for(shape_name: str, tokens: list[int]) -> list:
    shape = shapes.resolve(shape_name)
    kinds = ("gate_up_swiglu", "down_routed")
    pairs = {(kind, mg.tile_for_rows(t * shape.top_k, shape.experts, k=mg.gemm_dims(shape, kind)[1], kind=kind,
                                     n=mg.gemm_dims(shape, kind)[0]))
             for kind in kinds for t in tokens}
    specs = [mg.gemm_spec(shape, mg.launched_kind(kind, tile), tile) for kind, tile in pairs]  # (quantize_after: _h)
    specs += [mg.combine_spec(shape), *quantize.specs_for_shape(shape), *refit_weights.specs_for_shape(shape),
              *guided_fake_quantize.specs_for_shape(shape), *gumbel_sample.specs_for_shape(shape)]
    try:
        specs += [*kv_append.specs_for_shape(shape), *kv_gather.specs_for_shape(shape),
                  *decode_attention.specs_for_shape(shape)]
    except Exception as e:  # a shape the paged-KV kernels do not cover: build the rest
        print("no paged-KV kernel specs:", e)
    return specs


def main(argv: list[str]) -> int:
    if not argv:
        sys.exit(__doc__)
    t = time.time()
    specs = {}
    for arg in argv:
        name, _, counts = arg.rpartition(":")
        specs.update((s.name, s) for s in specs_for(name, [int(c) for c in counts.split(",")]))
    entries = jit.build_all(list(specs.values()), jobs=16, keep_going=True)
    for name, e in zip(specs, entries):
        print(name, "FAILED: " + str(e)[:400] if isinstance(e, BaseException) else "ok")
    print(f"built/verified {len(specs)} kernels in {time.time() - t:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
