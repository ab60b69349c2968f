"""Run configuration (TOML): dataclasses, defaults, and validation that names the bad key.

A config file has the sections below; every key is optional except where noted, unknown keys are
errors. `load_config(path, overrides=())` / `parse_config(dict)` return a frozen `RunConfig`
(overrides: "section.key=value" strings, as `trace-rl --set` passes them); `ConfigError` messages
name the key as `section.key`.

    seed = 0                     # everything derives from it (problems, sampling, init)
    [model]   preset = "tiny"    # a preset of rl/configs/models.toml (trace_rl.config)
              init = ""          # optional: a `trace-rl sft` output directory to start from
                                 # (checked when the run starts, so configs parse before it exists)
              dtype = "bfloat16" # trainer compute dtype (master weights are always FP32)
              device = "auto"    # "cpu", "cuda" or "auto"
    [task]    name = "addition"  # plus that task's parameters (trace_rl.tasks)
    [rollout] mode, capture, prompts_per_step, group_size, max_new_tokens, temperature
    [trainer] quant, routing_replay, audit, loss, advantage, eps_low, eps_high, tis_cap, kl_coef,
              lr, weight_decay, beta1, beta2, grad_clip, minibatches, guided_rounding
    [sft]     steps, batch_size, lr, seed
    [run]     steps, checkpoint_every, keep_checkpoints, guidance_io
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


GUIDANCE_IO = ("overlap", "roundtrip")


class ConfigError(ValueError):
    """A config value that is missing, of the wrong type, or out of range; names the key."""


@dataclass(frozen=True)
class ModelSection:
    preset: str = "tiny"
    init: str = ""
    dtype: str = "bfloat16"
    device: str = "auto"


@dataclass(frozen=True)
class TaskSection:
    name: str = "addition"
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RolloutSection:
    mode: str = "nvfp4"
    capture: str = "compact"
    prompts_per_step: int = 8
    group_size: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0


@dataclass(frozen=True)
class TrainerSection:
    quant: str = "trace"
    routing_replay: bool = False
    audit: bool = False
    loss: str = "grpo_token_mean"
    advantage: str = "grpo"
    eps_low: float = 0.2
    eps_high: float = 0.28
    tis_cap: float = 2.0          # 0 disables truncated importance sampling
    kl_coef: float = 0.0          # KL to the initial policy; 0 = off (no reference model kept)
    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    minibatches: int = 1          # optimizer steps per rollout batch
    guided_rounding: str = "auto" # trace mode: "auto" = the toolchain kernel on CUDA, "reference"


@dataclass(frozen=True)
class SftSection:
    steps: int = 0
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 1


@dataclass(frozen=True)
class RunSection:
    steps: int = 20
    checkpoint_every: int = 5
    keep_checkpoints: int = 2
    # "overlap": the trainer takes the rollout's guidance from memory while a background thread
    # writes the step's guidance file; "roundtrip": write it, then train from the file read back.
    guidance_io: str = "overlap"


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    model: ModelSection = ModelSection()
    task: TaskSection = TaskSection()
    rollout: RolloutSection = RolloutSection()
    trainer: TrainerSection = TrainerSection()
    sft: SftSection = SftSection()
    run: RunSection = RunSection()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTIONS = {"model": ModelSection, "task": TaskSection, "rollout": RolloutSection,
             "trainer": TrainerSection, "sft": SftSection, "run": RunSection}


def _typed(key: str, value: Any, want: type) -> Any:
    # TOML gives int for 1 and float for 1.0; accept an int where a float is expected, never a bool.
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if want is int and isinstance(value, bool) or not isinstance(value, want):
        raise ConfigError(f"{key} must be {want.__name__}, got {type(value).__name__} {value!r}")
    return value


def _section(name: str, cls, raw: Any):
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] must be a table, got {type(raw).__name__}")
    if cls is TaskSection:
        raw = dict(raw)
        task_name = _typed("task.name", raw.pop("name", TaskSection.name), str)
        return TaskSection(name=task_name, params=raw)
    types = {f.name: f.type for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(types))
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(f'{name}.{k}' for k in unknown)}; "
                          f"[{name}] accepts {sorted(types)}")
    builtin = {"str": str, "int": int, "float": float, "bool": bool}
    return cls(**{k: _typed(f"{name}.{k}", v, builtin[types[k]]) for k, v in raw.items()})


def _one_of(key: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {sorted(allowed)}, got {value!r}")


def _check(key: str, ok: bool, what: str, value) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {what}, got {value!r}")


def validate(cfg: RunConfig) -> RunConfig:
    from trace_rl import grpo
    from trace_rl.tasks import make_task

    m, r, t, s, run = cfg.model, cfg.rollout, cfg.trainer, cfg.sft, cfg.run
    from trace_rl.config import ConfigError as ModelConfigError, load_preset

    try:
        load_preset(m.preset)
    except ModelConfigError as e:
        raise ConfigError(f"model.preset: {e}") from None
    _one_of("model.dtype", m.dtype, {"bfloat16", "float32"})
    _one_of("model.device", m.device, {"auto", "cpu", "cuda"})
    try:
        make_task(cfg.task.name, **cfg.task.params)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"[task]: {e}") from None
    _one_of("rollout.mode", r.mode, {"bf16", "nvfp4"})
    _one_of("rollout.capture", r.capture, {"off", "compact", "full"})
    _check("rollout.prompts_per_step", r.prompts_per_step >= 1, ">= 1", r.prompts_per_step)
    _check("rollout.group_size", r.group_size >= 2, ">= 2 (GRPO compares samples of a prompt)",
           r.group_size)
    _check("rollout.max_new_tokens", r.max_new_tokens >= 1, ">= 1", r.max_new_tokens)
    _check("rollout.temperature", r.temperature > 0, "> 0", r.temperature)
    if r.capture != "off" and r.mode != "nvfp4":
        raise ConfigError(f"rollout.capture = {r.capture!r} needs rollout.mode = 'nvfp4' "
                          "(a bf16 rollout quantizes nothing)")
    _one_of("trainer.quant", t.quant, {"bf16", "qat", "trace"})
    if t.quant == "trace" and r.capture == "off":
        raise ConfigError("trainer.quant = 'trace' needs rollout guidance: set rollout.capture to "
                          "'compact' (or 'full' for audits) and rollout.mode = 'nvfp4'")
    if t.audit and r.capture != "full":
        raise ConfigError("trainer.audit = true compares codes with the rollout's: it needs "
                          f"rollout.capture = 'full', got {r.capture!r}")
    if t.audit and t.quant == "bf16":
        raise ConfigError("trainer.audit = true needs trainer.quant 'qat' or 'trace' (bf16 has no codes)")
    _one_of("trainer.guided_rounding", t.guided_rounding, {"auto", "reference"})
    _one_of("trainer.loss", t.loss, set(grpo.POLICY_LOSSES))
    _one_of("trainer.advantage", t.advantage, set(grpo.ADVANTAGES))
    _check("trainer.eps_low", 0 < t.eps_low < 1, "in (0, 1)", t.eps_low)
    _check("trainer.eps_high", t.eps_high > 0, "> 0", t.eps_high)
    _check("trainer.tis_cap", t.tis_cap == 0 or t.tis_cap >= 1, "0 (off) or >= 1", t.tis_cap)
    _check("trainer.kl_coef", t.kl_coef >= 0, ">= 0", t.kl_coef)
    _check("trainer.lr", t.lr > 0, "> 0", t.lr)
    _check("trainer.weight_decay", t.weight_decay >= 0, ">= 0", t.weight_decay)
    _check("trainer.beta1", 0 <= t.beta1 < 1, "in [0, 1)", t.beta1)
    _check("trainer.beta2", 0 <= t.beta2 < 1, "in [0, 1)", t.beta2)
    _check("trainer.grad_clip", t.grad_clip >= 0, ">= 0 (0 = no clipping)", t.grad_clip)
    _check("trainer.minibatches", 1 <= t.minibatches <= r.prompts_per_step,
           f"between 1 and rollout.prompts_per_step = {r.prompts_per_step}", t.minibatches)
    _check("sft.steps", s.steps >= 0, ">= 0", s.steps)
    _check("sft.batch_size", s.batch_size >= 1, ">= 1", s.batch_size)
    _check("sft.lr", s.lr > 0, "> 0", s.lr)
    _check("run.steps", run.steps >= 1, ">= 1", run.steps)
    _check("run.checkpoint_every", run.checkpoint_every >= 1, ">= 1", run.checkpoint_every)
    _check("run.keep_checkpoints", run.keep_checkpoints >= 1, ">= 1", run.keep_checkpoints)
    _check("run.guidance_io", run.guidance_io in GUIDANCE_IO, f"one of {GUIDANCE_IO}", run.guidance_io)
    return cfg


def parse_config(raw: dict) -> RunConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"a config is a table, got {type(raw).__name__}")
    raw = dict(raw)
    kwargs: dict[str, Any] = {}
    if "seed" in raw:
        kwargs["seed"] = _typed("seed", raw.pop("seed"), int)
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"unknown top-level key(s) {unknown}; expected seed and sections "
                          f"{sorted(_SECTIONS)}")
    for name, cls in _SECTIONS.items():
        if name in raw:
            kwargs[name] = _section(name, cls, raw[name])
    return validate(RunConfig(**kwargs))


def apply_overrides(raw: dict, overrides) -> dict:
    """Apply "section.key=value" (or "seed=value") strings to a raw config dict; the value is read
    as a TOML value (1e-4, true, "x", [1, 2]), or taken as a bare string if it is not one."""
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()
        parts = key.split(".")
        if len(parts) == 1:
            raw[key] = value
        elif len(parts) == 2:
            section = raw.setdefault(parts[0], {})
            if not isinstance(section, dict):
                raise ConfigError(f"override {key}: [{parts[0]}] is not a table")
            section[parts[1]] = value
        else:
            raise ConfigError(f"override key {key!r} must be 'section.key' or a top-level key")
    return raw


def load_config(path, overrides=()) -> RunConfig:
    """Read a TOML run config, apply "section.key=value" overrides, validate."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    try:
        return parse_config(apply_overrides(raw, overrides))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
