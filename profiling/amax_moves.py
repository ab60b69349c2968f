"""How often an RL step moves an expert's amax: the fraction of routed-expert weight tensors (per expert) whose
max |w| differs from the previous refit's, over the refits of a `trace-rl train` run on this machine (CPU or GPU),
beside the fraction of the weights themselves that changed.
The speculative refits (v8, v9; docs/toolchain.md, "refit v7" and "refit v8 and v9") quantize with the previous
refit's scale as a guess; this is how often that guess fails on a real run of this project's RL loop.

    python profiling/amax_moves.py --config rl/configs/default.toml --steps 40 --out runs/amax_moves
    (extra arguments after --set go to the config like `trace-rl train --set`)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

from trace_rl import run as rl_run
from trace_rl.engine.engine import RolloutEngine
from trace_rl.trainer.config import load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="rl/configs/default.toml")
    parser.add_argument("--steps", type=int, default=40, help="RL steps (refits) to watch")
    parser.add_argument("--out", default="runs/amax_moves", help="a fresh run directory (removed first)")
    parser.add_argument("--set", nargs="*", default=[], help="config overrides, as trace-rl train --set")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.set + [f"run.steps={args.steps}"])
    previous: dict[str, torch.Tensor] = {}
    previous_w: dict[str, torch.Tensor] = {}
    moved: list[dict] = []
    original = RolloutEngine.refit

    def watching_refit(engine, weights):
        state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
        step = {"experts": 0, "moved": 0, "grew": 0, "elements": 0, "elements_changed": 0}
        for name, param in engine.model.expert_parameters():
            w = state[name].detach().to(param.dtype)  # as the engine's refit quantizes it
            amax = w.float().abs().flatten(1).amax(dim=1).cpu()  # [E]: what refit's per-expert scale comes from
            if name in previous:
                step["experts"] += amax.numel()
                step["moved"] += int((amax != previous[name]).sum())
                step["grew"] += int((amax > previous[name]).sum())
                step["elements"] += w.numel()
                step["elements_changed"] += int((w != previous_w[name]).sum())
            previous[name], previous_w[name] = amax, w.clone()
        if step["experts"]:
            moved.append(step)
        return original(engine, weights)

    RolloutEngine.refit = watching_refit
    run_dir = Path(args.out)
    shutil.rmtree(run_dir, ignore_errors=True)
    try:
        rl_run.train(cfg, run_dir, progress=False)
    finally:
        RolloutEngine.refit = original
    experts = sum(s["experts"] for s in moved)
    report = {"config": args.config, "overrides": args.set, "refits_compared": len(moved),
              "expert_tensors_compared": experts,
              "fraction_moved": sum(s["moved"] for s in moved) / max(experts, 1),
              "fraction_grew": sum(s["grew"] for s in moved) / max(experts, 1),
              "fraction_of_weights_changed": sum(s["elements_changed"] for s in moved) / max(sum(s["elements"] for s in moved), 1),
              "per_refit": moved}
    (run_dir / "amax_moves.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "per_refit"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
