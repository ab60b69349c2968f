"""The kernels as torch ops (torch.library custom ops with fake impls; CPU tensors use the reference).

    from trace_kernels import ops
    r = ops.quantize(x, guidance=True, dequant=True)       # x [..., D] bf16/fp16/fp32
    y = ops.guided_fake_quantize(x_trainer, r.guidance())  # straight-through gradient
    ops.refit_weights(w, buffers)                          # w [E, N, K] -> NVFP4 in place
    ops.refit_weights_packed_(w, moe_weights, groups=2)    # w [E, N, K] -> the MoE GEMM's packed layout in place
    ops.raise_on_nonfinite()                               # at a step boundary (one host sync)
    tokens, logp = ops.gumbel_max_sample(logits, seed, seq_keys, positions, temperature)  # [B, V] -> [B]
"""

from trace_kernels.ops._common import raise_on_nonfinite
from trace_kernels.ops.guided_fake_quantize import COUNTER_NAMES, guided_fake_quantize
from trace_kernels.ops.gumbel_sample import gumbel_max_sample
from trace_kernels.ops.quantize import QuantizeResult, quantize
from trace_kernels.ops.refit_weights import allocate as allocate_refit_buffers
from trace_kernels.ops.refit_packed import refit_weights_packed_
from trace_kernels.ops.refit_weights import refit_weights

__all__ = ["COUNTER_NAMES", "QuantizeResult", "allocate_refit_buffers", "guided_fake_quantize", "gumbel_max_sample",
           "quantize", "raise_on_nonfinite", "refit_weights", "refit_weights_packed_"]
