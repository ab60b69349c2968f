"""trace_rl: the thin RL layer (model, rollout engine, guidance store, trainer, GRPO)."""

__version__ = "0.1.0"
