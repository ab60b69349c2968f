"""`trace-rl sft` then `trace-rl train` from its output; argument errors."""
import pytest
import torch

from trace_rl.cli import main
from trace_rl.metrics import read_metrics
from trace_rl.model import MoEForCausalLM


def test_sft_then_train_from_its_output(tmp_path, capsys):
    sft_cfg = tmp_path / "sft.toml"
    sft_cfg.write_text('[model]\npreset = "tiny"\ndevice = "cpu"\n[task]\nname = "sort"\nmax_len = 3\n'
                       '[sft]\nsteps = 3\nbatch_size = 8\n')
    assert main(["sft", "--config", str(sft_cfg), "--out", str(tmp_path / "sft"), "--no-progress"]) == 0
    assert MoEForCausalLM.from_pretrained(tmp_path / "sft").config.hidden_size == 64
    assert len(read_metrics(tmp_path / "sft_metrics.jsonl")) == 3
    train_cfg = tmp_path / "train.toml"
    train_cfg.write_text(f'[model]\npreset = "tiny"\ndevice = "cpu"\ninit = "{tmp_path / "sft"}"\n'
                         '[task]\nname = "sort"\nmax_len = 3\n[rollout]\nprompts_per_step = 2\n'
                         'group_size = 2\nmax_new_tokens = 4\n[run]\nsteps = 2\n')
    assert main(["train", "--config", str(train_cfg), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert "2 RL steps" in capsys.readouterr().out
    no_sft = tmp_path / "no_sft.toml"
    no_sft.write_text('[sft]\nsteps = 0\n')
    assert main(["sft", "--config", str(no_sft), "--out", str(tmp_path / "x")]) == 2
    assert "sft.steps" in capsys.readouterr().err


def test_usage_errors():
    with pytest.raises(SystemExit):
        main([])
    with pytest.raises(SystemExit):
        main(["train", "--config", "x.toml"])  # --out is required


def test_sft_command_and_in_line_sft_give_the_same_weights(tmp_path):
    """The experiments' shared warm start (`trace-rl sft`) and the main job's in-line SFT (train with
    sft.steps > 0) are the same computation: on the CPU their weights are bit-identical."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('seed = 0\n[model]\npreset = "tiny"\ndevice = "cpu"\n[task]\nname = "addition"\n'
                   'max_digits = 1\n[rollout]\nprompts_per_step = 2\ngroup_size = 2\nmax_new_tokens = 3\n'
                   '[sft]\nsteps = 4\nbatch_size = 8\n[run]\nsteps = 1\n')
    assert main(["sft", "--config", str(cfg), "--out", str(tmp_path / "sft"), "--no-progress"]) == 0
    assert main(["train", "--config", str(cfg), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    a = MoEForCausalLM.from_pretrained(tmp_path / "sft").state_dict()
    b = MoEForCausalLM.from_pretrained(tmp_path / "run" / "sft").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
