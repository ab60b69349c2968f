"""TRACE guidance of one rollout batch: in-memory tables, lookup, and the on-disk store.

In memory
---------
``GuidanceBatch(mode, tables)``: ``tables[(layer, site)]`` is a ``GuidanceTable`` whose rows are
tokens sorted by (seq_id, position), unique. Per row (``S`` = the slot shape of the site:
``()`` for moe_in, ``(k,)`` for moe_act, ``(Hkv,)`` for k/v; ``D`` = the quantized last dim):

- ``seq_ids`` int64 [R], ``positions`` int64 [R]
- ``scale`` float32 [R, *S] (FP32 second-level scale of each quantized row)
- ``block_scales`` float8_e4m3fn [R, *S, D/16]
- ``payload`` uint8: ``mantissa_bits`` [R, *S, D/8] (compact) or packed ``codes`` [R, *S, D/2] (full)
- ``experts`` int64 [R, k] for moe_act (the rollout's expert of each slot), else None

``batch.lookup(layer, site, seq_ids, positions) -> (trace_kernels.nvfp4.Guidance, found)``
returns guidance rows for the queried tokens in query order (rows not found are zero-filled and
``found`` bool [N] is False there); ``batch.experts(layer, seq_ids, positions) -> (int64 [N, k], found)``.
``batch.select(seq_ids=None, positions=None)``, ``batch.to(device, copy=False)`` (memory shared
between tables stays shared, and moves in one copy), ``batch.stats()``.

On disk (``write_guidance`` / ``read_guidance``)
-----------------------------------------------
One safetensors file per rollout batch. Tensor names ``L{layer}.{site}.{field}`` with field in
seq_ids, positions, scale, block_scales, mantissa_bits|codes, experts. The safetensors metadata holds
``format = "trace-guidance"``, ``version = "1"``, ``mode``, and ``checksum = "sha256:<hex>"`` over
every tensor (name, dtype, shape and raw bytes, names in sorted order). Files are written to a
temporary name in the same directory, fsynced, then atomically renamed. A missing file raises
``FileNotFoundError``; a truncated or corrupted file, a checksum mismatch, a wrong format or version
raises ``GuidanceStoreError`` naming the file and the problem.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from trace_kernels import nvfp4

FORMAT = "trace-guidance"
VERSION = "1"
_KEY_SHIFT = 32  # key = seq_id << 32 | position


class GuidanceStoreError(RuntimeError):
    """A guidance file that cannot be trusted (truncated, corrupted, wrong format or version)."""


def _keys(seq_ids: Tensor, positions: Tensor) -> Tensor:
    return (seq_ids.to(torch.int64) << _KEY_SHIFT) | positions.to(torch.int64)


def _make_guidance(mode: str, scale: Tensor, block_scales: Tensor, payload: Tensor):
    if mode == "compact":
        return nvfp4.Guidance(scale=scale, block_scales=block_scales, mantissa_bits=payload)
    return nvfp4.Guidance(scale=scale, block_scales=block_scales, codes=payload)


def row_order(seq_ids: Tensor, positions: Tensor) -> Tensor:
    """Indices that sort rows by (seq_id, position), keeping the last recorded row of a repeated key."""
    keys = _keys(seq_ids, positions)
    order = torch.sort(keys, stable=True).indices
    sk = keys[order]
    last = torch.ones_like(sk, dtype=torch.bool)
    last[:-1] = sk[1:] != sk[:-1]
    return order[last]


@dataclass
class GuidanceTable:
    seq_ids: Tensor  # int64 [R]
    positions: Tensor  # int64 [R]
    scale: Tensor  # float32 [R, *S]
    block_scales: Tensor  # float8_e4m3fn [R, *S, D/16]
    payload: Tensor  # uint8 [R, *S, D/8] (compact) | [R, *S, D/2] (full)
    experts: Tensor | None = None  # int64 [R, k] (moe_act only)

    @classmethod
    def from_rows(cls, seq_ids, positions, scale, block_scales, payload, experts=None):
        """Sort rows by (seq_id, position); where a key repeats, the last recorded row wins."""
        order = row_order(seq_ids, positions)
        pick = lambda t: None if t is None else t[order]
        return cls(seq_ids[order], positions[order], scale[order], block_scales[order],
                   payload[order], pick(experts))

    @property
    def num_rows(self) -> int:
        return self.seq_ids.numel()

    @property
    def num_elements(self) -> int:
        return self.block_scales.numel() * 16

    @property
    def guidance_nbytes(self) -> int:
        """Bytes of guidance proper (scales, block scales, bits/codes), without the key columns."""
        return sum(t.numel() * t.element_size() for t in (self.scale, self.block_scales, self.payload))

    def tensors(self) -> dict[str, Tensor]:
        out = {"seq_ids": self.seq_ids, "positions": self.positions, "scale": self.scale,
               "block_scales": self.block_scales, "payload": self.payload}
        if self.experts is not None:
            out["experts"] = self.experts
        return out

    def _rows(self, mask: Tensor) -> "GuidanceTable":
        t = {k: v[mask] for k, v in self.tensors().items()}
        return GuidanceTable(**t)

    def to(self, device, copy: bool = False) -> "GuidanceTable":
        names, values = zip(*self.tensors().items())
        return GuidanceTable(**dict(zip(names, to_device_sharing(list(values), device, copy))))

    def find(self, seq_ids: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Row index of each queried token (clamped, valid where found) and the found mask."""
        q = _keys(seq_ids.to(self.seq_ids.device), positions.to(self.seq_ids.device))
        keys = _keys(self.seq_ids, self.positions)
        if keys.numel() == 0:
            return torch.zeros_like(q), torch.zeros_like(q, dtype=torch.bool)
        idx = torch.searchsorted(keys, q).clamp_(max=keys.numel() - 1)
        return idx, keys[idx] == q


class GuidanceBatch:
    """Guidance of one rollout batch; see the module docstring."""

    def __init__(self, mode: str, tables: dict[tuple[int, str], GuidanceTable]):
        self.mode = mode
        self.tables = dict(sorted(tables.items()))

    def __repr__(self) -> str:
        s = self.stats()
        return (f"GuidanceBatch(mode={self.mode!r}, tables={len(self.tables)}, "
                f"tokens={s['tokens']}, bytes={s['guidance_bytes']}, "
                f"bits/element={s['bits_per_element']:.3f})")

    def table(self, layer: int, site: str) -> GuidanceTable:
        try:
            return self.tables[(layer, site)]
        except KeyError:
            raise KeyError(f"no guidance recorded for layer {layer} site {site!r}; have "
                           f"{sorted(self.tables)}") from None

    def lookup(self, layer: int, site: str, seq_ids: Tensor, positions: Tensor):
        """Guidance rows for tokens (seq_ids, positions) int64 [N] -> (Guidance [N, *S, ...], found [N])."""
        t = self.table(layer, site)
        idx, found = t.find(seq_ids, positions)
        gather = lambda x: _zero_missing(x[idx], found)
        return _make_guidance(self.mode, gather(t.scale), gather(t.block_scales),
                              gather(t.payload)), found

    def experts(self, layer: int, seq_ids: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The rollout's expert per (token, slot) at moe_act of ``layer`` -> (int64 [N, k], found);
        rows not found are -1."""
        t = self.table(layer, "moe_act")
        idx, found = t.find(seq_ids, positions)
        e = t.experts[idx]
        return torch.where(found[:, None], e, torch.full_like(e, -1)), found

    def select(self, seq_ids=None, positions: tuple[int, int] | None = None) -> "GuidanceBatch":
        """Rows of the given sequence ids and/or positions in [lo, hi)."""
        out = {}
        for key, t in self.tables.items():
            m = torch.ones(t.num_rows, dtype=torch.bool, device=t.seq_ids.device)
            if seq_ids is not None:
                ids = torch.as_tensor(list(seq_ids) if not isinstance(seq_ids, Tensor) else seq_ids,
                                      dtype=torch.int64, device=t.seq_ids.device)
                m &= torch.isin(t.seq_ids, ids)
            if positions is not None:
                lo, hi = positions
                m &= (t.positions >= lo) & (t.positions < hi)
            out[key] = t._rows(m)
        return GuidanceBatch(self.mode, out)

    def to(self, device, copy: bool = False) -> "GuidanceBatch":
        """The batch on ``device``; tables that share memory keep sharing it (one copy per buffer)."""
        keys = list(self.tables)
        fields = [list(self.tables[k].tensors().items()) for k in keys]
        moved = iter(to_device_sharing([v for f in fields for _, v in f], device, copy))
        return GuidanceBatch(self.mode, {k: GuidanceTable(**{name: next(moved) for name, _ in f})
                                         for k, f in zip(keys, fields)})

    def stats(self) -> dict:
        """Guidance bytes (scales + bits/codes, no key columns), elements covered, bits/element,
        distinct tokens and bytes/token."""
        nbytes = sum(t.guidance_nbytes for t in self.tables.values())
        elems = sum(t.num_elements for t in self.tables.values())
        # tables that share their key columns (as the engine's capture makes them) count once;
        # a table's keys are unique, so one set of them needs no torch.unique
        distinct = {(t.seq_ids.data_ptr(), t.positions.data_ptr(), t.num_rows): t for t in self.tables.values()}
        keys = [_keys(t.seq_ids, t.positions).cpu() for t in distinct.values()]
        tokens = keys[0].numel() if len(keys) == 1 else int(torch.unique(torch.cat(keys)).numel()) if keys else 0
        return {"mode": self.mode, "guidance_bytes": nbytes, "elements": elems,
                "bits_per_element": 8.0 * nbytes / elems if elems else 0.0,
                "tokens": tokens, "bytes_per_token": nbytes / tokens if tokens else 0.0}


def to_device_sharing(tensors: list[Tensor], device, copy: bool = False) -> list[Tensor]:
    """``tensors`` on ``device`` (copy: even those already there, as ``Tensor.to``), as the same
    views of the same memory: each block of memory they share moves as one copy of the bytes they
    span. The engine's tables are strided views of one
    sorted buffer with shared key columns; moved one by one, each field would first be made
    contiguous on the host (a byte-by-byte pass over the whole batch) and copied on its own."""
    device = torch.device(device)
    spans: dict[int, list] = {}  # storage address -> [storage, first byte, end byte]
    for t in tensors:
        if (copy or t.device != device) and t.numel():
            st = t.untyped_storage()
            lo = t.storage_offset() * t.element_size()
            hi = lo + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()
            span = spans.setdefault(st.data_ptr(), [st, lo, hi])
            span[1], span[2] = min(span[1], lo), max(span[2], hi)
    moved = {}
    for key, (st, lo, hi) in spans.items():
        lo -= lo % 16  # keeps every view's offset a whole number of its elements
        moved[key] = (torch.empty(0, dtype=torch.uint8).set_(st)[lo:hi].to(device, copy=True), lo)
    out = []
    for t in tensors:
        if t.device == device and not copy:
            out.append(t)
        elif not t.numel():
            out.append(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device))
        else:
            raw, lo = moved[t.untyped_storage().data_ptr()]
            offset = (t.storage_offset() * t.element_size() - lo) // t.element_size()
            out.append(torch.empty(0, dtype=t.dtype, device=device).set_(raw.untyped_storage(), offset,
                                                                          t.shape, t.stride()))
    return out


def _zero_missing(x: Tensor, found: Tensor) -> Tensor:
    m = found.view(-1, *([1] * (x.dim() - 1)))
    if x.dtype == torch.float8_e4m3fn:  # no arithmetic on fp8: select on its bytes
        return torch.where(m, x.view(torch.uint8), 0).view(x.dtype)
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


# ----------------------------------------------------------------------------- on disk

_PAYLOAD_NAME = {"compact": "mantissa_bits", "full": "codes"}


def _checksum(tensors: dict[str, Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous().cpu()
        h.update(f"{name}|{str(t.dtype)}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.view(torch.uint8).reshape(-1).numpy())  # the tensor's own bytes, not a copy
    return "sha256:" + h.hexdigest()


def _flatten(batch: GuidanceBatch) -> dict[str, Tensor]:
    """File tensors, each in memory of its own (safetensors refuses tensors that share memory, as
    the engine's tables do: key columns shared by all tables, fields that view one buffer)."""
    out, seen = {}, set()
    for (layer, site), t in batch.tables.items():
        for field, v in t.tensors().items():
            name = _PAYLOAD_NAME[batch.mode] if field == "payload" else field
            v = v.detach().cpu()
            owns = (v.is_contiguous() and v.storage_offset() == 0
                    and v.untyped_storage().nbytes() == v.numel() * v.element_size())
            if not owns or v.untyped_storage().data_ptr() in seen:
                v = v.clone(memory_format=torch.contiguous_format)
            seen.add(v.untyped_storage().data_ptr())
            out[f"L{layer}.{site}.{name}"] = v
    return out


def write_guidance(path, batch: GuidanceBatch) -> dict:
    """Write ``batch`` to ``path`` atomically; returns {"path", "bytes", **batch.stats()}."""
    from trace_rl.engine.ranges import nvtx_range

    with nvtx_range("rollout/guidance_write"):
        return _write(Path(path), batch)


def _write(path: Path, batch: GuidanceBatch) -> dict:
    from safetensors.torch import save_file

    tensors = _flatten(batch)
    meta = {"format": FORMAT, "version": VERSION, "mode": batch.mode,
            "tables": json.dumps([[l, s] for (l, s) in batch.tables]),
            "checksum": _checksum(tensors)}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.close(fd)
        save_file(tensors, tmp, metadata=meta)  # straight from the tensors, no file image in memory
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return {"path": str(path), "bytes": path.stat().st_size, **batch.stats()}


def read_guidance(path, seq_ids=None, positions: tuple[int, int] | None = None,
                  device="cpu", verify: bool = True) -> GuidanceBatch:
    """Load a guidance file, optionally only some sequence ids / positions [lo, hi), onto ``device``.

    The checksum covers the whole file and is verified before anything is returned."""
    from trace_rl.engine.ranges import nvtx_range

    with nvtx_range("rollout/guidance_read"):
        return _read(Path(path), seq_ids, positions, device, verify)


def _read(path: Path, seq_ids, positions, device, verify) -> GuidanceBatch:
    from safetensors import SafetensorError
    from safetensors.torch import load

    if not path.is_file():
        raise FileNotFoundError(f"guidance file {path} does not exist")
    data = path.read_bytes()
    if len(data) < 8:
        raise GuidanceStoreError(f"guidance file {path} is truncated ({len(data)} bytes)")
    header_len = int.from_bytes(data[:8], "little")
    if 8 + header_len > len(data):
        raise GuidanceStoreError(f"guidance file {path} is truncated (header of {header_len} bytes, "
                                 f"file of {len(data)})")
    try:
        header = json.loads(data[8:8 + header_len])
    except (ValueError, UnicodeDecodeError) as e:
        raise GuidanceStoreError(f"guidance file {path}: unreadable header ({e})") from None
    meta = (header.get("__metadata__") if isinstance(header, dict) else None) or {}
    if meta.get("format") != FORMAT:
        raise GuidanceStoreError(f"guidance file {path}: format {meta.get('format')!r}, "
                                 f"expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise GuidanceStoreError(f"guidance file {path}: version {meta.get('version')!r}, this "
                                 f"reader supports version {VERSION!r}")
    mode = meta.get("mode")
    if mode not in _PAYLOAD_NAME:
        raise GuidanceStoreError(f"guidance file {path}: unknown mode {mode!r}")
    try:
        tensors = load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise GuidanceStoreError(f"guidance file {path} is truncated or corrupted: {e}") from None
    if verify and _checksum(tensors) != meta.get("checksum"):
        raise GuidanceStoreError(f"guidance file {path}: checksum mismatch (corrupted data)")
    tables = {}
    try:
        for layer, site in json.loads(meta["tables"]):
            p = f"L{layer}.{site}."
            tables[(layer, site)] = GuidanceTable(
                tensors[p + "seq_ids"], tensors[p + "positions"], tensors[p + "scale"],
                tensors[p + "block_scales"], tensors[p + _PAYLOAD_NAME[mode]],
                tensors.get(p + "experts"))
    except KeyError as e:
        raise GuidanceStoreError(f"guidance file {path}: missing tensor {e}") from None
    batch = GuidanceBatch(mode, tables)
    if seq_ids is not None or positions is not None:
        batch = batch.select(seq_ids, positions)
    return batch.to(device)  # the same device: the same batch
