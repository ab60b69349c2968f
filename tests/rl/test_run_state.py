"""metrics.jsonl truncation on resume and checkpoint save/load (no pickle)."""
import json
import random

import pytest
import torch

from trace_rl.metrics import REQUIRED_KEYS, MetricsLog, read_metrics
from trace_rl import train_state


def _record(step):
    return {k: 0.0 for k in REQUIRED_KEYS} | {"step": step, "k3_kl": float("nan")}


def test_metrics_append_truncate_dedupe_and_torn_line(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (1, 2, 3, 2, 3, 4):
        log.append(_record(step))
    with open(log.path, "a") as f:
        f.write('{"step": 5, "rew')  # killed mid-write
    recs = read_metrics(log.path)
    assert [r["step"] for r in recs] == [1, 2, 3, 2, 3, 4] and recs[0]["k3_kl"] is None
    assert log.truncate_to_step(3) == 3
    assert [r["step"] for r in read_metrics(log.path)] == [1, 2, 3]
    with pytest.raises(ValueError, match="lacks"):
        log.append({"step": 9})


def test_checkpoint_round_trip_restores_params_optimizer_rng(tmp_path):
    torch.manual_seed(0)
    params = {"a": torch.randn(4, 3, requires_grad=True), "b": torch.randn(5, requires_grad=True)}
    opt = torch.optim.AdamW(list(params.values()), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        sum((p ** 2).sum() for p in params.values()).backward()
        opt.step()
    random.seed(5)
    for step in (2, 4, 6):
        path = train_state.save_checkpoint(tmp_path, step, params, opt, {"sft_done": True}, keep=2)
    assert [s for s, _ in train_state.list_checkpoints(tmp_path)] == [4, 6]
    assert train_state.latest_checkpoint(tmp_path) == path
    assert not list(path.glob("*.pt")) and json.loads((path / "state.json").read_text())["step"] == 6
    expected_torch, expected_py = torch.rand(3), random.random()
    saved = {k: v.detach().clone() for k, v in params.items()}
    saved_state = {k: {n: t.clone() for n, t in s.items()} for k, s in opt.state_dict()["state"].items()}

    fresh = {"a": torch.zeros(4, 3, requires_grad=True), "b": torch.zeros(5, requires_grad=True)}
    opt2 = torch.optim.AdamW(list(fresh.values()), lr=1e-2)
    info = train_state.load_checkpoint(path, fresh, opt2)
    assert info == {"step": 6, "scalars": {"sft_done": True}}
    for k in saved:
        assert torch.equal(fresh[k], saved[k])
    for k, s in opt2.state_dict()["state"].items():
        for n, t in s.items():
            assert torch.equal(t, saved_state[k][n])
    assert torch.equal(torch.rand(3), expected_torch) and random.random() == expected_py


def test_partial_checkpoint_dir_is_ignored(tmp_path):
    (tmp_path / "checkpoints" / ".tmp-step_00000009").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_00000010").mkdir()  # no state.json: incomplete
    assert train_state.latest_checkpoint(tmp_path) is None
