"""Quantization hook between the model and whoever quantizes it (rollout engine or trainer).

The model's forward takes ``quant: Quantizer | None``; ``None`` is plain BF16 (or whatever dtype
the model runs in). The model calls the hook at these sites (shapes are the tensors passed):

=========  ==========================  =====================================================
site       tensor                      FP32 second-level scale ("row" of NVFP4)
=========  ==========================  =====================================================
expert_w   w [E, N, K] via ``weight``  one per expert (``scale="tensor"`` per expert)
           name "gate_up" ([E, 2I, H]: gate rows then up rows) or "down" ([E, H, I])
moe_in     x [N_tok, H]                one per token (shared by the token's top-k slots)
moe_act    x [N_tok, k, I]             one per (token, slot); ``experts`` int64 [N_tok, k]
k, v       x [N_tok, Hkv, D]           one per (token, kv head); k after k-norm and RoPE
=========  ==========================  =====================================================

Blocks of 16 always run along the last axis (the GEMM reduction dim for expert inputs/weights,
the head dim for K/V). All numerics come from ``trace_kernels.nvfp4``; nothing is reimplemented.

Public API
----------
- ``TokenIndex(seq_ids, positions)``: int64 [N_tok] each; which (sequence, position) each row is.
- ``Quantizer`` (Protocol): ``weight(layer, name, w) -> Tensor`` and
  ``activation(layer, site, x, index, experts=None) -> Tensor``.
- ``fake_quantize_experts(w) -> Tensor``: [E, N, K] -> same, NVFP4 with one tensor scale per expert
  (bit-identical to ``nvfp4.fake_quantize(w[e], scale="tensor")`` for each e). Rollout refit uses it.
- ``RoundToNearest(capture=None, on_quantized=None)``: standard NVFP4 fake quantization
  (straight-through gradient). With ``capture`` (a ``GuidanceRecorder``) it records guidance of
  every activation it quantizes; ``on_quantized(layer, site, q: NVFP4Tensor, index)`` lets the
  rollout engine store the exact codes it produced (its NVFP4 KV cache does).
- ``GuidanceRecorder(mode="compact"|"full")``: accumulates guidance keyed by
  (seq_id, position, layer, site, slot). On CUDA tensors it copies to pinned host memory with
  ``non_blocking=True`` (no host sync while recording); ``finalize()`` synchronises once and returns
  a ``trace_rl.guidance_store.GuidanceBatch`` (see there for ``lookup``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch import Tensor

from trace_kernels import nvfp4

ACTIVATION_SITES = ("moe_in", "moe_act", "k", "v")
WEIGHT_NAMES = ("gate_up", "down")
GUIDANCE_MODES = ("compact", "full")


@dataclass(frozen=True)
class TokenIndex:
    """Which tokens the rows of an activation belong to."""

    seq_ids: Tensor  # int64 [N_tok]  engine-assigned, stable sequence id
    positions: Tensor  # int64 [N_tok]  absolute position in its sequence

    def __post_init__(self):
        if self.seq_ids.shape != self.positions.shape or self.seq_ids.dim() != 1:
            raise ValueError(
                f"TokenIndex: seq_ids {tuple(self.seq_ids.shape)} and positions "
                f"{tuple(self.positions.shape)} must both be 1-D of the same length")

    def __len__(self) -> int:
        return self.seq_ids.numel()


class Quantizer(Protocol):
    def weight(self, layer: int, name: str, w: Tensor) -> Tensor: ...

    def activation(self, layer: int, site: str, x: Tensor, index: TokenIndex,
                   experts: Tensor | None = None) -> Tensor: ...


def fake_quantize_experts(w: Tensor) -> Tensor:
    """NVFP4 fake quantization of stacked expert weights, one FP32 tensor scale per expert.

    w [E, N, K] with K % 16 == 0. Viewing each expert as one row [E, N*K] makes the per-row scale
    the per-expert scale while 16-element blocks stay inside a K-row (K is a multiple of 16).
    """
    if w.dim() != 3:
        raise ValueError(f"expert weights must be [E, N, K], got {tuple(w.shape)}")
    E, N, K = w.shape
    return nvfp4.fake_quantize(w.reshape(E, N * K), scale="row").reshape(E, N, K)


def _check_site(site: str, x: Tensor, index: TokenIndex, experts: Tensor | None) -> None:
    if site not in ACTIVATION_SITES:
        raise ValueError(f"unknown quantization site {site!r}; expected one of {ACTIVATION_SITES}")
    want_dim = {"moe_in": 2, "moe_act": 3, "k": 3, "v": 3}[site]
    if x.dim() != want_dim or x.shape[0] != len(index):
        raise ValueError(f"site {site!r}: x {tuple(x.shape)} must be {want_dim}-D with "
                         f"{len(index)} rows (one per token of the index)")
    if site == "moe_act":
        if experts is None or experts.shape != x.shape[:2]:
            raise ValueError(f"site 'moe_act' needs experts of shape {tuple(x.shape[:2])}, got "
                             f"{None if experts is None else tuple(experts.shape)}")


class RoundToNearest:
    """NVFP4 round-to-nearest fake quantization at every site (QAT; rollout nvfp4 mode)."""

    def __init__(self, capture: "GuidanceRecorder | None" = None,
                 on_quantized: Callable[[int, str, "nvfp4.NVFP4Tensor", TokenIndex], None]
                 | None = None):
        self.capture = capture
        self.on_quantized = on_quantized

    def weight(self, layer: int, name: str, w: Tensor) -> Tensor:
        if name not in WEIGHT_NAMES:
            raise ValueError(f"unknown expert weight {name!r}; expected one of {WEIGHT_NAMES}")
        return fake_quantize_experts(w)

    def activation(self, layer: int, site: str, x: Tensor, index: TokenIndex,
                   experts: Tensor | None = None) -> Tensor:
        _check_site(site, x, index, experts)
        q = nvfp4.quantize(x.detach(), scale="row")
        y = nvfp4.dequantize(q, dtype=x.dtype)
        if self.capture is not None:
            self.capture.record(layer, site, q, index, experts)
        if self.on_quantized is not None:
            self.on_quantized(layer, site, q, index)
        return nvfp4.straight_through(x, y)


class GuidanceRecorder:
    """Accumulates guidance of quantized activations, keyed by (seq_id, position, layer, site, slot).

    ``record`` is cheap and never synchronises the device: CUDA chunks are copied into pinned host
    buffers with ``non_blocking=True``. ``finalize()`` waits for the copies once and builds a
    ``GuidanceBatch`` (rows sorted by (seq_id, position); a key recorded twice keeps the last).
    """

    def __init__(self, mode: str = "compact"):
        if mode not in GUIDANCE_MODES:
            raise ValueError(f"guidance mode must be one of {GUIDANCE_MODES}, got {mode!r}")
        self.mode = mode
        self._chunks: dict[tuple[int, str], list[dict[str, Tensor]]] = {}
        self._events: list = []

    @staticmethod
    def _to_host(t: Tensor) -> Tensor:
        if t.device.type != "cuda":
            return t.detach().clone()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t.detach(), non_blocking=True)
        return host

    def record(self, layer: int, site: str, q: "nvfp4.NVFP4Tensor", index: TokenIndex,
               experts: Tensor | None = None) -> None:
        g = nvfp4.make_guidance(q, mode=self.mode)
        payload = g.mantissa_bits if self.mode == "compact" else g.codes
        chunk = {
            "seq_ids": self._to_host(index.seq_ids.to(torch.int64)),
            "positions": self._to_host(index.positions.to(torch.int64)),
            "scale": self._to_host(g.scale),
            "block_scales": self._to_host(g.block_scales),
            "payload": self._to_host(payload),
        }
        if experts is not None:
            chunk["experts"] = self._to_host(experts.to(torch.int64))
        self._chunks.setdefault((layer, site), []).append(chunk)
        if q.codes.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()
            self._events.append(ev)

    def clear(self) -> None:
        self._chunks.clear()
        self._events.clear()

    def finalize(self) -> "GuidanceBatch":
        from trace_rl.guidance_store import GuidanceBatch, GuidanceTable

        for ev in self._events:
            ev.synchronize()
        tables = {}
        for (layer, site), chunks in self._chunks.items():
            cat = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
            tables[(layer, site)] = GuidanceTable.from_rows(
                cat["seq_ids"], cat["positions"], cat["scale"], cat["block_scales"],
                cat["payload"], cat.get("experts"))
        return GuidanceBatch(self.mode, tables)
