"""NVTX ranges (``rollout/prefill``, ``rollout/decode_step``, ``rollout/refit``,
``rollout/guidance_*``); a no-op context when the ``nvtx`` package is missing."""
from __future__ import annotations

import contextlib


def nvtx_range(name: str):
    try:
        import nvtx
    except ImportError:
        return contextlib.nullcontext()
    return nvtx.annotate(name, domain="trace_rl")
