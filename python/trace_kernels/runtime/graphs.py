"""CUDA-graph capture with Python's cyclic garbage collector paused.

A collection that runs inside a capture runs finalizers there, and a CUDA call that a global-mode capture forbids
invalidates it: the next launch fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. The rollout engine's decode
graph failed that way in 4 of 4 runs of `pytest -m gpu tests/rl` on the H200, passed 3 of 3 with the collector
off during its captures, and 5 of 5 with this helper (docs/rollout.md, "CUDA graphs and the garbage collector";
which object's cleanup broke the capture was not found).
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

import torch


@contextlib.contextmanager
def capture_graph(graph: "torch.cuda.CUDAGraph", **kwargs) -> Iterator[None]:
    """``torch.cuda.graph(graph, **kwargs)`` with the cyclic GC off until the capture ends (then as it was)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, **kwargs):
            yield
    finally:
        if enabled:
            gc.enable()
