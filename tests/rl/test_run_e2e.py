"""A few RL steps end to end on CPU: metrics keys, trace vs qat code agreement, resume, compare."""
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trace_rl.cli import main
from trace_rl.guidance_store import read_guidance
from trace_rl.metrics import REQUIRED_KEYS, read_metrics
from trace_rl.run import train
from trace_rl.trainer import load_config

KINDS = ("moe_in", "moe_act", "k", "v")


def _write_config(path: Path, quant: str, steps: int = 3, checkpoint_every: int = 2,
                  audit: bool = True, sft_steps: int = 8) -> Path:
    path.write_text(f"""
seed = 3
[model]
preset = "tiny"
device = "cpu"
[task]
name = "addition"
max_digits = 1
[rollout]
mode = "nvfp4"
capture = "{'full' if audit else 'compact'}"
prompts_per_step = 4
group_size = 4
max_new_tokens = 3
[trainer]
quant = "{quant}"
audit = {str(audit).lower()}
lr = 3e-4
[sft]
steps = {sft_steps}
batch_size = 16
[run]
steps = {steps}
checkpoint_every = {checkpoint_every}
""")
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for quant in ("trace", "qat"):
        cfg = load_config(_write_config(root / f"{quant}.toml", quant))
        out[quant] = train(cfg, root / quant, progress=False)
    return out


def _agreement_counts(records, key="code_distance_histogram"):
    equal = total = 0
    for r in records:
        hist = r[key]["all"]
        equal += hist.get("0", 0)
        total += sum(hist.values())
    return equal, total


def test_metrics_file_has_every_key_per_step(runs):
    records = read_metrics(runs["trace"] / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert set(REQUIRED_KEYS) <= set(r)
        assert set(KINDS) <= set(r["code_agreement"])
        assert r["guidance_bytes"] > 0 and r["guidance_bits_per_element"] > 0
        assert 0 <= r["reward_mean"] <= 1 and r["response_len_mean"] > 0
        assert r["k3_kl"] >= 0 and 0 <= r["max_abs_prob_diff"] <= 1
        assert min(r["seconds_rollout"], r["seconds_train"], r["seconds_refit"]) > 0
        assert 0.9 <= r["route_agreement"] <= 1.0
        # full guidance (audit) stores codes; the compact figure counts one mantissa bit instead
        assert 1.0 < r["guidance_bits_per_element_compact"] < r["guidance_bits_per_element"]
    assert (runs["trace"] / "checkpoints" / "step_00000003" / "state.json").is_file()


def test_trace_agrees_on_every_neighbour_code_and_qat_does_not(runs):
    trace = read_metrics(runs["trace"] / "metrics.jsonl")
    qat = read_metrics(runs["qat"] / "metrics.jsonl")
    for r in trace:
        for kind in KINDS:
            assert r["code_agreement_neighbour"][kind] == 1.0, (r["step"], kind)
            assert r["guidance_fallback_fraction"][kind] < 0.05
    eq_t, n_t = _agreement_counts(trace)
    eq_q, n_q = _agreement_counts(qat)
    assert n_t > 0 and n_q > 0
    assert eq_q / n_q < 1.0  # round-to-nearest flips some codes the rollout chose
    assert eq_q / n_q < eq_t / n_t


def test_resume_after_a_crash_loses_and_duplicates_no_step(tmp_path):
    cfg = load_config(_write_config(tmp_path / "c.toml", "trace", steps=4, checkpoint_every=2,
                                    audit=False))
    reference = read_metrics(train(cfg, tmp_path / "ref", progress=False) / "metrics.jsonl")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, tmp_path / "run", progress=False, stop_after_step=3)
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
    train(cfg, tmp_path / "run", progress=False)
    resumed = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(reference, resumed):  # the redone steps reproduce the uninterrupted run
        assert a["reward_mean"] == b["reward_mean"] and a["k3_kl"] == b["k3_kl"], a["step"]
    other = load_config(_write_config(tmp_path / "d.toml", "qat", steps=4, audit=False))
    with pytest.raises(Exception, match="different config.*trainer.quant"):
        train(other, tmp_path / "run", progress=False)
    longer = load_config(_write_config(tmp_path / "e.toml", "trace", steps=5, audit=False))
    train(longer, tmp_path / "run", progress=False)  # extending a finished run is allowed
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4, 5]


def test_guidance_overlap_trains_like_the_file_roundtrip(runs, tmp_path):
    """run.guidance_io = "overlap" (the default: train from memory, write the file in the background)
    and "roundtrip" (train from the file read back) give the same steps, and the stored file holds
    the guidance the trainer used."""
    cfg = load_config(_write_config(tmp_path / "r.toml", "trace"))
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, guidance_io="roundtrip"))
    roundtrip = read_metrics(train(cfg, tmp_path / "roundtrip", progress=False) / "metrics.jsonl")
    overlap = read_metrics(runs["trace"] / "metrics.jsonl")
    timing = {k for k in overlap[0] if k.startswith("seconds_")}
    assert [{k: v for k, v in r.items() if k not in timing} for r in overlap] == \
        [{k: v for k, v in r.items() if k not in timing} for r in roundtrip]
    assert all(r["seconds_guidance_write"] > 0 for r in overlap)
    files = sorted((runs["trace"] / "guidance").glob("step_*.safetensors"))
    assert [f.name for f in files] == [f"step_{len(overlap):08d}.safetensors"]  # only the last step's
    last = read_guidance(files[0])
    assert last.stats()["guidance_bytes"] == overlap[-1]["guidance_bytes"]


def test_killed_process_resumes(tmp_path):
    cfg_path = _write_config(tmp_path / "k.toml", "trace", steps=12, checkpoint_every=2, audit=False,
                             sft_steps=0)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "trace_rl.cli", "train", "--config", str(cfg_path), "--out",
           str(run_dir), "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (run_dir / "checkpoints" / "step_00000002" / "state.json").exists():
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert len(read_metrics(run_dir / "metrics.jsonl")) < 12
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    steps = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]
    assert steps == list(range(1, 13))


def test_cli_compare(runs, tmp_path):
    pytest.importorskip("matplotlib")  # a dev extra; `trace-rl compare` imports it lazily
    assert main(["compare", str(runs["trace"]), str(runs["qat"]), "--out", str(tmp_path / "plots")]) == 0
    for name in ("reward", "k3_kl", "code_agreement", "route_agreement", "code_distance"):
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 1000
    summary = json.loads((tmp_path / "plots" / "summary.json").read_text())
    assert set(summary) == {"trace", "qat"}
    qat_distances = summary["qat"]["code_distance_totals"]
    assert sum(n for d, n in qat_distances.items() if d != "0") > 0


def test_cli_bad_config_names_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[rollout]\ngroup_size = 1\n")
    assert main(["train", "--config", str(bad), "--out", str(tmp_path / "x")]) == 2
    assert "rollout.group_size" in capsys.readouterr().err


CONFIGS = Path(__file__).parents[2] / "rl" / "configs"


@pytest.mark.parametrize("arm", sorted(p.stem for p in CONFIGS.glob("small_*.toml") if p.stem != "small_sft"))
def test_shipped_arm_runs_two_steps_on_tiny(arm, tmp_path):
    """The shipped arm configs, shrunk to the tiny preset, run and record their mode's metrics."""
    import tomllib

    from trace_rl.trainer import parse_config

    raw = tomllib.loads((CONFIGS / f"{arm}.toml").read_text())
    raw["model"].update(preset="tiny", init="", device="cpu")
    raw["task"].update(min_digits=1, max_digits=1)
    raw["rollout"].update(prompts_per_step=2, group_size=2, max_new_tokens=3)
    raw["run"].update(steps=2, checkpoint_every=2)
    cfg = parse_config(raw)
    records = read_metrics(train(cfg, tmp_path / arm, progress=False) / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    audited = records[-1]["code_agreement"]["all"] is not None
    assert audited == cfg.trainer.audit
    assert (records[-1]["guidance_bytes"] > 0) == (cfg.rollout.capture != "off")
