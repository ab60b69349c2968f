"""Run config: defaults validate, every bad value names its key."""
import pytest

from trace_rl.trainer.config import ConfigError, load_config, parse_config


def test_defaults_and_shipped_configs_parse():
    cfg = parse_config({})
    assert cfg.trainer.eps_low == 0.2 and cfg.trainer.eps_high == 0.28 and cfg.trainer.tis_cap == 2.0
    assert cfg.trainer.kl_coef == 0.0
    cfg = parse_config({"trainer": {"lr": 1}})  # TOML int where a float is expected
    assert cfg.trainer.lr == 1.0


@pytest.mark.parametrize("raw, key", [
    ({"trainer": {"lr": -1.0}}, "trainer.lr"),
    ({"trainer": {"lr": "fast"}}, "trainer.lr"),
    ({"trainer": {"quant": "fp8"}}, "trainer.quant"),
    ({"trainer": {"eps_low": 1.5}}, "trainer.eps_low"),
    ({"trainer": {"routing_replay": 1}}, "trainer.routing_replay"),
    ({"trainer": {"lrr": 1.0}}, "trainer.lrr"),
    ({"trainer": {"loss": "ppo"}}, "trainer.loss"),
    ({"trainer": {"audit": True}}, "trainer.audit"),
    ({"rollout": {"group_size": 1}}, "rollout.group_size"),
    ({"rollout": {"mode": "fp8"}}, "rollout.mode"),
    ({"rollout": {"prompts_per_step": True}}, "rollout.prompts_per_step"),
    ({"rollout": {"mode": "bf16", "capture": "compact"}}, "rollout.capture"),
    ({"rollout": {"capture": "off"}, "trainer": {"quant": "trace"}}, "trainer.quant"),
    ({"model": {"preset": "huge"}}, "model.preset"),
    ({"task": {"name": "reverse", "max_lenn": 3}}, "max_lenn"),
    ({"task": {"name": "nope"}}, "nope"),
    ({"run": {"steps": 0}}, "run.steps"),
    ({"run": {"guidance_io": "async"}}, "run.guidance_io"),
    ({"sft": {"steps": -1}}, "sft.steps"),
    ({"seed": "zero"}, "seed"),
    ({"optimizer": {}}, "optimizer"),
    ({"run": 3}, "[run]"),
])
def test_bad_values_name_the_key(raw, key):
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    assert key in str(e.value)


def test_missing_init_directory_is_reported_when_the_run_starts(tmp_path):
    import torch
    from trace_rl.run import build_model

    cfg = parse_config({"model": {"init": str(tmp_path / "no_sft_here")}})
    with pytest.raises(ConfigError, match="model.init.*trace-rl sft"):
        build_model(cfg, torch.device("cpu"))


def test_shipped_run_configs_parse():
    from pathlib import Path

    configs = sorted(p for p in (Path(__file__).parents[2] / "rl" / "configs").glob("*.toml")
                     if p.name != "models.toml")
    assert any(p.name == "default.toml" for p in configs)
    for p in configs:
        load_config(p)


def test_load_config_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[trainer]\nlr = -3.0\n")
    with pytest.raises(ConfigError, match="bad.toml.*trainer.lr"):
        load_config(p)
    p.write_text("[trainer\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(p)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[trainer]\nquant = "trace"\n[rollout]\ncapture = "compact"\n')
    cfg = load_config(p, ["trainer.quant=qat", "trainer.lr=3e-4", "rollout.capture=full",
                          "trainer.audit=true", "seed=7", "task.name=reverse"])
    assert (cfg.trainer.quant, cfg.trainer.lr, cfg.trainer.audit, cfg.seed) == ("qat", 3e-4, True, 7)
    assert cfg.task.name == "reverse" and cfg.rollout.capture == "full"
    with pytest.raises(ConfigError, match="trainer.lrr"):
        load_config(p, ["trainer.lrr=1"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(p, ["trainer.lr"])
    with pytest.raises(ConfigError, match="trainer.lr must be float"):
        load_config(p, ["trainer.lr=fast"])
