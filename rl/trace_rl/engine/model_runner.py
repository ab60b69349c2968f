"""Runs the model for one engine step (prefill or decode) over the paged KV cache.

Inputs are built on the host per step and passed explicitly (a ``StepInputs``), never through
module globals. Backends in nvfp4 mode:

- ``reference``: ``RolloutQuantizer`` fake-quantizes routed-expert GEMM inputs with the
  ``trace_kernels.nvfp4`` reference, stores the K/V codes it chose into the NVFP4 pages and (capture
  on) records guidance through ``GuidanceRecorder``. It checks for NaN/Inf on the host, so its
  decode runs eagerly.
- ``kernels`` / ``kernels_emulated``: ``KernelQuantizer`` (``kernel_moe``) runs the MoE block on
  the fused NVFP4 kernels (or their torch emulation) over ``PackedExperts`` and collects every
  guidance output (``GuidanceParts``); the runner concatenates them into the step's arena
  (``GuidanceLayout``), which the engine hands to ``AsyncGuidanceCapture``. The kernel path has
  no host sync, so its decode step is captured.

CUDA graphs (bf16 mode and the ``kernels`` backend, sm_90+): one graph per batch-size bucket
(powers of two up to max_num_seqs) sharing one memory pool; padded rows decode token 0 at
position 0 into the scratch page 0 and their outputs are dropped.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from trace_kernels.runtime.graphs import capture_graph
from trace_rl.engine.block_manager import BlockManager
from trace_rl.engine.kernel_layout import GuidanceLayout, GuidanceParts
from trace_rl.engine.kernel_moe import (EMULATED_OPS, KERNEL_OPS, KernelDecodeAttention, KernelQuantizer,
                                        PackedExperts)
from trace_rl.engine.kv_cache import PagedAttention, PagedKVCache
from trace_rl.engine.sequence import Sequence
from trace_rl.quant import GuidanceRecorder, RoundToNearest, TokenIndex

KERNEL_BACKENDS = ("kernels", "kernels_emulated")


class RolloutQuantizer(RoundToNearest):
    """Round-to-nearest at the activation sites; expert weights are already fake-quantized in
    place by refit, so ``weight`` passes them through."""

    def weight(self, layer, name, w):
        return w


@dataclass
class StepInputs:
    token_ids: Tensor  # int64 [N]
    positions: Tensor  # int64 [N]
    seq_ids: Tensor  # int64 [N]
    slots: Tensor  # int64 [N]
    q_row: Tensor  # int64 [N]
    q_col: Tensor  # int64 [N]
    block_tables: Tensor  # int64 [B, nblk]
    query_pos: Tensor  # int64 [B, Tq]
    last: Tensor  # int64 [B]: flat index of each sequence's last token (its logits are sampled)
    seq_ids_cpu: Tensor | None = None  # int64 [N] host copies: guidance keys without a D2H copy
    positions_cpu: Tensor | None = None


class ModelRunner:
    def __init__(self, model, cache: PagedKVCache, blocks: BlockManager, mode: str,
                 recorder: GuidanceRecorder | None, device: torch.device, cuda_graphs: bool,
                 max_num_seqs: int, max_blocks_per_seq: int, backend: str = "reference",
                 experts: PackedExperts | None = None, layout: GuidanceLayout | None = None,
                 kv_kernels: bool = False):
        self.model, self.cache, self.blocks, self.device = model, cache, blocks, device
        self.mode, self.recorder = mode, recorder
        self.backend, self.experts, self.layout = backend, experts, layout
        self.kv_kernels = kv_kernels  # decided by the engine (shapes, device, mode)
        if backend in KERNEL_BACKENDS and experts is None:
            raise ValueError(f"backend {backend!r} needs the packed expert weights")
        self.max_blocks_per_seq = max_blocks_per_seq
        self.graphs: dict[int, _DecodeGraph] = {}
        # graphs need a sync-free step: the grouped GEMMs keep offsets on the device (sm_90+);
        # the reference nvfp4 path reads NaN/Inf checks back on the host
        self.use_graphs = (cuda_graphs and device.type == "cuda"
                           and (mode == "bf16" or backend == "kernels")
                           and torch.cuda.get_device_capability(device)[0] >= 9)
        self.graph_pool = None
        self.max_num_seqs = max_num_seqs
        self.shadow: GuidanceRecorder | None = None  # tests: reference guidance of the kernels' inputs
        self.last_step_graphed = False
        self._tables_key: tuple[int, ...] | None = None  # seq_ids of the cached block tables
        self._tables: Tensor | None = None

    def _store_kv(self, slots: Tensor, layer: int, site: str, q, index) -> None:
        """The K/V quantizer's callback: its NVFP4 codes go straight into the step's cache slots."""
        if site in ("k", "v"):
            self._write_kv(slots, layer, site, q)

    def _write_kv(self, slots: Tensor, layer: int, site: str, q) -> None:
        pages = self.cache.k[layer] if site == "k" else self.cache.v[layer]
        pages.write_quantized(slots, q)

    def prepare(self, seqs: list[Sequence], prefill: bool) -> StepInputs:
        tok, pos, sid, slots, row, col, last = [], [], [], [], [], [], []
        for b, s in enumerate(seqs):
            start = s.num_cached if prefill else len(s) - 1
            for t in range(start, len(s)):
                tok.append(s.token_ids[t]); pos.append(t); sid.append(s.seq_id)
                slots.append(self.blocks.slot(s, t)); row.append(b); col.append(t - start)
            last.append(len(tok) - 1)
        Tq = max(col) + 1
        qpos = torch.zeros(len(seqs), Tq, dtype=torch.int64)
        qpos[torch.tensor(row), torch.tensor(col)] = torch.tensor(pos)
        dev = self.device
        host = lambda x: torch.tensor(x, dtype=torch.int64)
        pos_cpu, sid_cpu = host(pos), host(sid)
        as_t = lambda x: (x if isinstance(x, Tensor) else host(x)).to(dev, non_blocking=True)
        return StepInputs(as_t(tok), as_t(pos_cpu), as_t(sid_cpu), as_t(slots), as_t(row), as_t(col),
                          self._block_tables(seqs), qpos.to(dev, non_blocking=True), as_t(last),
                          seq_ids_cpu=sid_cpu, positions_cpu=pos_cpu)

    def _block_tables(self, seqs: list[Sequence]) -> Tensor:
        """int64 [B, max_blocks_per_seq] on the device, padded with the scratch page 0.

        Every step attends over the same number of key slots (max_model_len rounded up to pages):
        with a batch-dependent key length, CPU attention kernels reduce in a different order and a
        sequence's BF16 logits would depend on its batch-mates. A sequence's pages are fixed from
        admission to retirement, so the table is rebuilt only when the batch's sequences change:
        at 32K-128K tokens per sequence, rebuilding B x 2K-8K entries from Python lists every
        decode step would cost far more than the step itself.
        """
        key = tuple(s.seq_id for s in seqs)
        if key != self._tables_key:
            tables = torch.zeros(len(seqs), self.max_blocks_per_seq, dtype=torch.int64)
            for b, s in enumerate(seqs):
                if s.block_table_tensor is None:
                    s.block_table_tensor = torch.tensor(s.block_table, dtype=torch.int64)
                tables[b, :len(s.block_table)] = s.block_table_tensor
            self._tables, self._tables_key = tables.to(self.device, non_blocking=True), key
        return self._tables

    def quantizer(self, x: StepInputs, parts: GuidanceParts | None, defer_kv: bool = False):
        """The step's quantizer (None in bf16 mode), bound to its cache slots and guidance parts."""
        if self.backend in KERNEL_BACKENDS:
            ops = KERNEL_OPS if self.backend == "kernels" else EMULATED_OPS
            return KernelQuantizer(self.experts, ops, self.layout.mode if self.layout else None, parts,
                                   kv_store=functools.partial(self._write_kv, x.slots),
                                   shadow=self.shadow, defer_kv=defer_kv)
        if self.mode == "nvfp4":
            return RolloutQuantizer(capture=self.recorder,
                                    on_quantized=functools.partial(self._store_kv, x.slots))
        return None

    def forward(self, x: StepInputs) -> tuple[Tensor, list[Tensor], Tensor | None]:
        """-> (logits [B, V] at each sequence's last token, experts per MoE layer [N, k],
        guidance arena uint8 [N, bytes_per_token] or None)."""
        parts = None
        if self.backend in KERNEL_BACKENDS and self.layout is not None:
            parts = self.layout.collector()
        one_token_each = x.query_pos.shape[1] == 1  # decode (N == B): the paged-KV kernels' case
        kv_kernels = self.kv_kernels and one_token_each
        quant = self.quantizer(x, parts, defer_kv=kv_kernels)
        index = TokenIndex(x.seq_ids, x.positions)
        if kv_kernels:
            ops = EMULATED_OPS if self.backend == "kernels_emulated" else KERNEL_OPS
            backend = KernelDecodeAttention(self.cache, ops, x.slots, x.block_tables, x.positions, index,
                                            quant if self.backend in KERNEL_BACKENDS else None)
        else:
            backend = PagedAttention(self.cache, x.slots, x.q_row, x.q_col, x.block_tables, x.query_pos,
                                     gather_kernel=self.kv_kernels and self.backend == "kernels")
        hidden, topk = self.model.forward_tokens(x.token_ids, x.positions, backend, quant, index)
        arena = None if parts is None else parts.assemble()  # [N, bytes_per_token]
        return self.model.logits(hidden.index_select(0, x.last)), topk, arena

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], prefill: bool):
        """-> (logits [B, V], experts per MoE layer [N, k], StepInputs, guidance arena [N, bytes] or
        None). ``last_step_graphed`` tells whether the arena belongs to a captured graph."""
        x = self.prepare(seqs, prefill)
        self.last_step_graphed = not prefill and self.use_graphs and self.shadow is None
        if self.last_step_graphed:
            logits, topk, arena = self._graph_for(len(seqs)).replay(x)
        else:
            logits, topk, arena = self.forward(x)
        for s in seqs:
            s.num_cached = len(s)
        return logits, topk, x, arena

    # ------------------------------------------------------------------ CUDA graphs (decode)
    def _graph_for(self, batch: int) -> "_DecodeGraph":
        bucket = 1
        while bucket < batch:
            bucket *= 2
        bucket = min(bucket, self.max_num_seqs)
        if bucket not in self.graphs:
            if self.graph_pool is None:
                self.graph_pool = torch.cuda.graph_pool_handle()
            self.graphs[bucket] = _DecodeGraph(self, bucket)
        return self.graphs[bucket]


class _DecodeGraph:
    """A decode step for up to ``size`` sequences captured once; padded rows decode token 0 at
    position 0 into the scratch page 0 and their outputs are dropped. Graphs of all buckets share
    the runner's memory pool (one replays at a time; the guidance capture clones a graph's arena
    before copying it to the host, so the next replay may rewrite it)."""

    def __init__(self, runner: ModelRunner, size: int):
        dev, nblk = runner.device, runner.max_blocks_per_seq
        z = lambda *shape: torch.zeros(*shape, dtype=torch.int64, device=dev)
        ar = torch.arange(size, dtype=torch.int64, device=dev)
        self.static = StepInputs(z(size), z(size), z(size), z(size), ar.clone(), z(size),
                                 z(size, nblk), z(size, 1), ar.clone())
        self.runner, self.size = runner, size
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels (JIT, smem attributes) and allocator outside the graph
                runner.forward(self.static)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with capture_graph(self.graph, pool=runner.graph_pool):  # the cyclic GC paused: see capture_graph
            self.logits, self.topk, self.arena = runner.forward(self.static)

    def replay(self, x: StepInputs) -> tuple[Tensor, list[Tensor], Tensor | None]:
        B, s = x.token_ids.shape[0], self.static
        for name in ("token_ids", "positions", "seq_ids", "slots"):
            dst = getattr(s, name)
            dst.zero_()
            dst[:B].copy_(getattr(x, name))
        s.block_tables.zero_()
        s.block_tables[:B].copy_(x.block_tables)
        s.query_pos.zero_()
        s.query_pos[:B].copy_(x.query_pos)
        self.graph.replay()
        arena = None if self.arena is None else self.arena[:B]
        return self.logits[:B], [t[:B] for t in self.topk], arena
