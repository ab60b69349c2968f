"""Tuned MoE tile tables: per GEMM shape, the tile each band of routed rows per expert runs (instead of "auto"'s).

"auto"'s tables (trace_kernels.codegen.ops.moe_gemm) were tuned on the Qwen3 presets. For another MoE shape,
`profiling/sweep_moe_gemm_tiles.py --write-tables FILE` measures candidate tiles on a GPU and writes the fastest per
token count into a tables file; calls whose weights match an entry then use it wherever the default table is "auto"
(environment TRACE_KERNELS_MOE_TABLES: files separated by os.pathsep; or `register(path)`). Every tile runs the same
K order per output element, so a tuned table keeps batch invariance (docs/moe_gemm.md).

File format (JSON, no code is executed):

    {"format": "trace-kernels moe tile tables 1",
     "measured": {...},                                   # free-form provenance (GPU, date, command); not read
     "tables": [{"kind": "gate_up_swiglu",                # gate_up_swiglu | gate_up | down_routed
                 "experts": 8, "n": 28672, "k": 4096,     # the GEMM: experts, N (weight rows), K
                 "rows": [[4.0, {"tile_tokens": 8, "stages": 2, "chunks_per_stage": 4}],
                          [null, {"tile_tokens": 128, "stages": 2, "chunks_per_stage": 2}]]}]}

Built-in tables: the files in codegen/moe_tables (a wheel: trace_kernels/_data/moe_tables) were measured on an H200
for shapes of public models and are used like registered ones (environment TRACE_KERNELS_MOE_BUILTIN_TABLES=0: not
used). A table registered for the same GEMM (a file of the environment's, or `register(path)`) replaces the built-in.

A row [limit, tile] serves calls with at most `limit` routed rows per expert on average (null: any, the last row);
the tile is TileConfig's fields (the others keep their defaults). Each entry is checked when loaded: the kind, the
limits increasing with null last, known tile fields, and a kernel spec that builds for that GEMM (K chunks, N tiles,
shared memory).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

from trace_kernels import env

FORMAT = "trace-kernels moe tile tables 1"
KINDS = ("gate_up_swiglu", "gate_up", "down_routed")  # codegen.ops.moe_gemm.CALL_KINDS
Key = tuple[str, int, int, int]  # (kind, experts, n, k)

_registered: dict[Key, tuple] = {}  # key -> ((limit, TileConfig), ...)
_sources: dict[Key, str] = {}  # key -> the file it came from
_env_loaded: str | None = None  # the TRACE_KERNELS_MOE_TABLES value whose files are in _registered
_builtin: dict[Key, tuple[tuple, str]] | None = None  # key -> (table, its file) of codegen/moe_tables, read once


def _tile(fields: object, where: str):
    from trace_kernels.codegen.ops.moe_gemm import TileConfig
    if not isinstance(fields, dict):
        raise ValueError(f"{where}: a tile is an object of TileConfig fields, got {fields!r}")
    types = {f.name: f.type for f in dataclasses.fields(TileConfig)}
    for name, value in fields.items():
        kind = types.get(name)
        if kind is None:
            raise ValueError(f"{where}: unknown TileConfig field {name!r} (known: {', '.join(types)})")
        expected = {"int": int, "bool": bool, "str": str}[kind if isinstance(kind, str) else kind.__name__]
        if type(value) is not expected:  # bool is not an int here, nor an int a bool
            raise ValueError(f"{where}: {name} must be {expected.__name__}, got {value!r}")
    return TileConfig(**fields)


def _check_entry(entry: object, where: str) -> tuple[Key, tuple]:
    from trace_kernels.codegen.ops import moe_gemm as codegen
    if not isinstance(entry, dict) or set(entry) != {"kind", "experts", "n", "k", "rows"}:
        raise ValueError(f"{where}: an entry has exactly the keys kind, experts, n, k, rows; got {entry!r}"[:400])
    kind, experts, n, k, rows = (entry[key] for key in ("kind", "experts", "n", "k", "rows"))
    if kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not all(type(v) is int and v > 0 for v in (experts, n, k)):
        raise ValueError(f"{where}: experts, n and k must be positive ints, got {experts!r}, {n!r}, {k!r}")
    if kind.startswith("gate_up") and n % 2:
        raise ValueError(f"{where}: a gate_up GEMM's N is 2 x the intermediate size, got {n}")
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{where}: rows must be a non-empty list of [limit, tile]")
    dims = codegen.MoEDims(experts, k, n // 2) if kind.startswith("gate_up") else codegen.MoEDims(experts, n, k)
    table, previous = [], 0.0
    for i, row in enumerate(rows):
        at = f"{where}, row {i}"
        if not isinstance(row, list) or len(row) != 2:
            raise ValueError(f"{at}: a row is [limit, tile], got {row!r}")
        limit, last = row[0], i == len(rows) - 1
        if last and limit is not None:
            raise ValueError(f"{at}: the last row's limit must be null (it serves every larger call)")
        if not last and (type(limit) not in (int, float) or not math.isfinite(limit) or limit <= previous):
            raise ValueError(f"{at}: limits (routed rows per expert) must be finite, positive and increasing; got "
                             f"{limit!r} after {previous}")
        tile = _tile(row[1], at)
        try:  # (gemm_spec checks the tile against K and N, then the kernel's shared memory and pieces)
            codegen.gemm_spec(dims, codegen.launched_kind(kind, tile), tile)
        except ValueError as exc:
            raise ValueError(f"{at}: the tile does not fit this GEMM (N={n}, K={k}): {exc}") from None
        table.append((math.inf if last else float(limit), tile))
        previous = table[-1][0]
    return (kind, experts, n, k), tuple(table)


def load(path: str | os.PathLike) -> dict[Key, tuple]:
    """The tables of one file, checked ({(kind, experts, n, k): ((limit, TileConfig), ...)}); raises ValueError."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"MoE tile tables {path}: cannot read it as JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"MoE tile tables {path}: not a tables file (needs \"format\": \"{FORMAT}\")")
    unknown = set(data) - {"format", "measured", "tables"}
    if unknown or not isinstance(data.get("tables"), list):
        raise ValueError(f"MoE tile tables {path}: keys are format, measured and tables (a list); got {sorted(data)}")
    out: dict[Key, tuple] = {}
    for i, entry in enumerate(data["tables"]):
        key, table = _check_entry(entry, f"MoE tile tables {path}, entry {i}")
        if key in out:
            raise ValueError(f"MoE tile tables {path}: entry {i} repeats {key}")
        out[key] = table
    return out


def _add(tables: dict[Key, tuple], source: str) -> None:
    """Use tables from now on; a key that another source (file, or env:file) holds raises ValueError."""
    for key in tables:
        if key in _registered and _sources[key] != source:
            raise ValueError(f"MoE tile tables {source}: repeats {key}, already registered from {_sources[key]}")
    _registered.update(tables)
    _sources.update(dict.fromkeys(tables, source))


def register(path: str | os.PathLike) -> list[Key]:
    """Load a tables file and use its tables from now on; a key another registered file holds raises ValueError."""
    tables = load(path)
    _add(tables, str(path))
    return list(tables)


def clear() -> None:
    """Forget every registered table (the environment's files are read again at the next lookup)."""
    global _env_loaded
    _registered.clear()
    _sources.clear()
    _env_loaded = None


def _load_env() -> None:
    global _env_loaded
    value = env.get("MOE_TABLES")
    if value == _env_loaded:
        return
    for key in [k for k, src in _sources.items() if src.startswith("env:")]:  # a changed variable replaces its files
        del _registered[key], _sources[key]
    for path in filter(None, value.split(os.pathsep)):
        _add(load(path), f"env:{path}")  # (TRACE_KERNELS_MOE_TABLES)
    _env_loaded = value


def _builtin_tables() -> dict[Key, tuple[tuple, str]]:
    """The shipped tables ({} with TRACE_KERNELS_MOE_BUILTIN_TABLES=0); files read and checked once."""
    global _builtin
    if not env.flag("MOE_BUILTIN_TABLES"):
        return {}
    if _builtin is None:
        from trace_kernels import paths
        found: dict[Key, tuple[tuple, str]] = {}
        for path in sorted(paths.moe_tables_dir().glob("*.json")):
            for key, table in load(path).items():
                if key in found:
                    raise ValueError(f"built-in MoE tile tables {path}: repeats {key}, also in {found[key][1]}")
                found[key] = (table, str(path))
        _builtin = found
    return _builtin


def lookup(kind: str, experts: int, n: int, k: int) -> tuple | None:
    """The tuned table of a GEMM, or None (the caller then uses its default table): a registered one (a file of the
    environment's, or register()), else a built-in one."""
    _load_env()
    key = (kind, experts, n, k)
    if key in _registered:
        return _registered[key]
    builtin = _builtin_tables().get(key)
    return None if builtin is None else builtin[0]


def registered() -> list[tuple[Key, str, tuple]]:
    """(key, the file it came from, table) of every registered table (the environment's files included; not the
    built-in ones: builtin())."""
    _load_env()
    return [(key, _sources[key].removeprefix("env:"), table) for key, table in _registered.items()]


def builtin() -> list[tuple[Key, str, tuple, bool]]:
    """(key, its file, table, whether a registered table replaces it) of every built-in table in use."""
    _load_env()
    return [(key, source, table, key in _registered) for key, (table, source) in _builtin_tables().items()]


def best_rows(results: list[dict], time_key: str, experts: int) -> list[tuple[float, object]]:
    """(limit, TileConfig) rows from a tile sweep's results (dicts of "rows" (routed rows), TileConfig's fields and
    time_key, several tiles per token count): per token count the fastest tile, serving up to that count's routed
    rows per expert; neighbours with the same tile merged; the last row unlimited."""
    from trace_kernels.codegen.ops.moe_gemm import TileConfig
    names = {f.name for f in dataclasses.fields(TileConfig)}
    best: dict[int, dict] = {}
    for r in results:
        if time_key in r and (r["rows"] not in best or r[time_key] < best[r["rows"]][time_key]):
            best[r["rows"]] = r
    if not best:
        raise ValueError(f"no sweep result has {time_key!r}")
    out: list[tuple[float, object]] = []
    for rows in sorted(best):
        tile = TileConfig(**{key: value for key, value in best[rows].items() if key in names})
        if out and out[-1][1] == tile:
            out[-1] = (rows / experts, tile)
        else:
            out.append((rows / experts, tile))
    out[-1] = (math.inf, out[-1][1])
    return out


def entry(kind: str, experts: int, n: int, k: int, rows: list[tuple[float, object]]) -> dict:
    """A tables-file entry from (limit, TileConfig) rows (the last limit is written as null); checked like a loaded
    one."""
    from trace_kernels.codegen.ops.moe_gemm import TileConfig
    defaults = TileConfig(8, 2)
    out = {"kind": kind, "experts": experts, "n": n, "k": k, "rows": [
        [None if i == len(rows) - 1 else float(limit),
         {f.name: getattr(tile, f.name) for f in dataclasses.fields(tile)
          if f.name in ("tile_tokens", "stages") or getattr(tile, f.name) != getattr(defaults, f.name)}]
        for i, (limit, tile) in enumerate(rows)]}
    _check_entry(out, f"entry for {(kind, experts, n, k)}")
    return out


def write(path: str | os.PathLike, entries: list[dict], measured: dict) -> None:
    """A tables file with these entries (checked by loading it back)."""
    Path(path).write_text(json.dumps({"format": FORMAT, "measured": measured, "tables": entries}, indent=1) + "\n")
    load(path)
