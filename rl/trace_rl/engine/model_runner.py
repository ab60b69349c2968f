"""Runs the model for one engine step (prefill or decode) over the paged KV cache.

Inputs are built on the host per step and passed explicitly (a ``StepInputs``), never through
module globals. In nvfp4 mode the runner's quantizer fake-quantizes routed-expert GEMM inputs,
stores the K/V codes it chose into the NVFP4 pages, and (capture on) records guidance.
On CUDA in bf16 mode the decode step is captured in CUDA graphs, one per batch-size bucket; the
reference NVFP4 path checks its input for NaN/Inf on the host, so nvfp4 decode runs eagerly until
the fused kernels (issues 4/5) replace it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from trace_rl.engine.block_manager import BlockManager
from trace_rl.engine.kv_cache import PagedAttention, PagedKVCache
from trace_rl.engine.sequence import Sequence
from trace_rl.quant import GuidanceRecorder, RoundToNearest, TokenIndex


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


class ModelRunner:
    def __init__(self, model, cache: PagedKVCache, blocks: BlockManager, mode: str,
                 recorder: GuidanceRecorder | None, device: torch.device, cuda_graphs: bool,
                 max_num_seqs: int, max_blocks_per_seq: int):
        self.model, self.cache, self.blocks, self.device = model, cache, blocks, device
        self.mode, self.recorder = mode, recorder
        self.max_blocks_per_seq = max_blocks_per_seq
        self.graphs: dict[int, _DecodeGraph] = {}
        # graphs need a sync-free step: the grouped GEMM keeps offsets on the device only on sm_90+
        self.use_graphs = (cuda_graphs and device.type == "cuda" and mode == "bf16"
                           and torch.cuda.get_device_capability(device)[0] >= 9)
        self.max_num_seqs = max_num_seqs

    def _store_kv(self, slots: Tensor, layer: int, site: str, q, index) -> None:
        """The K/V quantizer's callback: its NVFP4 codes go straight into the step's cache slots."""
        if site in ("k", "v"):
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
        # Every step attends over the same number of key slots (max_model_len rounded up to
        # pages): with a batch-dependent key length, CPU attention kernels reduce in a different
        # order and a sequence's BF16 logits would depend on its batch-mates.
        nblk = self.max_blocks_per_seq
        tables = [s.block_table + [0] * (nblk - len(s.block_table)) for s in seqs]
        qpos = torch.zeros(len(seqs), Tq, dtype=torch.int64)
        qpos[torch.tensor(row), torch.tensor(col)] = torch.tensor(pos)
        dev = self.device
        as_t = lambda x: torch.tensor(x, dtype=torch.int64).to(dev, non_blocking=True)
        return StepInputs(as_t(tok), as_t(pos), as_t(sid), as_t(slots), as_t(row), as_t(col),
                          as_t(tables), qpos.to(dev, non_blocking=True), as_t(last))

    def forward(self, x: StepInputs) -> tuple[Tensor, list[Tensor]]:
        """-> (logits [B, V] at each sequence's last token, experts per MoE layer [N, k])."""
        backend = PagedAttention(self.cache, x.slots, x.q_row, x.q_col, x.block_tables, x.query_pos)
        quant = None
        if self.mode == "nvfp4":  # bound to this step's cache slots
            quant = RolloutQuantizer(capture=self.recorder,
                                     on_quantized=functools.partial(self._store_kv, x.slots))
        index = TokenIndex(x.seq_ids, x.positions)
        hidden, topk = self.model.forward_tokens(x.token_ids, x.positions, backend, quant, index)
        return self.model.logits(hidden.index_select(0, x.last)), topk

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], prefill: bool) -> tuple[Tensor, list[Tensor], StepInputs]:
        x = self.prepare(seqs, prefill)
        if prefill or not self.use_graphs:
            logits, topk = self.forward(x)
        else:
            logits, topk = self._graph_for(len(seqs)).replay(x)
        for s in seqs:
            s.num_cached = len(s)
        return logits, topk, x

    # ------------------------------------------------------------------ CUDA graphs (bf16 decode)
    def _graph_for(self, batch: int) -> "_DecodeGraph":
        bucket = 1
        while bucket < batch:
            bucket *= 2
        bucket = min(bucket, self.max_num_seqs)
        if bucket not in self.graphs:
            self.graphs[bucket] = _DecodeGraph(self, bucket)
        return self.graphs[bucket]


class _DecodeGraph:
    """A decode step for up to ``size`` sequences captured once; padded rows decode token 0 at
    position 0 into the scratch page 0 and their outputs are dropped."""

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
            for _ in range(2):  # warm up kernels and allocator outside the graph
                runner.forward(self.static)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits, self.topk = runner.forward(self.static)

    def replay(self, x: StepInputs) -> tuple[Tensor, list[Tensor]]:
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
        return self.logits[:B], [t[:B] for t in self.topk]
