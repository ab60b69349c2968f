"""`trace-rl compare RUN_DIR... --out DIR`: reward, KL and agreement curves of several runs as PNGs.

matplotlib is imported lazily (only this command needs it) with the non-interactive Agg backend.
Each run is labelled by its directory name and keeps one colour in every plot. Writes reward.png,
k3_kl.png, max_abs_prob_diff.png, code_agreement.png, route_agreement.png, code_distance.png (the
mismatched codes by signed grid distance over the whole run) and summary.json (first/last values
and the run's code-distance totals).
"""
from __future__ import annotations

import json
from pathlib import Path

from trace_rl.metrics import read_metrics

_KINDS = ("all", "moe_in", "moe_act", "k", "v")


def _series(records: list[dict], key: str, sub: str | None = None) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if sub is not None:
            v = v.get(sub) if isinstance(v, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(r["step"])
            ys.append(float(v))
    return xs, ys


def _moving_average(ys: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y - (ys[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def distance_totals(records: list[dict], kind: str = "all") -> dict[int, int]:
    """Signed code distance (trainer - rollout) -> count, summed over a run's audited steps."""
    totals: dict[int, int] = {}
    for r in records:
        for d, n in ((r.get("code_distance_histogram") or {}).get(kind) or {}).items():
            totals[int(d)] = totals.get(int(d), 0) + n
    return totals


def _plot_code_distance(plt, runs: dict[str, list[dict]], path: Path) -> None:
    """Mismatched codes by signed grid distance, over each whole run (audited runs only)."""
    totals = {label: distance_totals(records) for label, records in runs.items()}
    totals = {label: t for label, t in totals.items() if t}
    fig, ax = plt.subplots(figsize=(7, 4))
    distances = sorted({d for t in totals.values() for d in t if d != 0})
    if distances:
        width = 0.8 / len(totals)
        labels = list(runs)
        for j, (label, t) in enumerate(totals.items()):
            elements = sum(t.values())
            xs = [d - 0.4 + width * (j + 0.5) for d in distances]
            ys = [t.get(d, 0) / elements for d in distances]
            ax.bar(xs, ys, width=width, color=f"C{labels.index(label) % 10}", label=label)
        ax.set_yscale("log")
        ax.set_xticks(distances)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no mismatched codes audited", ha="center", transform=ax.transAxes)
    ax.set_title("Mismatched FP4 codes by grid distance (trainer - rollout), whole run")
    ax.set_xlabel("signed grid distance")
    ax.set_ylabel("fraction of audited elements")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def load_runs(run_dirs) -> dict[str, list[dict]]:
    runs = {}
    for d in run_dirs:
        d = Path(d)
        records = read_metrics(d / "metrics.jsonl")
        if not records:
            raise FileNotFoundError(f"{d}: no metrics.jsonl records (is it a `trace-rl train` run dir?)")
        label = d.name if d.name not in runs else str(d)
        runs[label] = records
    return runs


def compare(run_dirs, out_dir) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load_runs(run_dirs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    def plot(name, title, ylabel, key, sub=None, logy=False):
        fig, ax = plt.subplots(figsize=(7, 4))
        drawn = 0
        for i, (label, records) in enumerate(runs.items()):
            xs, ys = _series(records, key, sub)
            if not xs:
                continue
            color = f"C{i % 10}"  # a run keeps its colour in every plot
            window = max(1, len(ys) // 20)
            if window > 1:  # raw values faint, their moving average bold
                ax.plot(xs, ys, color=color, linewidth=0.8, alpha=0.3)
                ax.plot(xs, _moving_average(ys, window), color=color, linewidth=1.6,
                        label=f"{label} (mean of {window})")
            else:
                ax.plot(xs, ys, color=color, label=label, linewidth=1.3)
            drawn += 1
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.set_ylabel(ylabel)
        if logy and drawn:
            ax.set_yscale("symlog", linthresh=1e-6)
        if drawn:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not measured in these runs", ha="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    plot("reward", "Mean reward per RL step", "reward", "reward_mean")
    plot("k3_kl", "Rollout vs trainer KL (k3, per token)", "k3 KL", "k3_kl", logy=True)
    plot("max_abs_prob_diff", "Max |p_rollout - p_trainer| per step", "prob diff", "max_abs_prob_diff")
    plot("code_agreement", "FP4 code agreement, all kinds (audit)", "equal fraction",
         "code_agreement", "all")
    plot("route_agreement", "Expert routing agreement (rollout vs trainer)", "fraction",
         "route_agreement")

    _plot_code_distance(plt, runs, out_dir / "code_distance.png")
    written.append(out_dir / "code_distance.png")

    summary = {}
    for label, records in runs.items():
        first, last = records[0], records[-1]
        summary[label] = {
            "steps": len(records), "last_step": last["step"],
            "reward_first": first.get("reward_mean"), "reward_last": last.get("reward_mean"),
            "k3_kl_last": last.get("k3_kl"),
            "code_agreement_last": (last.get("code_agreement") or {}).get("all"),
            "route_agreement_last": last.get("route_agreement"),
            "code_distance_totals": {str(d): n for d, n in sorted(distance_totals(records).items())},
        }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return written
