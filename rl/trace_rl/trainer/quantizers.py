"""Trainer-side quantizers (the `trace_rl.quant.Quantizer` protocol) and their agreement audit.

- `GuidedQuantizer` (trace mode): expert weights exactly as the rollout's refit quantizes them
  (`quant.fake_quantize_experts`); activations rounded with guided rounding (the toolchain kernel
  `trace_kernels.ops.guided_fake_quantize` on CUDA, `nvfp4.guided_fake_quantize` on CPU) against
  the rollout's guidance of the same (sequence, position, layer, site, slot). A row without guidance
  (token unknown to the rollout, or for moe_act a slot whose expert the rollout did not use for that
  token) falls back to round-to-nearest and is counted.
- `AuditedRoundToNearest` (qat mode): `quant.RoundToNearest`, plus the same audit.

Audit: given full guidance (the rollout's codes), each quantized element's trainer code is compared
with the rollout's via `nvfp4.agreement`, separately for elements whose rollout code is one of the two
grid neighbours of the trainer's x / d_rollout (the only codes guided rounding can produce).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import Tensor

from trace_kernels import nvfp4
from trace_rl.quant import RoundToNearest, TokenIndex, fake_quantize_experts


@dataclass
class SiteStats:
    """Counts for one tensor kind (moe_in, moe_act, k, v), accumulated over a trainer step."""

    guided_elements: int = 0
    fallback_elements: int = 0
    audited: int = 0          # elements compared with the rollout's code
    equal: int = 0
    neighbour: int = 0        # audited elements whose rollout code neighbours the trainer's x/d
    neighbour_equal: int = 0
    distance: Counter = field(default_factory=Counter)  # signed grid distance -> count


class QuantStats:
    """Per-site counters plus the summary the metrics file records."""

    def __init__(self):
        self.sites: dict[str, SiteStats] = {}

    def site(self, name: str) -> SiteStats:
        return self.sites.setdefault(name, SiteStats())

    def summary(self) -> dict:
        def frac(num, den):
            return num / den if den else None

        out = {"code_agreement": {}, "code_agreement_neighbour": {}, "neighbour_fraction": {},
               "guidance_fallback_fraction": {}, "code_distance_histogram": {}}
        total = SiteStats()
        for name, s in sorted(self.sites.items()):
            for key in ("guided_elements", "fallback_elements", "audited", "equal", "neighbour",
                        "neighbour_equal"):
                setattr(total, key, getattr(total, key) + getattr(s, key))
            total.distance.update(s.distance)
        for name, s in [*sorted(self.sites.items()), ("all", total)]:
            out["code_agreement"][name] = frac(s.equal, s.audited)
            out["code_agreement_neighbour"][name] = frac(s.neighbour_equal, s.neighbour)
            out["neighbour_fraction"][name] = frac(s.neighbour, s.audited)
            out["guidance_fallback_fraction"][name] = frac(
                s.fallback_elements, s.guided_elements + s.fallback_elements)
            out["code_distance_histogram"][name] = {str(k): v for k, v in sorted(s.distance.items())}
        out["guidance_fallback_elements"] = total.fallback_elements
        return out


def _gather_slots(t: Tensor, src: Tensor) -> Tensor:
    """t [N, k, ...] reordered along the slot axis by src int64 [N, k] (fp8 moved as bytes)."""
    as_bytes = t.dtype == torch.float8_e4m3fn
    u = t.view(torch.uint8) if as_bytes else t
    idx = src.view(*src.shape, *([1] * (u.dim() - 2))).expand(*src.shape, *u.shape[2:])
    out = torch.gather(u, 1, idx)
    return out.view(t.dtype) if as_bytes else out


def _reorder(g: nvfp4.Guidance, src: Tensor) -> nvfp4.Guidance:
    """Guidance rows [N, k, ...] with slot j taken from slot src[n, j]."""
    pick = lambda t: None if t is None else _gather_slots(t, src)  # noqa: E731
    return nvfp4.Guidance(scale=pick(g.scale), block_scales=pick(g.block_scales),
                          mantissa_bits=pick(g.mantissa_bits), codes=pick(g.codes))


def to_compact(g: nvfp4.Guidance) -> nvfp4.Guidance:
    """Compact guidance (mantissa bits) from full guidance (codes), through nvfp4.make_guidance."""
    if g.mode == "compact":
        return g
    return nvfp4.make_guidance(nvfp4.NVFP4Tensor(g.codes, g.block_scales, g.scale), mode="compact")


class _Audit:
    """Shared lookup of the rollout's guidance for a site, aligned with the trainer's rows/slots."""

    def __init__(self, guidance, stats: QuantStats | None = None, audit: bool = True):
        self.guidance = guidance  # trace_rl.guidance_store.GuidanceBatch or None
        self.stats = stats if stats is not None else QuantStats()
        # codes can only be compared with full guidance
        self.audit = audit and guidance is not None and guidance.mode == "full"

    def rollout_rows(self, layer: int, site: str, x: Tensor, index: TokenIndex,
                     experts: Tensor | None):
        """(Guidance matching x's shape [..., D], valid bool of shape x.shape[:-1]) or None."""
        if self.guidance is None or (layer, site) not in self.guidance.tables:
            return None
        g, found = self.guidance.lookup(layer, site, index.seq_ids, index.positions)  # [N, *S, ...]
        g = g.to(x.device)
        found = found.to(x.device)
        if site == "moe_act":
            rollout_experts, _ = self.guidance.experts(layer, index.seq_ids, index.positions)  # [N, k]
            rollout_experts = rollout_experts.to(x.device)
            # Match each trainer slot to the rollout slot that used the same expert for this token.
            match = experts.unsqueeze(-1) == rollout_experts.unsqueeze(-2)  # [N, k, k]
            src = match.to(torch.uint8).argmax(dim=-1)  # [N, k]
            g = _reorder(g, src)
            valid = found.unsqueeze(-1) & match.any(dim=-1)  # [N, k]
        else:
            valid = found.view(-1, *([1] * (x.dim() - 2))).expand(x.shape[:-1])
        return g, valid

    def compare(self, site: str, x: Tensor, trainer_codes: Tensor, rollout: nvfp4.Guidance,
                valid: Tensor) -> None:
        """Audit trainer codes (packed, x.shape[:-1] + [D/2]) against full rollout guidance."""
        if rollout.mode != "full" or not bool(valid.any()):
            return
        s = self.stats.site(site)
        a_codes, b_codes = rollout.codes[valid], trainer_codes[valid]  # [M, D/2]
        result = nvfp4.agreement(a_codes, b_codes)
        s.audited += result["elements"]
        s.equal += result["distance_histogram"].get(0, 0)
        s.distance.update(result["distance_histogram"])
        # Neighbours of y = x / d_rollout: guided rounding with all-0 and all-1 mantissa bits.
        sub = nvfp4.Guidance(scale=rollout.scale[valid], block_scales=rollout.block_scales[valid],
                             codes=a_codes)
        compact = to_compact(sub)
        xv = x.detach()[valid].float()  # [M, D]
        zeros = torch.zeros_like(compact.mantissa_bits)
        lo = nvfp4.guided_fake_quantize(xv, nvfp4.Guidance(sub.scale, sub.block_scales, zeros))
        hi = nvfp4.guided_fake_quantize(xv, nvfp4.Guidance(sub.scale, sub.block_scales, zeros | 0xFF))
        rollout_values = nvfp4.dequantize(nvfp4.NVFP4Tensor(a_codes, sub.block_scales, sub.scale))
        trainer_values = nvfp4.dequantize(nvfp4.NVFP4Tensor(b_codes, sub.block_scales, sub.scale))
        is_neighbour = (rollout_values == lo) | (rollout_values == hi)  # [M, D]
        s.neighbour += int(is_neighbour.sum())
        s.neighbour_equal += int((is_neighbour & (trainer_values == rollout_values)).sum())


class GuidedQuantizer(_Audit):
    """trace mode: rounds like the rollout did, from its guidance; see the module docstring.

    guidance: the rollout batch's `GuidanceBatch` (compact or full; full guidance is reduced to
    compact for rounding, so training is identical). audit: with full guidance, also compare codes.
    kernel: on CUDA tensors, round with the toolchain's guided fake-quant kernel
    (`trace_kernels.ops.guided_fake_quantize`, bit-exact with the reference); CPU tensors always use
    the `trace_kernels.nvfp4` reference.
    """

    def __init__(self, guidance, stats: QuantStats | None = None, audit: bool = True,
                 kernel: bool = True):
        super().__init__(guidance, stats, audit)
        self.kernel = kernel

    def _guided(self, x: Tensor, g: nvfp4.Guidance) -> tuple[Tensor, Tensor | None]:
        """(guided fake quantization of x, its packed codes when the reference produced them)."""
        if self.kernel and x.is_cuda:
            from trace_kernels import ops
            return ops.guided_fake_quantize(x, g), None
        # = nvfp4.guided_fake_quantize, keeping the codes so the audit need not round again
        q = nvfp4.guided_quantize(x.detach(), g)
        return nvfp4.straight_through(x, nvfp4.dequantize(q, dtype=x.dtype)), q.codes

    def weight(self, layer: int, name: str, w: Tensor) -> Tensor:
        return fake_quantize_experts(w)

    def activation(self, layer: int, site: str, x: Tensor, index: TokenIndex,
                   experts: Tensor | None = None) -> Tensor:
        looked_up = self.rollout_rows(layer, site, x, index, experts)
        s = self.stats.site(site)
        row_elems = x.shape[-1]
        if looked_up is None:
            s.fallback_elements += x.numel()
            return nvfp4.fake_quantize(x, scale="row")
        g, valid = looked_up
        compact = to_compact(g)
        guided, guided_codes = self._guided(x, compact)
        n_valid = int(valid.sum())
        s.guided_elements += n_valid * row_elems
        s.fallback_elements += (valid.numel() - n_valid) * row_elems
        if n_valid < valid.numel():
            nearest = nvfp4.fake_quantize(x, scale="row")
            out = torch.where(valid.unsqueeze(-1), guided, nearest)
        else:
            out = guided
        if self.audit:
            if guided_codes is None:  # the kernel's codes are not returned: the reference's
                guided_codes = nvfp4.guided_quantize(x.detach(), compact).codes
            self.compare(site, x, guided_codes, g, valid)
        return out


class AuditedRoundToNearest(_Audit):
    """qat mode: `quant.RoundToNearest`; with full rollout guidance, also audits code agreement."""

    def __init__(self, guidance=None, stats: QuantStats | None = None, audit: bool = True):
        super().__init__(guidance, stats, audit)
        # the audit reuses the codes the rounding just produced instead of quantizing x again
        self._rtn = RoundToNearest(on_quantized=self._keep_codes)
        self._codes: Tensor | None = None

    def _keep_codes(self, layer: int, site: str, q: nvfp4.NVFP4Tensor, index: TokenIndex) -> None:
        self._codes = q.codes

    def weight(self, layer: int, name: str, w: Tensor) -> Tensor:
        return self._rtn.weight(layer, name, w)

    def activation(self, layer: int, site: str, x: Tensor, index: TokenIndex,
                   experts: Tensor | None = None) -> Tensor:
        out = self._rtn.activation(layer, site, x, index, experts)
        codes, self._codes = self._codes, None  # nvfp4.quantize(x.detach(), scale="row").codes
        looked_up = self.rollout_rows(layer, site, x, index, experts) if self.audit else None
        if looked_up is not None:
            g, valid = looked_up
            self.compare(site, x, codes, g, valid)
        return out
