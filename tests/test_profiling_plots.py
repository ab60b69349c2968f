"""profiling/bench.py --from-json and profiling/plots.py on the committed H200 results (CPU, seconds)."""

import json
import sys
from pathlib import Path

import pytest

PROFILING = Path(__file__).resolve().parents[1] / "profiling"
RESULTS = PROFILING / "results"
sys.path.insert(0, str(PROFILING))

import bench  # noqa: E402
import plots  # noqa: E402

pytest.importorskip("matplotlib")


def committed_report():
    raw, meta = plots.load_results(RESULTS)
    return {**meta, **plots.unify(raw, meta["roofline"])}


def test_roofline_is_the_sm_copy_of_the_copy_study():
    raw, meta = plots.load_results(RESULTS)
    study = [s for s in raw["memory"]["copy_study"] if s["method"] == plots.SM_COPY]
    assert meta["roofline"]["sm_copy_bytes_per_s"] == max(s["tb_per_s"] for s in study) * 1e12
    graph = [s["tb_per_s"] for s in raw["memory"]["copy_study"]
             if s["method"].startswith("copy_ graph") and s["mb"] >= 512]
    assert meta["roofline"]["sm_copy_bytes_per_s"] / 1e12 > max(graph)  # why the memcpy node is not the roofline


def test_ratios_recomputed_from_the_raw_numbers():
    report = committed_report()
    raw, _ = plots.load_results(RESULTS)
    bw = report["roofline"]["sm_copy_bytes_per_s"]
    moe_raw = {(r["shape"], r["tokens"]): r for r in raw["moe"]["results"]}
    for r in report["moe"]:
        src = moe_raw[(r["shape"], r["tokens"])]
        v = src["variants"][r["variant"]]
        assert r["vs_bf16"] == pytest.approx(src["bf16_grouped_mm_ms"] / v["nvfp4_ms"])
        assert r["fraction_of_roofline"] == pytest.approx(src["nvfp4_bytes"] / bw / (v["nvfp4_ms"] * 1e-3))
    q = [r for r in report["memory"] if r["op"] == "quantize" and r["variant"] == "v2" and r["input_mb"] == 256][0]
    copy = [r for r in raw["memory"]["results"] if r["kernel"] == "copy" and r["input_mb"] == 256][0]
    assert q["vs_bf16"] == pytest.approx(q["tb_per_s"] / copy["tb_per_s"])
    att = [r for r in report["attention"] if r["kernel"] == "bf16_mma" and r["batch"] == 32][0]
    sdpa = [r for r in report["attention"] if r["kernel"] == "sdpa_bf16" and r["batch"] == 32][0]
    assert att["vs_bf16"] == pytest.approx(sdpa["ms"] / att["ms"]) and sdpa["vs_bf16"] == pytest.approx(1.0)
    assert {r["kernel"] for r in report["attention"]} >= set(plots.ATTENTION_KERNELS)


def test_from_json_redraws_plots_and_table(tmp_path, capsys):
    assert bench.main(["--from-json", str(RESULTS), "--plots-dir", str(tmp_path)]) == 0
    for name in ("memory_roofline.png", "moe_speedup.png", "attention_speedup.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    assert (tmp_path / "rollout_tokens_per_s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # rollout_h200_quick.json
    table = (tmp_path / "table.md").read_text().splitlines()
    assert table[0].startswith("| benchmark |") and capsys.readouterr().out.count("| MoE layer") == 28
    row = [ln for ln in table if ln.startswith("| MoE layer qwen3-30b-a3b [ws] | 64 tokens")][0]
    assert "2.19x" in row  # the README's figure for this case


def test_bench_json_round_trip_with_rollout(tmp_path):
    """A bench.py JSON (raw sections + measured roofline) redraws like a live run, rollout included."""
    raw, _ = plots.load_results(RESULTS)
    raw["rollout"] = {"results": [
        {"mode": m, "capture": "off", "graphs": True, "kv_kernels": True, "prompt_len": 1024, "batch": 64,
         "output_len": 128, "decode_tokens_per_s": tps} for m, tps in (("bf16", 5000.0), ("nvfp4", 7500.0))]}
    roofline = {"sm_copy_bytes_per_s": 4.2e12, "bf16_tflops": 780.0}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H200", "date": "d", "commit": "c", "command": "x",
                                "roofline": roofline, "raw": raw}))
    assert bench.main(["--from-json", str(path), "--plots-dir", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "rollout_tokens_per_s.png").exists()
    report = {**plots.unify(raw, roofline)}
    assert [r["vs_bf16"] for r in report["rollout"]] == [1.0, 1.5]
    assert all(r["fraction_of_bf16_matmul_rate"] == pytest.approx(r["tflops"] / 780.0) for r in report["moe"])


def test_live_run_orchestration_with_stubbed_sections(tmp_path, monkeypatch, capsys):
    """bench.main's own logic (no GPU): ceilings first, sections in order, a failing section is
    reported in the JSON and the exit code while the others are kept, time budget skips."""
    import types

    import torch
    raw, _ = plots.load_results(RESULTS)
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name="NVIDIA H200", multi_processor_count=132,
                                                        L2_cache_size=60 << 20))
    monkeypatch.setattr(bench, "measure_roofline", lambda: calls.append("roofline") or {
        "sm_copy_bytes_per_s": 4.2e12, "graph_copy_bytes_per_s": 2.75e12, "bf16_tflops": 770.0})
    monkeypatch.setattr(bench, "run_memory", lambda cfg, l2: calls.append("memory") or raw["memory"])
    monkeypatch.setattr(bench, "run_moe", lambda cfg, bw: calls.append(("moe", bw)) or raw["moe"])
    out = tmp_path / "b.json"

    def attention(cfg, bw, l2):  # the JSON already holds the earlier sections (a killed run keeps them)
        assert set(json.loads(out.read_text())["raw"]) == {"memory", "moe"}
        calls.append("attention")
        return raw["attention"]
    monkeypatch.setattr(bench, "run_attention", attention)

    monkeypatch.setattr(bench, "run_sampling", lambda cfg, l2: calls.append("sampling") or raw["sampling"])

    def broken(cfg, seconds_left):
        calls.append(("rollout", seconds_left))
        raise RuntimeError("engine exploded")
    monkeypatch.setattr(bench, "run_rollout", broken)
    assert bench.main(["--quick", "--out", str(out)]) == 1
    assert calls == ["roofline", "memory", ("moe", 4.2e12), "attention", "sampling", ("rollout", None)]
    report = json.loads(out.read_text())
    assert report["errors"] == {"rollout": "RuntimeError: engine exploded"} and report["quick"]
    assert report["command"] == f"python profiling/bench.py --quick --out {out}" and report["commit"]
    assert {"memory", "moe", "attention"} <= set(report) and (tmp_path / "moe_speedup.png").exists()
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("| sampling kernel (eager) | B=512")
    calls.clear()
    assert bench.main(["--quick", "--time-budget", "1e6", "--sections", "rollout", "--out", str(out)]) == 1
    assert calls[1][0] == "rollout" and 0 < calls[1][1] <= 1e6  # the budget left bounds the rollout arms
    calls.clear()
    assert bench.main(["--quick", "--time-budget", "1e-9", "--out", str(out)]) == 0
    assert calls == ["roofline"] and json.loads(out.read_text())["skipped"] == [
        "memory", "moe", "attention", "sampling", "rollout"]
