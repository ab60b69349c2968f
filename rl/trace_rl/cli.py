"""`trace-rl`: supervised warm start, the RL run, and run comparison.

    trace-rl sft     --config CFG --out DIR           # SFT only; DIR loads as [model] init = "DIR"
    trace-rl train   --config CFG --out RUN_DIR       # SFT first when [sft] steps > 0; resumes
                     [--set section.key=value ...]    # override config values (also for sft)
    trace-rl compare RUN_DIR [RUN_DIR ...] --out DIR  # reward / KL / agreement PNGs
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trace_rl.paths import configs_dir

DEFAULT_CONFIG = configs_dir() / "default.toml"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trace-rl", description="FP4 RL of MoE models with TRACE guidance")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("sft", "supervised warm start only"),
                        ("train", "run (or resume) RL: rollout -> guidance -> train -> refit")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                       help=f"run config TOML (default: {DEFAULT_CONFIG.name})")
        s.add_argument("--out", type=Path, required=True, help="output directory")
        s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. --set trainer.quant=qat (repeatable)")
        s.add_argument("--no-progress", action="store_true", help="no progress bar")
    c = sub.add_parser("compare", help="plot reward, KL and agreement curves of runs")
    c.add_argument("runs", type=Path, nargs="+", help="RUN_DIRs of `trace-rl train`")
    c.add_argument("--out", type=Path, required=True, help="directory for the PNG files")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from trace_rl.trainer.config import ConfigError, load_config

    try:
        if args.command == "compare":
            from trace_rl.compare import compare
            for path in compare(args.runs, args.out):
                print(path)
            return 0
        cfg = load_config(args.config, args.overrides)
        if args.command == "sft":
            from trace_rl.run import build_model, resolve_device, run_sft
            if cfg.sft.steps == 0:
                raise ConfigError(f"{args.config}: sft.steps is 0; nothing to train")
            model = build_model(cfg, resolve_device(cfg.model.device))
            run_sft(cfg, model, args.out, progress=not args.no_progress)
            print(f"SFT weights written to {args.out}")
            return 0
        from trace_rl.run import train
        from trace_rl.metrics import read_metrics
        train(cfg, args.out, progress=not args.no_progress)
        records = read_metrics(args.out / "metrics.jsonl")
        if records:
            k = max(1, len(records) // 10)
            first = sum(r["reward_mean"] for r in records[:k]) / k
            last = sum(r["reward_mean"] for r in records[-k:]) / k
            print(f"{len(records)} RL steps in {args.out}; mean reward of the first {k} steps "
                  f"{first:.3f}, of the last {k} steps {last:.3f}")
        return 0
    except (ConfigError, FileNotFoundError) as e:
        print(f"trace-rl: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
