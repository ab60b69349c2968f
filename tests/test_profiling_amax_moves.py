"""profiling/amax_moves.py on a short CPU run: it watches every refit and reports fractions."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "profiling"))

import amax_moves  # noqa: E402


def test_amax_moves_watches_every_refit(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    assert amax_moves.main(["--steps", "2", "--out", str(out), "--set", "sft.steps=2", "trainer.lr=0.05",
                            "model.device=cpu"]) == 0
    report = json.loads((out / "amax_moves.json").read_text())
    assert report["refits_compared"] == 2  # the engine's first refit has nothing to compare with
    assert report["expert_tensors_compared"] > 0
    assert 0.0 < report["fraction_of_weights_changed"] <= 1.0  # a large learning rate moves the weights
    assert 0.0 <= report["fraction_grew"] <= report["fraction_moved"] <= 1.0
