"""RUN_DIR/metrics.jsonl: one JSON object per RL step, appended durably; truncated on resume.

Non-finite floats are written as null (JSON has no NaN). `REQUIRED_KEYS` is what every step record
carries; `code_agreement` and friends are dicts per tensor kind (moe_in, moe_act, k, v, all) whose
values are null where nothing was measured (bf16 trainer, or no audit).
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

REQUIRED_KEYS = (
    "step", "reward_mean", "reward_std", "response_len_mean", "k3_kl", "max_abs_prob_diff",
    "code_agreement", "route_agreement", "guidance_bits_per_element", "guidance_bytes",
    "seconds_rollout", "seconds_guidance_io", "seconds_train", "seconds_refit",
)


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # 0-d tensor / numpy scalar
        return _clean(value.item())
    return value


def read_metrics(path) -> list[dict]:
    """All complete records; a torn last line (process killed mid-write) is ignored."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # no trailing newline: the final write was cut short
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
    return records


class MetricsLog:
    def __init__(self, path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict) -> None:
        missing = [k for k in REQUIRED_KEYS if k not in record]
        if missing:
            raise ValueError(f"metrics record lacks {missing}")
        line = json.dumps(_clean(record), sort_keys=False) + "\n"
        with open(self.path, "a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def truncate_to_step(self, last_step: int) -> int:
        """Keep records with step <= last_step, the first of each step only; returns how many."""
        seen, kept = set(), []
        for rec in read_metrics(self.path):
            step = rec.get("step")
            if isinstance(step, int) and step <= last_step and step not in seen:
                seen.add(step)
                kept.append(rec)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        return len(kept)
