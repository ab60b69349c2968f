"""Expert-weight inputs for the refit benchmarks, as consecutive RL policy syncs see them.

steady: one tensor after different small steps with every expert's largest |w| kept (an RL step's usual case: the
speculative refits' guesses all hold); mixed: those with about a given fraction of the experts' amax moved from one
set to the next. Benchmarks rotate over the sets in order, the last followed by the first.
"""

from __future__ import annotations

import torch


def steady_weight_sets(base: torch.Tensor, sets: int) -> list[torch.Tensor]:
    """`sets` tensors like base [E, N, K]: base after different small steps (each element moved by ~1% of itself, BF16
    rounding included) that keep every expert's amax at the same element, as consecutive RL policy syncs see it."""
    experts = base.shape[0]
    rows = torch.arange(experts, device=base.device)
    amax = base.float().abs().amax(dim=(1, 2), keepdim=True)  # [E, 1, 1]
    arg = base.float().abs().view(experts, -1).argmax(dim=1)  # [E]
    out = []
    for _ in range(sets):
        w = base.float()
        w = (w + torch.randn_like(w) * 1e-2 * w.abs()).clamp_(-amax, amax).to(base.dtype)
        w.view(experts, -1)[rows, arg] = base.view(experts, -1)[rows, arg]
        out.append(w)
    return out


def mixed_weight_sets(steady: list[torch.Tensor], moved: float, seed: int = 0) -> tuple[list[torch.Tensor], float]:
    """The steady sets (each [E, N, K], one amax element per expert kept) with about `moved` of the experts' amax
    changed between consecutive sets, and the fraction of (call, expert) pairs whose amax differs from the previous
    call's over the rotation (the last set is followed by the first). An expert toggles its amax element between its
    value and that value x (1 + 2^-6) (a few BF16 ulps larger, so its scale changes too)."""
    experts = steady[0].shape[0]
    generator = torch.Generator().manual_seed(seed)
    state = torch.zeros(experts, dtype=torch.bool)
    states = [state]
    for _ in steady[1:]:
        state = state ^ (torch.rand(experts, generator=generator) < moved)
        states.append(state)
    moves = sum(int((a != b).sum()) for a, b in zip(states, states[1:] + states[:1]))
    flat0 = steady[0].float().abs().view(experts, -1)
    arg = flat0.argmax(dim=1)  # [E]: the amax element, the same in every steady set
    rows = torch.arange(experts, device=steady[0].device)
    out = []
    for w, up in zip(steady, states):
        w = w.clone()
        flat = w.view(experts, -1)
        peak = flat[rows, arg].float()
        flat[rows, arg] = torch.where(up.to(w.device), peak * (1 + 2**-6), peak).to(w.dtype)
        out.append(w)
    return out, moves / (experts * len(steady))
