"""Tuned MoE tile tables (trace_kernels.moe_tables): the file format's checks, the lookup under "auto", the kernels a
shape's build includes, and the tables a sweep's results make."""

import json
import math

import pytest

from trace_kernels import env, moe_tables, shapes
from trace_kernels.codegen.ops import moe_gemm as codegen

TINY = shapes.preset("tiny")  # E=8, H=256, I=128: gate_up N=256 K=256, down N=256 K=128
TN32 = {"tile_tokens": 32, "stages": 3, "chunks_per_stage": 2}
WS8 = {"tile_tokens": 8, "stages": 5, "min_blocks": 2, "warpgroups": 2, "variant": "ws", "chunks_per_stage": 2}


def _file(tmp_path, tables, name="tables.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"format": moe_tables.FORMAT, "measured": {"gpu": "test"}, "tables": tables}))
    return path


def _gate_up(rows, experts=8, n=256, k=256, kind="gate_up_swiglu"):
    return {"kind": kind, "experts": experts, "n": n, "k": k, "rows": rows}


@pytest.fixture(autouse=True)
def no_tables(monkeypatch):
    monkeypatch.delenv(env.PREFIX + "MOE_TABLES", raising=False)
    monkeypatch.delenv(env.PREFIX + "MOE_BUILTIN_TABLES", raising=False)
    moe_tables.clear()
    yield
    moe_tables.clear()


def test_a_registered_table_decides_auto_tiles(tmp_path):
    path = _file(tmp_path, [_gate_up([[1.0, WS8], [None, TN32]]),
                            {"kind": "down_routed", "experts": 8, "n": 256, "k": 128, "rows": [[None, TN32]]}])
    other_experts = codegen.tile_for_rows(2, 16, k=256, kind="gate_up_swiglu", n=256)  # before: auto's table
    assert moe_tables.register(path) == [("gate_up_swiglu", 8, 256, 256), ("down_routed", 8, 256, 128)]
    ws8, tn32 = codegen.TileConfig(**WS8), codegen.TileConfig(**TN32)
    assert codegen.tile_for_rows(8, 8, k=256, kind="gate_up_swiglu", n=256) == ws8  # 1 routed row per expert
    assert codegen.tile_for_rows(9, 8, k=256, kind="gate_up_swiglu", n=256) == tn32
    assert codegen.tile_for_rows(10 ** 6, 8, k=128, kind="down_routed", n=256) == tn32
    # other GEMMs, other kinds and the explicit variants keep their tables
    assert codegen.tile_for_rows(2, 8, k=256, kind="gate_up", n=256) != ws8
    assert codegen.tile_for_rows(2, 16, k=256, kind="gate_up_swiglu", n=256) == other_experts
    assert codegen.tile_for_rows(8, 8, "v1", k=256, kind="gate_up_swiglu", n=256) != ws8
    names = {s.name for s in codegen.specs_for_shape(TINY)}
    assert codegen.gemm_spec(TINY, "gate_up_swiglu", ws8).name in names
    assert codegen.gemm_spec(TINY, "down_routed", tn32).name in names
    assert {key[0] for key, _, _ in moe_tables.registered()} == {"gate_up_swiglu", "down_routed"}
    assert moe_tables.lookup("gate_up", 8, 256, 256) is None
    moe_tables.register(path)  # the same file again: no conflict
    other = _file(tmp_path, [_gate_up([[None, TN32]])], "other.json")
    with pytest.raises(ValueError, match="already registered"):
        moe_tables.register(other)


def test_tables_from_the_environment(tmp_path, monkeypatch):
    first = _file(tmp_path, [_gate_up([[None, TN32]])], "a.json")
    second = _file(tmp_path, [_gate_up([[None, WS8]])], "b.json")
    monkeypatch.setenv(env.PREFIX + "MOE_TABLES", str(first))
    assert moe_tables.lookup("gate_up_swiglu", 8, 256, 256)[0][1] == codegen.TileConfig(**TN32)
    monkeypatch.setenv(env.PREFIX + "MOE_TABLES", str(second))  # a changed variable replaces the tables
    assert moe_tables.lookup("gate_up_swiglu", 8, 256, 256)[0][1] == codegen.TileConfig(**WS8)
    import os
    monkeypatch.setenv(env.PREFIX + "MOE_TABLES", os.pathsep.join((str(first), str(second))))
    with pytest.raises(ValueError, match="repeats"):
        moe_tables.lookup("gate_up_swiglu", 8, 256, 256)
    monkeypatch.setenv(env.PREFIX + "MOE_TABLES", "")
    assert moe_tables.lookup("gate_up_swiglu", 8, 256, 256) is None


@pytest.mark.parametrize("tables,match", [
    ([_gate_up([[None, {"tile_tokens": 32, "stages": 2, "warp_groups": 2}]])], "unknown TileConfig field"),
    ([_gate_up([[None, {"tile_tokens": 32, "stages": True}]])], "stages must be int"),
    ([_gate_up([[None, {"tile_tokens": 32, "stages": 2, "overlap": 1}]])], "overlap must be bool"),
    ([_gate_up([[2.0, TN32], [1.0, TN32], [None, TN32]])], "increasing"),
    ([_gate_up([[2.0, TN32]])], "last row's limit must be null"),
    ([_gate_up([[math.inf, TN32], [None, TN32]])], "finite"),
    ([_gate_up([])], "non-empty"),
    ([_gate_up([[None, TN32]], kind="gate_up_swiglu_h")], "kind must be"),
    ([_gate_up([[None, TN32]], n=255)], "2 x the intermediate"),
    ([_gate_up([[None, TN32]], experts=0)], "positive ints"),
    ([_gate_up([[None, {"tile_tokens": 32, "stages": 2, "chunks_per_stage": 4}]], k=128)], "does not fit"),
    ([_gate_up([[None, {**TN32, "warpgroups": 2}]], n=320)], "does not fit"),  # N = 5 x 64: 2 warpgroups of 64
    ([_gate_up([[None, TN32]]), _gate_up([[None, WS8]])], "repeats"),
    ([{**_gate_up([[None, TN32]]), "device": "H200"}], "exactly the keys"),
])
def test_bad_tables_are_refused(tmp_path, tables, match):
    with pytest.raises(ValueError, match=match):
        moe_tables.load(_file(tmp_path, tables))


def test_bad_files_are_refused(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match="as JSON"):
        moe_tables.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"tables": []}))
    with pytest.raises(ValueError, match="not a tables file"):
        moe_tables.load(tmp_path / "y.json")
    (tmp_path / "z.json").write_text(json.dumps({"format": moe_tables.FORMAT, "tables": [], "extra": 1}))
    with pytest.raises(ValueError, match="keys are"):
        moe_tables.load(tmp_path / "z.json")
    with pytest.raises(ValueError, match="cannot read"):
        moe_tables.load(tmp_path / "missing.json")


def test_tables_from_sweep_results(tmp_path):
    """best_rows: per token count the fastest tile, up to that count's routed rows per expert, equal neighbours
    merged, the last unlimited; entry + write give a file that loads to the same table."""
    tn8 = codegen.TileConfig(8, 2, chunks_per_stage=2)
    tn32, tn128 = codegen.TileConfig(**TN32), codegen.TileConfig(128, 2, chunks_per_stage=2)

    def result(rows, tile, ms):
        return {"tokens": rows // 2, "rows": rows, **tile.__dict__, "down_ms": ms, "gate_up_fused_ms": 2 * ms}

    results = [result(16, tn8, 1.0), result(16, tn32, 1.5),      # 2 rows per expert: TN=8
               result(64, tn8, 2.0), result(64, tn32, 2.5),      # 8: TN=8 again (merged)
               result(256, tn8, 9.0), result(256, tn32, 4.0),    # 32: TN=32
               result(4096, tn32, 30.0), result(4096, tn128, 20.0)]
    rows = moe_tables.best_rows(results, "down_ms", 8)
    assert rows == [(8.0, tn8), (32.0, tn32), (math.inf, tn128)]
    assert moe_tables.best_rows(results, "gate_up_fused_ms", 8) == rows
    with pytest.raises(ValueError, match="no sweep result"):
        moe_tables.best_rows(results, "other_ms", 8)
    entry = moe_tables.entry("down_routed", 8, 256, 128, rows)
    assert entry["rows"][0] == [8.0, {"tile_tokens": 8, "stages": 2, "chunks_per_stage": 2}]
    assert entry["rows"][-1][0] is None
    path = tmp_path / "swept.json"
    moe_tables.write(path, [entry], {"gpu": "test"})
    assert moe_tables.load(path) == {("down_routed", 8, 256, 128): tuple(rows)}


GPT_OSS = ("gate_up_swiglu", 128, 5760, 2880)  # gpt-oss-120b's fused gate_up (E=128, H=I=2880)


def test_builtin_tables_load_and_decide_their_shapes(monkeypatch):
    """The shipped tables (codegen/moe_tables) pass the file checks, cover both GEMMs of each shape, and decide auto's
    tiles for their shapes only; TRACE_KERNELS_MOE_BUILTIN_TABLES=0 leaves them out."""
    from trace_kernels import paths
    files = sorted(paths.moe_tables_dir().glob("*.json"))
    assert [f.name for f in files] == ["gpt-oss-120b_h200.json", "mixtral-8x7b_h200.json"]
    for f in files:
        tables = moe_tables.load(f)
        assert sorted(key[0] for key in tables) == ["down_routed", "gate_up_swiglu"], f
        assert json.loads(f.read_text())["measured"]["gpu"] == "NVIDIA H200"
    shipped = {key: table for key, _, table, replaced in moe_tables.builtin() if not replaced}
    assert len(shipped) == 4 and GPT_OSS in shipped
    assert moe_tables.registered() == []  # built-ins are not registered tables
    kind, experts, n, k = GPT_OSS
    tuned = codegen.tile_for_rows(16384, experts, k=k, kind=kind, n=n)  # 128 routed rows per expert
    assert tuned == shipped[GPT_OSS][-1][1] and tuned.tile_tokens == 64
    tuned_spec = codegen.gemm_spec(codegen.MoEDims(experts, k, n // 2), codegen.launched_kind(kind, tuned), tuned)
    built = codegen.specs_for_shape(shapes.parse_custom("E=128,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64"))
    assert tuned_spec.name in {s.name for s in built}  # the CLI's build and AOT sets include the tuned tiles
    assert moe_tables.lookup("gate_up_swiglu", 128, 4096, 2048) is None  # Qwen3-30B-A3B keeps auto's tables
    monkeypatch.setenv(env.PREFIX + "MOE_BUILTIN_TABLES", "0")
    assert moe_tables.lookup(*GPT_OSS) is None and moe_tables.builtin() == []
    assert codegen.tile_for_rows(16384, experts, k=k, kind=kind, n=n).tile_tokens == 128  # auto's prefill tile


def test_a_registered_table_replaces_a_builtin_one(tmp_path):
    kind, experts, n, k = GPT_OSS
    mine = {"tile_tokens": 32, "stages": 3}  # (K = 2880 takes rings of one 64-K chunk per stage)
    path = _file(tmp_path, [_gate_up([[None, mine]], experts=experts, n=n, k=k)])
    moe_tables.register(path)
    assert moe_tables.lookup(*GPT_OSS) == ((math.inf, codegen.TileConfig(**mine)),)
    assert [replaced for key, _, _, replaced in moe_tables.builtin() if key == GPT_OSS] == [True]
    moe_tables.clear()
    assert len(moe_tables.lookup(*GPT_OSS)) == 3  # the built-in again
