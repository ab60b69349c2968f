"""NVTX ranges `trace_kernels/<op>` around every launch (domain "trace_kernels").

Uses the nvtx package; without it (or without a profiler attached) a range costs next to nothing.
"""

from __future__ import annotations

import contextlib

try:
    import nvtx as _nvtx
    _DOMAIN = _nvtx.get_domain("trace_kernels")
except Exception:  # nvtx missing or broken: ranges become no-ops
    _nvtx = None
    _DOMAIN = None


def range_name(op: str) -> str:
    return f"trace_kernels/{op}"


@contextlib.contextmanager
def annotate(op: str):
    if _DOMAIN is None:
        yield
        return
    attributes = _DOMAIN.get_event_attributes(message=range_name(op))
    _DOMAIN.push_range(attributes)
    try:
        yield
    finally:
        _DOMAIN.pop_range()
