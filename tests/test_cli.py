"""`trace-kernels` CLI: help, list, generate for presets / custom shapes / config.json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trace_kernels import cli
from trace_kernels.codegen.ops import guided_fake_quantize as codegen_guided


def test_help_runs_as_module():
    result = subprocess.run([sys.executable, "-m", "trace_kernels.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "generate" in result.stdout and "build" in result.stdout
    for command in ("generate", "build", "list"):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, "--help"])
        assert exit_info.value.code == 0


def test_list(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACE_KERNELS_MOE_TABLES", raising=False)
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "qwen3-235b-a22b" in out and "nvfp4_quantize_bf16_v2_d2048_sm90a" in out and "cached kernels" in out
    assert "tuned MoE tile tables (TRACE_KERNELS_MOE_TABLES): none" in out
    assert cli.main(["list", "--env"]) == 0
    assert "TRACE_KERNELS_CACHE_DIR=" in capsys.readouterr().out


def test_list_names_the_tuned_tables(capsys, monkeypatch, tmp_path):
    from trace_kernels import moe_tables
    from trace_kernels.codegen.ops.moe_gemm import TileConfig
    path = tmp_path / "tables.json"
    moe_tables.write(path, [moe_tables.entry("down_routed", 8, 256, 128, [(2.0, TileConfig(8, 2)),
                                                                          (float("inf"), TileConfig(32, 2))])], {})
    monkeypatch.setenv("TRACE_KERNELS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACE_KERNELS_MOE_TABLES", str(path))
    moe_tables.clear()
    try:
        assert cli.main(["list"]) == 0
    finally:
        moe_tables.clear()
    out = capsys.readouterr().out
    assert f"tuned MoE tile tables (TRACE_KERNELS_MOE_TABLES): 1\n  down_routed E=8 N=256 K=128: 2 bands, from {path}" \
        in out


def test_generate_preset_then_nothing_changes(tmp_path, capsys):
    args = ["generate", "--preset", "tiny", "--op", "nvfp4_quantize", "--out", str(tmp_path)]
    assert cli.main(args) == 0
    assert "nvfp4_quantize_bf16_v2_d256_sm90a" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.glob("*.cu")) == [
        "nvfp4_quantize_bf16_v2_d128_sm90a.cu", "nvfp4_quantize_bf16_v2_d256_sm90a.cu", "nvfp4_quantize_bf16_v2_d64_sm90a.cu"]
    assert cli.main(args) == 0
    assert "0 files written" in capsys.readouterr().out


def test_generate_custom_shape_and_config(tmp_path, capsys):
    assert cli.main(["generate", "--shape", "E=4,H=512,I=96,k=2,hq=8,hkv=2,hd=32", "--op", "nvfp4_quantize",
                     "--out", str(tmp_path / "a")]) == 0
    assert (tmp_path / "a" / "nvfp4_quantize_bf16_v2_d96_sm90a.cu").is_file()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_local_experts": 8, "hidden_size": 1024, "intermediate_size": 2048,
                                  "num_experts_per_tok": 2, "num_attention_heads": 16, "num_key_value_heads": 8}))
    assert cli.main(["generate", "--config", str(config), "--op", "nvfp4_guided_fake_quantize",
                     "--out", str(tmp_path / "b")]) == 0
    guided = codegen_guided.spec("bf16", 64).name  # head_dim 1024/16
    assert guided.startswith("nvfp4_guided_fake_quantize_bf16_") and (tmp_path / "b" / f"{guided}.cu").is_file()
    assert "shared experts" not in capsys.readouterr().err
    config.write_text(json.dumps({"model_type": "qwen2_moe", "num_experts": 8, "hidden_size": 1024,
                                  "moe_intermediate_size": 256, "shared_expert_intermediate_size": 2048,
                                  "num_experts_per_tok": 2, "num_attention_heads": 16, "num_key_value_heads": 8}))
    assert cli.main(["generate", "--config", str(config), "--op", "nvfp4_quantize", "--out", str(tmp_path / "d")]) == 0
    assert ("qwen2_moe: shared experts (shared_expert_intermediate_size=2048) are dense MLPs; the MoE kernels cover "
            "the routed experts only") in capsys.readouterr().err
    assert cli.main(["generate", "--shape", "E=4,H=500", "--out", str(tmp_path / "c")]) == 2
    assert "error" in capsys.readouterr().err


def test_generate_leaves_out_an_op_that_cannot_take_the_shape(tmp_path, capsys):
    """head_dim 256 has no decode attention kernels: generating every op says so on stderr and renders the others;
    asking for decode_attention by name is an error. A GQA group of 5 (Llama 4) renders them all."""
    shape = "E=16,H=512,I=256,k=1,hq=16,hkv=8,hd=256"
    assert cli.main(["generate", "--shape", shape, "--out", str(tmp_path / "all")]) == 0
    captured = capsys.readouterr()
    assert "skipped decode_attention: head_dim 256 is not supported (supported: 64, 128)" in captured.err
    names = {p.stem for p in (tmp_path / "all").glob("*.cu")}
    assert any(n.startswith("moe_gemm_") for n in names) and any(n.startswith("kv_append_") for n in names)
    assert not any(n.startswith("decode_attention") for n in names)
    assert cli.main(["generate", "--shape", shape, "--op", "kv_append", "--op", "decode_attention",
                     "--out", str(tmp_path / "one")]) == 2
    assert "head_dim 256 is not supported" in capsys.readouterr().err
    assert not (tmp_path / "one").exists()
    # head_dim 96 (16 times 6): no append kernel (rows of a power of two of blocks) and no decode kernel; the rest renders
    assert cli.main(["generate", "--shape", "E=16,H=512,I=256,k=1,hq=16,hkv=8,hd=96", "--out", str(tmp_path / "d96")]) == 0
    err = capsys.readouterr().err
    assert "skipped kv_append: head_dim 96 must be 16 times a power of two" in err and \
        "skipped decode_attention" in err
    assert any(p.name.startswith("kv_gather_") for p in (tmp_path / "d96").glob("*.cu"))
    assert cli.main(["generate", "--shape", "E=16,H=512,I=256,k=1,hq=40,hkv=8,hd=128", "--op", "decode_attention",
                     "--out", str(tmp_path / "gqa5")]) == 0
    assert "skipped" not in capsys.readouterr().err
    assert (tmp_path / "gqa5" / "decode_attention_nvfp4_mma4l_hq40_hkv8_d128_p16_sm90a.cu").is_file()
