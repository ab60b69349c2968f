"""Guidance from the kernels' device buffers to a ``GuidanceBatch``, without a host sync per step.

Each step leaves its guidance in one device arena (uint8 [N, bytes_per_token], see
``kernel_layout.GuidanceLayout``). ``enqueue`` copies it into pinned host memory on a side stream
that first waits for an event recorded on the compute stream; the copy overlaps sampling and the
host's scheduling of the next step. A captured decode graph reuses its arena, so ``fence`` (called
before the next step is launched) makes the compute stream wait for the previous copy: a device
side dependency, not a host wait. ``finalize`` waits for the copies once, at the end of
``generate``, and builds the tables (rows sorted by (seq_id, position), as ``GuidanceRecorder``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from trace_rl.engine.kernel_layout import GuidanceLayout
from trace_rl.guidance_store import GuidanceBatch, GuidanceTable, row_order


class AsyncGuidanceCapture:
    def __init__(self, layout: GuidanceLayout, device: torch.device):
        self.layout, self.device = layout, torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._chunks: list[tuple[Tensor, Tensor, Tensor]] = []  # host arena [B, bytes], seq_ids, positions
        self._events: list = []
        self._last_copy = None

    @property
    def mode(self) -> str:
        return self.layout.mode

    def fence(self) -> None:
        """Order the next write of a reused (graph) arena after the last copy out of it."""
        if self._last_copy is not None:
            torch.cuda.current_stream(self.device).wait_event(self._last_copy)

    def enqueue(self, arena: Tensor, seq_ids: Tensor, positions: Tensor, reused: bool) -> None:
        """arena [B, bytes] on the device (B = the step's real tokens); seq_ids, positions int64 [B]
        on the host. reused: the arena belongs to a captured graph (no allocator bookkeeping)."""
        if arena.shape[0] != seq_ids.numel() or seq_ids.shape != positions.shape:
            raise ValueError(f"arena rows {arena.shape[0]} != {seq_ids.numel()} token keys")
        keys = (seq_ids.to("cpu", torch.int64), positions.to("cpu", torch.int64))
        if self.stream is None:
            self._chunks.append((arena.clone(), *keys))
            return
        main = torch.cuda.current_stream(self.device)
        ready = torch.cuda.Event()
        ready.record(main)
        host = torch.empty(arena.shape, dtype=torch.uint8, pin_memory=True)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            host.copy_(arena, non_blocking=True)
            if not reused:  # the allocator must not hand the arena out before the copy has read it
                arena.record_stream(self.stream)
            done = torch.cuda.Event()
            done.record(self.stream)
        self._events.append(done)
        self._last_copy = done
        self._chunks.append((host, *keys))

    def clear(self) -> None:
        self._chunks.clear()
        self._events.clear()
        self._last_copy = None

    def finalize(self) -> GuidanceBatch:
        for ev in self._events:  # the one wait of the batch
            ev.synchronize()
        tables = {}
        if self._chunks:
            seq_ids = torch.cat([c[1] for c in self._chunks])  # [R]
            positions = torch.cat([c[2] for c in self._chunks])
            # every table has the arena's rows: sort (and drop repeated keys) once, for all of them
            order = row_order(seq_ids, positions)
            arena = torch.cat([c[0] for c in self._chunks])[order]  # [R', bytes]
            seq_ids, positions = seq_ids[order], positions[order]
            for (layer, site), f in self.layout.unpack(arena).items():
                tables[(layer, site)] = GuidanceTable(seq_ids.clone(), positions.clone(), f["scale"],
                                                      f["block_scales"], f["payload"], f.get("experts"))
        return GuidanceBatch(self.layout.mode, tables)
