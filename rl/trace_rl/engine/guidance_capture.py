"""Guidance from the kernels' device buffers to a ``GuidanceBatch``, without a host sync per step.

Each step leaves its guidance in one device arena (uint8 [N, bytes_per_token], see
``kernel_layout.GuidanceLayout``). ``enqueue`` copies it into pinned host memory on a side stream
that first waits for an event recorded on the compute stream; the copy overlaps sampling and the
following steps. A captured decode graph rewrites its arena at every replay, so its arena is first
cloned on the compute stream (a device copy of a few MB, microseconds) and the host copy reads the
clone: the compute stream never waits for a host copy. (It used to wait for the previous copy
before each step, and the copy stream is in order, so the first decode steps of a batch waited for
all of the prefill's guidance to cross PCIe: +2.1 ms per decode step at batch 512.) ``finalize``
waits for the copies once, at the end of ``generate``, and builds the tables (rows sorted by
(seq_id, position), as ``GuidanceRecorder``): it moves whole rows into sorted order, and the
tables are views of that buffer (``GuidanceLayout`` stores each field contiguously in a row).

Host copies are paced: ``enqueue`` only queues a step's arena; ``issue_step``, which the engine
calls once per step while the step's graph runs on the device, just before queueing the step's
own arena, sends at most ``copy_bytes_per_step`` bytes of what earlier steps queued (oldest first,
in pieces): at 32 MB, 0.6 ms of copy engine at the H200's 55 GB/s, done long before the step's
token read-back (a device-to-host copy too, which would otherwise queue behind it). Sending each
arena at once, as the first version did, made the read-backs wait: a prefill's guidance (3.8 GB
for 512 prompts of 1K tokens on the ``bench`` preset) held up the following decode steps (8.6%
slower). Issuing after the read-back instead, as the second version did, put ~0.2 ms of host work
per step (the H200's host) between the read-back and the next step's launch, where the device
waits for it. The queue keeps arenas on the device until copied; beyond ``max_backlog_bytes`` of
them, ``enqueue`` sends the excess at once.

Host memory comes from a ``PinnedSlabPool`` that lives as long as the capture: steps take
consecutive pieces of large page-locked slabs, and ``clear`` hands them all back for the next
batch: page-locking is paid once per slab, the first time a batch needs it, not once per step.
(This alone did not remove the capture cost measured at batch 512 on the H200; the copy timing
above did most of that, docs/rollout.md.)
"""
from __future__ import annotations

from collections import deque

import torch
from torch import Tensor

from trace_rl.engine.kernel_layout import GuidanceLayout
from trace_rl.guidance_store import GuidanceBatch, GuidanceTable, row_order

SLAB_BYTES = 256 << 20  # page-locked per allocation: large enough that a batch needs few
ALIGN = 256
COPY_BYTES_PER_STEP = 32 << 20  # ~0.6 ms at the H200's 55 GB/s device-to-host: inside a decode step
MAX_BACKLOG_BYTES = 1 << 30  # device memory the queued arenas may hold


class PinnedSlabPool:
    """Bump allocation of uint8 host buffers from page-locked slabs that are kept and reused.

    ``take(n)`` returns a fresh pinned view of n bytes (a new slab when the current one is full);
    ``reset()`` makes every slab free again: the caller must no longer use earlier views, nor have
    copies into them in flight. ``limit_bytes`` caps the pinned total: ``take`` raises
    ``MemoryError`` beyond it instead of exhausting host memory. pin_memory=False: plain host
    memory (CPU-only machines, tests).
    """

    def __init__(self, slab_bytes: int = SLAB_BYTES, limit_bytes: int | None = None, pin_memory: bool = True):
        self.slab_bytes, self.limit_bytes, self.pin_memory = slab_bytes, limit_bytes, pin_memory
        self.slabs: list[Tensor] = []  # uint8 [slab bytes], pinned
        self._slab, self._offset = 0, 0

    @property
    def pinned_bytes(self) -> int:
        return sum(s.numel() for s in self.slabs)

    @property
    def used_bytes(self) -> int:
        return sum(s.numel() for s in self.slabs[:self._slab]) + self._offset

    def reserve(self, nbytes: int, largest_take: int = ALIGN) -> None:
        """Page-lock slabs up front so that the next ``nbytes`` of ``take`` calls, none larger than
        ``largest_take``, allocate nothing. A take that does not fit the rest of a slab moves on to
        the next one, so each slab may leave up to ``largest_take`` - ALIGN bytes unused; new slabs
        hold at least two such takes, so at most half of one is lost that way."""
        largest = -(-max(largest_take, ALIGN) // ALIGN) * ALIGN
        slab = max(self.slab_bytes, 2 * largest)
        while self._usable_bytes(largest - ALIGN) < nbytes:
            if self.limit_bytes is not None and self.pinned_bytes + slab > self.limit_bytes:
                return  # the worst case passes the limit: takes allocate the rest, or raise, as without reserve
            self._new_slab(slab)

    def _usable_bytes(self, tail_waste: int) -> int:
        """Bytes the takes still get from the slabs without a new one, in the worst case."""
        free = [s.numel() for s in self.slabs[self._slab:]]
        if free:
            free[0] -= self._offset
        return sum(max(0, f - tail_waste) for f in free)

    def take(self, nbytes: int) -> Tensor:
        size = -(-nbytes // ALIGN) * ALIGN
        while self._slab < len(self.slabs):
            if self._offset + size <= self.slabs[self._slab].numel():
                view = self.slabs[self._slab][self._offset:self._offset + nbytes]
                self._offset += size
                return view
            self._slab, self._offset = self._slab + 1, 0
        self._new_slab(max(self.slab_bytes, size))
        return self.take(nbytes)

    def _new_slab(self, nbytes: int) -> None:
        if self.limit_bytes is not None and self.pinned_bytes + nbytes > self.limit_bytes:
            raise MemoryError(f"guidance capture needs more than its pinned host-memory limit of "
                              f"{self.limit_bytes / 2**30:.1f} GiB (EngineConfig.guidance_host_gb); "
                              f"generate fewer or shorter sequences per call, or raise the limit")
        self.slabs.append(torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin_memory))

    def reset(self) -> None:
        self._slab, self._offset = 0, 0


class CopyQueue:
    """FIFO of (source, destination) byte buffers copied in budgeted pieces (pure bookkeeping: the
    caller performs the copies). ``take(budget)`` -> [(item, start, end)]; an item leaves the queue
    when its last piece is handed out (``finished`` lists it once)."""

    def __init__(self):
        self.items: deque[list] = deque()  # [payload, nbytes, bytes handed out]
        self.backlog = 0

    def push(self, payload, nbytes: int) -> None:
        if nbytes > 0:
            self.items.append([payload, nbytes, 0])
            self.backlog += nbytes

    def take(self, budget: int) -> tuple[list[tuple[object, int, int]], list[object]]:
        pieces, finished = [], []
        while self.items and budget > 0:
            item = self.items[0]
            payload, nbytes, done = item
            n = min(budget, nbytes - done)
            pieces.append((payload, done, done + n))
            item[2] += n
            budget -= n
            self.backlog -= n
            if item[2] == nbytes:
                finished.append(payload)
                self.items.popleft()
        return pieces, finished

    def clear(self) -> None:
        self.items.clear()
        self.backlog = 0


class AsyncGuidanceCapture:
    def __init__(self, layout: GuidanceLayout, device: torch.device, limit_bytes: int | None = None,
                 copy_bytes_per_step: int = COPY_BYTES_PER_STEP, max_backlog_bytes: int = MAX_BACKLOG_BYTES):
        self.layout, self.device = layout, torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # the engine checks a call's worst case against limit_bytes first; the pool's own cap is a
        # backstop with one slab of slack for rounding to slabs
        cap = None if limit_bytes is None else limit_bytes + SLAB_BYTES
        self.pool = PinnedSlabPool(limit_bytes=cap) if self.stream is not None else None
        self._chunks: list[tuple[Tensor, Tensor, Tensor]] = []  # host arena [B, bytes], seq_ids, positions
        self._out: Tensor | None = None  # uint8 [bytes]: the finalized tables' buffer, reused
        self._last_copy = None  # event after the last issued piece (the copy stream is in order)
        self.copy_bytes_per_step, self.max_backlog_bytes = copy_bytes_per_step, max_backlog_bytes
        self.queue = CopyQueue()  # payload: (device src [n], pinned host dst [n], ready event)

    @property
    def mode(self) -> str:
        return self.layout.mode

    def reserve(self, tokens: int, largest_step_tokens: int) -> None:
        """Page-lock host memory for ``tokens`` rows of guidance now, outside the decode loop; no step
        forwards more than ``largest_step_tokens`` tokens (one arena, one take of the pool)."""
        if self.pool is not None:
            bpt = self.layout.bytes_per_token
            self.pool.reserve(tokens * bpt, largest_take=largest_step_tokens * bpt)

    def enqueue(self, arena: Tensor, seq_ids: Tensor, positions: Tensor, reused: bool) -> None:
        """arena [B, bytes] on the device (B = the step's real tokens); seq_ids, positions int64 [B]
        on the host. reused: the arena belongs to a captured graph, which rewrites it next step."""
        if arena.shape[0] != seq_ids.numel() or seq_ids.shape != positions.shape:
            raise ValueError(f"arena rows {arena.shape[0]} != {seq_ids.numel()} token keys")
        keys = (seq_ids.to("cpu", torch.int64), positions.to("cpu", torch.int64))
        if self.stream is None:
            self._chunks.append((arena.clone(), *keys))
            return
        main = torch.cuda.current_stream(self.device)
        src = arena.clone() if reused else arena  # [B, bytes]: held by the queue until copied out
        ready = torch.cuda.Event()
        ready.record(main)
        host = self.pool.take(arena.numel())  # [B * bytes]
        self.queue.push((src.reshape(-1), host, ready), arena.numel())
        self._chunks.append((host.view(arena.shape), *keys))
        if self.queue.backlog > self.max_backlog_bytes:
            self._issue(self.queue.backlog - self.max_backlog_bytes)

    def issue_step(self) -> None:
        """Send this step's share of the queue to the host (once per step, before ``enqueue``)."""
        if self.stream is not None:
            self._issue(self.copy_bytes_per_step)

    def _issue(self, budget: int) -> None:
        """Copy up to ``budget`` queued bytes to the host on the side stream (no host wait)."""
        pieces, finished = self.queue.take(budget)
        if not pieces:
            return
        with torch.cuda.stream(self.stream):
            for (src, host, ready), start, end in pieces:
                if start == 0:
                    self.stream.wait_event(ready)  # the step that wrote it
                host[start:end].copy_(src[start:end], non_blocking=True)
            for src, _, _ in finished:
                src.record_stream(self.stream)  # freed only after its last piece was read
            self._last_copy = torch.cuda.Event()
            self._last_copy.record(self.stream)

    def _wait(self) -> None:
        if self._last_copy is not None:
            self._last_copy.synchronize()

    def clear(self) -> None:
        """Drop the batch's chunks and return their host memory to the pool (after any copy into
        it has finished: a batch that raised midway may still have copies in flight)."""
        self._wait()
        self.queue.clear()
        self._chunks.clear()
        self._last_copy = None
        if self.pool is not None:
            self.pool.reset()

    def finalize(self) -> GuidanceBatch:
        """The batch's tables: views of one host buffer of rows sorted by (seq_id, position), which
        the next ``finalize`` reuses only once nothing references it any more (so the capture keeps
        one plain host buffer of the largest batch's guidance); ``clear`` may recycle the pool
        right after."""
        if self.stream is not None:
            self._issue(self.queue.backlog)  # what pacing left for the end
        self._wait()  # the one wait of the batch
        tables = {}
        if self._chunks:
            seq_ids = torch.cat([c[1] for c in self._chunks])  # [R]
            positions = torch.cat([c[2] for c in self._chunks])
            # every table has the arena's rows: sort (and drop repeated keys) once, for all of them
            order = row_order(seq_ids, positions)  # [R']
            rows = self._gather_sorted(order, seq_ids.numel())  # [R', bytes per token]
            seq_ids, positions = seq_ids[order], positions[order]
            for (layer, site), f in self.layout.unpack(rows).items():
                tables[(layer, site)] = GuidanceTable(seq_ids, positions, f["scale"],  # shared key columns
                                                      f["block_scales"], f["payload"], f.get("experts"))
        return GuidanceBatch(self.layout.mode, tables)

    def _gather_sorted(self, order: Tensor, total: int) -> Tensor:
        """Rows order[i] of the batch's chunks (concatenated) -> uint8 [len(order), bytes per token].

        Each chunk's rows go straight to their sorted places (no concatenated copy), in words of
        up to 8 bytes (torch gathers uint8 rows byte by byte), into a reused buffer (first-touching
        a fresh one costs more than the copy itself)."""
        width = self.layout.bytes_per_token
        dest = torch.full((total,), -1, dtype=torch.int64)  # concatenated row -> sorted row (-1: dropped)
        dest[order] = torch.arange(order.numel())
        word = next(d for d in (torch.int64, torch.int32, torch.int16, torch.uint8) if width % d.itemsize == 0)
        rows = self._output_rows(order.numel(), width)
        words = rows.view(word)  # [R', width / word size]
        start = 0
        for host, _, _ in self._chunks:  # host [n, width]
            d, src = dest[start:start + host.shape[0]], host
            start += host.shape[0]
            if bool((d < 0).any()):  # a repeated key: an older row of it is dropped
                keep = d >= 0
                d, src = d[keep], src[keep]
            words.index_copy_(0, d, src.view(word))
        return rows

    def _output_rows(self, n: int, width: int) -> Tensor:
        """uint8 [n, width] of the kept output buffer when no earlier batch still uses it, else of
        a new one (kept in its place; the old one lives as long as the batch that views it)."""
        need = n * width
        buf = self._out
        if buf is None or buf.numel() < need or _in_use(buf):
            buf = self._out = torch.empty(need, dtype=torch.uint8)
        return buf[:need].view(n, width)


def _in_use(buf: Tensor) -> bool:
    """Whether anything besides ``buf`` itself references its memory (a view, a tensor made from
    it, a numpy array). Without torch's use-count hook: always (no reuse)."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return True
    # ``buf`` holds one reference, the temporary storage object another
    return count(buf.untyped_storage()._cdata) > 2
