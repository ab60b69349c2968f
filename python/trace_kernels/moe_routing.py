"""Token -> expert routing for the grouped MoE GEMMs, and validation of the routed-row description.

Rows of the grouped GEMM are (token, slot) pairs sorted by expert, stably, so within an expert they
are ordered by token then slot; `offsets[e]:offsets[e+1]` are expert e's rows. The sort order is
a pure function of `topk_ids`, so a token's rows never depend on a tile choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MoERouting", "check_offsets", "check_row_index", "route", "token_tile_bound", "token_tiles"]


@dataclass(frozen=True)
class MoERouting:
    row_index: torch.Tensor  # int32 [M]: token (row of the [T, H] input) of each sorted row
    offsets: torch.Tensor  # int32 [E+1]: expert e owns sorted rows offsets[e]:offsets[e+1]
    slot_rows: torch.Tensor  # int32 [T, k]: sorted row of token t's slot j (inverse map, for the combine)
    row_weight: torch.Tensor | None  # float32 [M]: router weight of each sorted row

    @property
    def num_rows(self) -> int:
        return self.row_index.shape[0]

    @property
    def num_experts(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def num_tokens(self) -> int:
        return self.slot_rows.shape[0]

    @property
    def top_k(self) -> int:
        return self.slot_rows.shape[1]


def route(topk_ids: torch.Tensor, num_experts: int, topk_weights: torch.Tensor | None = None) -> MoERouting:
    """topk_ids [T, k] (int) and optional topk_weights [T, k] -> MoERouting on the same device."""
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dim() != 2:
        raise ValueError("topk_ids must be a [T, k] integer tensor")
    if topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise TypeError(f"topk_ids must be an integer tensor, got {topk_ids.dtype}")
    t, k = topk_ids.shape
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= num_experts):
        raise ValueError(f"topk_ids must lie in [0, {num_experts}), got [{int(topk_ids.min())}, {int(topk_ids.max())}]")
    if topk_weights is not None and tuple(topk_weights.shape) != (t, k):
        raise ValueError(f"topk_weights must be [T, k]={t, k}, got {tuple(topk_weights.shape)}")
    flat = topk_ids.reshape(-1).to(torch.int64)  # [T*k]
    order = torch.sort(flat, stable=True).indices  # [M] flat slot index of each sorted row
    counts = torch.bincount(flat, minlength=num_experts)  # [E]
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device)
    offsets[1:] = torch.cumsum(counts, 0)
    slot_rows = torch.empty_like(order)
    slot_rows[order] = torch.arange(order.numel(), device=flat.device)
    weights = None
    if topk_weights is not None:
        weights = topk_weights.reshape(-1)[order].to(torch.float32).contiguous()
    return MoERouting(
        row_index=(order // max(k, 1)).to(torch.int32).contiguous(),
        offsets=offsets.to(torch.int32),
        slot_rows=slot_rows.reshape(t, k).to(torch.int32).contiguous(),
        row_weight=weights,
    )


def token_tiles(offsets: torch.Tensor, tile_tokens: int) -> int:
    """The token tiles of a routing: sum over experts of ceil(rows_e / tile_tokens) (reads offsets to the host)."""
    rows = (offsets[1:] - offsets[:-1]).to(torch.int64).cpu()
    return int(((rows + tile_tokens - 1) // tile_tokens).sum())


def token_tile_bound(num_rows: int, num_experts: int, tile_tokens: int) -> int:
    """An upper bound on `token_tiles` known without the offsets (the GEMMs' grid; surplus CTAs leave at once).

    Each of the at most min(E, M) experts with rows pads its last tile with at most TN - 1 rows, so the tiles
    number at most (M + min(E, M) (TN - 1)) / TN, reached when min(E, M) experts have rows, each 1 mod TN of them.
    (The bound before, ceil(M / TN) + E, launched 136 token tiles for T=8 at top-8 of 128 experts, of which 49 held
    rows in the benchmark's routing; this one 64.) At least 1, so an empty routing still launches a valid grid.
    """
    return max(1, (num_rows + min(num_experts, num_rows) * (tile_tokens - 1)) // tile_tokens)


def check_offsets(offsets: torch.Tensor, num_experts: int, num_rows: int) -> None:
    """int32 [E+1], offsets[0] == 0, non-decreasing, offsets[E] == num_rows. Reads the values (a sync on GPU)."""
    if not isinstance(offsets, torch.Tensor) or offsets.dtype != torch.int32:
        raise TypeError(f"offsets must be an int32 tensor, got {getattr(offsets, 'dtype', type(offsets))}")
    if tuple(offsets.shape) != (num_experts + 1,):
        raise ValueError(f"offsets must have shape [E+1]=[{num_experts + 1}], got {tuple(offsets.shape)}")
    o = offsets.to("cpu", torch.int64)
    if int(o[0]) != 0:
        raise ValueError(f"offsets[0] must be 0, got {int(o[0])}")
    steps = o[1:] - o[:-1]
    if bool((steps < 0).any()):
        e = int((steps < 0).nonzero()[0])
        raise ValueError(f"offsets must be non-decreasing; offsets[{e + 1}]={int(o[e + 1])} < offsets[{e}]={int(o[e])}")
    if int(o[-1]) != num_rows:
        raise ValueError(f"offsets[E]={int(o[-1])} must equal the number of routed rows M={num_rows}")


def check_row_index(row_index: torch.Tensor, num_rows: int, num_sources: int) -> None:
    """int32 [M] with values in [0, num_sources). Reads the values (a sync on GPU)."""
    if not isinstance(row_index, torch.Tensor) or row_index.dtype != torch.int32:
        raise TypeError(f"row_index must be an int32 tensor, got {getattr(row_index, 'dtype', type(row_index))}")
    if tuple(row_index.shape) != (num_rows,):
        raise ValueError(f"row_index must have shape [M]=[{num_rows}], got {tuple(row_index.shape)}")
    if num_rows and (int(row_index.min()) < 0 or int(row_index.max()) >= num_sources):
        raise ValueError(f"row_index values must lie in [0, {num_sources}), got "
                         f"[{int(row_index.min())}, {int(row_index.max())}]")
