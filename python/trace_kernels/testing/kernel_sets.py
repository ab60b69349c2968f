"""The kernels the GPU tests and the memory-kernel benchmark launch, to build them ahead of a run."""

from __future__ import annotations

import torch

from trace_kernels.codegen.ops import guided_fake_quantize, quantize, refit_packed, refit_weights
from trace_kernels.codegen.spec import KernelSpec

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
QUANTIZE_DIMS = (16, 64, 128, 256, 768, 2048, 4096, 8192)
GUIDED_DIMS = (16, 32, 64, 128, 256, 768, 2048, 4096)


def memory_kernel_specs() -> list[KernelSpec]:
    """Every variant of every dtype / D the GPU tests and the benchmark use."""
    specs = [quantize.spec(t, d, v) for v in quantize.VARIANTS for t in DTYPES for d in QUANTIZE_DIMS]
    guided = {s.name: s for s in (guided_fake_quantize.spec(t, d, v, mode) for v in guided_fake_quantize.VARIANTS
                                  for t in DTYPES for d in GUIDED_DIMS for mode in guided_fake_quantize.MODES)}
    specs += guided.values()  # by name: one kernel serves several modes (v5 / v6 launch v4's for most)
    specs += [refit_weights.spec(t, v) for v in refit_weights.VARIANTS for t in DTYPES]
    specs += [refit_packed.spec(t, g, v) for v in refit_packed.VARIANTS for t in DTYPES for g in (1, 2)]
    return specs
