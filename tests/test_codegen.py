"""Code generation: deterministic rendering, stable names, write-if-different, wheel layout, compile."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from trace_kernels import codegen, paths, shapes
from trace_kernels.codegen.ops import guided_fake_quantize, quantize, refit_weights

MY_OPS = ["nvfp4_quantize", "nvfp4_guided_fake_quantize", "nvfp4_refit_weights"]


@pytest.mark.parametrize("preset", sorted(shapes.PRESETS))
def test_every_preset_renders_deterministically(preset):
    specs = codegen.specs_for_shape(shapes.preset(preset))
    assert specs, preset
    for spec in specs:
        first, second = spec.render(), spec.render()
        assert first == second
        assert spec.name in first, "the extern C symbol is the kernel name"
        assert "{{" not in first and "{%" not in first


def test_names_are_stable():
    """The default launch (a non-v1 variant since the A/Bs of 2026-11-29) carries its tag; v1 keeps its
    measured name. guided_fake_quantize (v7): v6's kernel for the trainer's call, v7's for the other modes."""
    names = [s.name for s in codegen.specs_for_shape(shapes.preset("qwen3-30b-a3b"), MY_OPS)]
    assert guided_fake_quantize.VARIANT == "v7"
    assert names == [
        "nvfp4_guided_fake_quantize_bf16_v6_compact_d128_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v6_compact_d2048_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v6_compact_d768_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v7_compact_counters_d128_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v7_compact_counters_d2048_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v7_compact_counters_d768_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v7_full_counters_d128_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v7_full_counters_d2048_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v7_full_counters_d768_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v7_full_d128_sm90a", "nvfp4_guided_fake_quantize_bf16_v7_full_d2048_sm90a",
        "nvfp4_guided_fake_quantize_bf16_v7_full_d768_sm90a",
        "nvfp4_quantize_bf16_v2_d128_sm90a",
        "nvfp4_quantize_bf16_v2_d2048_sm90a", "nvfp4_quantize_bf16_v2_d768_sm90a", "nvfp4_refit_weights_bf16_v9_sm90a"]
    assert quantize.VARIANTS == ("v2",) and quantize.spec("f32", 16).name == "nvfp4_quantize_f32_v2_d16_sm90a"
    with pytest.raises(ValueError, match="v1"):
        quantize.spec("f32", 16, "v1")  # removed: lost to v2 on the H200


def test_torch_dtypes_and_names_agree():
    import torch
    assert quantize.spec(torch.bfloat16, 64) == quantize.spec("bf16", 64)
    with pytest.raises(TypeError):
        quantize.spec(torch.int8, 64)
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize.spec("bf16", 24)


def test_tiling_covers_rows():
    for dtype in ("bf16", "f32"):
        for d in (16, 48, 64, 768, 1536, 2048, 4096, 16384):
            tpr, cta = quantize.tiling(dtype, d)  # whole blocks per thread
            assert tpr >= 1 and tpr & (tpr - 1) == 0 and cta % tpr == 0 and cta <= 1024
            blocks = -(-(d // 16) // tpr)
            assert blocks * tpr >= d // 16 and blocks <= 8


def test_refit_variants_name_their_kernels():
    """The refit variants kept after the H200 A/Bs, each its own kernel; a removed one is refused by name."""
    assert refit_weights.VARIANTS == ("v2", "v8", "v9") and refit_weights.VARIANT in refit_weights.VARIANTS
    for variant in refit_weights.VARIANTS:
        spec = refit_weights.spec("bf16", variant)
        assert spec.name == f"nvfp4_refit_weights_bf16_{variant}_sm90a"
        assert f"/*VARIANT=*/{variant[1:]}>" in spec.render() and spec.launch["variant"] == variant
    with pytest.raises(ValueError, match="v6"):
        refit_weights.spec("bf16", "v6")


@pytest.mark.parametrize("value,expect", [("v2", "nvfp4_refit_weights_bf16_v2_sm90a"),
                                          ("v8", "nvfp4_refit_weights_bf16_v8_sm90a"),
                                          ("v7", "TRACE_KERNELS_REFIT_VARIANT"),
                                          ("v12", "TRACE_KERNELS_REFIT_VARIANT")])
def test_refit_variant_from_the_environment(value, expect):
    """TRACE_KERNELS_REFIT_VARIANT picks refit_weights' default launch when the module loads; an unknown or removed one
    raises."""
    code = "from trace_kernels.codegen.ops import refit_weights as r; print(r.spec('bf16').name)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "TRACE_KERNELS_REFIT_VARIANT": value})
    known = value in refit_weights.VARIANTS
    assert expect in (result.stdout if known else result.stderr)
    assert (result.returncode == 0) == known


@pytest.mark.parametrize("value,expect", [("v2", "nvfp4_refit_packed_bf16_v2_g2_sm90a"),
                                          ("v1", "nvfp4_refit_packed_bf16_g2_sm90a"),
                                          ("v3", "TRACE_KERNELS_REFIT_PACKED_VARIANT")])
def test_refit_packed_variant_from_the_environment(value, expect):
    """TRACE_KERNELS_REFIT_PACKED_VARIANT picks refit_weights_packed_'s kernel; v2 (speculative) builds no amax pass of
    refit_weights; an unknown one raises."""
    code = ("from trace_kernels import shapes; from trace_kernels.codegen.ops import refit_packed as r; "
            "print(r.spec('bf16', 2).name, len(r.specs_for_shape(shapes.preset('tiny'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "TRACE_KERNELS_REFIT_PACKED_VARIANT": value})
    assert expect in (result.stdout if value != "v3" else result.stderr)
    assert (result.returncode == 0) == (value != "v3")
    if value != "v3":
        assert result.stdout.split()[1] == ("2" if value == "v2" else "3")


def test_registry_discovers_op_modules():
    ops = codegen.all_ops()
    for name in MY_OPS:
        assert name in ops and ops[name].description
    with pytest.raises(ValueError, match="unknown op"):
        codegen.specs_for_shape(shapes.preset("tiny"), ["no_such_op"])


def test_shapes_custom_and_hf_config(tmp_path):
    shape = shapes.parse_custom("E=128,H=2048,I=768,k=8,hq=32,hkv=4,hd=128")
    assert (shape.experts, shape.hidden, shape.intermediate, shape.top_k) == (128, 2048, 768, 8)
    assert shape.name == "e128_h2048_i768_k8_hq32_hkv4_d128"
    assert shapes.parse_custom("E=8,H=256,I=128,k=2,hq=4,hkv=2,hd=64", name="mine").name == "mine"
    assert shapes.preset("qwen3-30b-a3b").intermediate == 768
    assert shapes.preset("qwen3-235b-a22b").hidden == 4096
    with pytest.raises(ValueError, match="lacks"):
        shapes.parse_custom("E=8,H=256")
    with pytest.raises(ValueError, match="multiple of 16"):
        shapes.parse_custom("E=8,H=250,I=128,k=2,hq=4,hkv=2,hd=64")
    config = {"model_type": "qwen3_moe", "num_experts": 128, "hidden_size": 2048, "moe_intermediate_size": 768,
              "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    from_hf = shapes.from_hf_config(path)
    assert from_hf.hidden == 2048 and from_hf.kv_heads == 4 and from_hf.name == "qwen3_moe"
    assert shapes.resolve(str(path)).experts == 128
    assert shapes.resolve("tiny") is shapes.PRESETS["tiny"]
    # a multimodal config keeps the language model's keys under text_config (Llama 4 style: dense layers' width in
    # intermediate_size_mlp, the experts' in intermediate_size)
    llama4 = {"model_type": "llama4", "text_config": {
        "model_type": "llama4_text", "num_local_experts": 16, "hidden_size": 5120, "intermediate_size": 8192,
        "intermediate_size_mlp": 16384, "num_experts_per_tok": 1, "num_attention_heads": 40, "num_key_value_heads": 8,
        "head_dim": 128}}
    path.write_text(json.dumps(llama4))
    assert shapes.from_hf_config(path) == shapes.ModelShape("llama4_text", 16, 5120, 8192, 1, 40, 8, 128)
    deepseek = {"model_type": "deepseek_v3", "n_routed_experts": 256, "hidden_size": 7168, "moe_intermediate_size": 2048,
                "num_experts_per_tok": 8, "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512,
                "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}
    path.write_text(json.dumps(deepseek))
    with pytest.raises(ValueError, match=r"latent attention .* --shape E=256,H=7168,I=2048,k=8,"):
        shapes.from_hf_config(path)



def test_hf_configs_of_other_families(tmp_path):
    """The keys of ERNIE 4.5, Hunyuan (per-layer lists), gpt-oss and DBRX (nested sections); values that are not one
    integer are refused by name."""
    path = tmp_path / "config.json"

    def read(config):
        path.write_text(json.dumps(config))
        return shapes.from_hf_config(path)

    ernie = {"model_type": "ernie4_5_moe", "moe_num_experts": 64, "moe_k": 6, "moe_intermediate_size": 1536,
             "intermediate_size": 12288, "hidden_size": 2560, "num_attention_heads": 20, "num_key_value_heads": 4,
             "head_dim": 128, "moe_num_shared_experts": 2}
    assert read(ernie) == shapes.ModelShape("ernie4_5_moe", 64, 2560, 1536, 6, 20, 4, 128)
    assert shapes.shared_experts(path) == "moe_num_shared_experts=2"
    hunyuan = {"model_type": "hunyuan_v1_moe", "num_experts": 64, "moe_topk": [8] * 32,
               "moe_intermediate_size": [3072] * 32, "hidden_size": 4096, "num_attention_heads": 32,
               "num_key_value_heads": 8, "attention_head_dim": 128}
    assert read(hunyuan) == shapes.ModelShape("hunyuan_v1_moe", 64, 4096, 3072, 8, 32, 8, 128)
    assert shapes.shared_experts(path) is None
    with pytest.raises(ValueError, match=r"moe_topk differs across layers \(\[4, 8\]\); give one layer's shape"):
        read({**hunyuan, "moe_topk": [8] * 16 + [4] * 16})
    with pytest.raises(ValueError, match=r"hidden_size is 4096.0, not an integer"):
        read({**hunyuan, "hidden_size": 4096.0})
    gpt_oss = {"model_type": "gpt_oss", "num_local_experts": 128, "experts_per_token": 4, "intermediate_size": 2880,
               "hidden_size": 2880, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64}
    assert read(gpt_oss) == shapes.ModelShape("gpt_oss", 128, 2880, 2880, 4, 64, 8, 64)
    dbrx = {"model_type": "dbrx", "d_model": 6144, "n_heads": 48,
            "attn_config": {"kv_n_heads": 8, "clip_qkv": 8}, "ffn_config": {"ffn_hidden_size": 10752,
                                                                           "moe_num_experts": 16, "moe_top_k": 4}}
    assert read(dbrx) == shapes.ModelShape("dbrx", 16, 6144, 10752, 4, 48, 8, 128)
    qwen2_moe = {"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                 "intermediate_size": 5632, "shared_expert_intermediate_size": 5632, "hidden_size": 2048,
                 "num_attention_heads": 16, "num_key_value_heads": 16}
    assert read(qwen2_moe) == shapes.ModelShape("qwen2_moe", 60, 2048, 1408, 4, 16, 16, 128)
    assert shapes.shared_experts(path) == "shared_expert_intermediate_size=5632"

def test_generate_writes_only_changed_files(tmp_path):
    specs = codegen.specs_for_shape(shapes.preset("tiny"), MY_OPS)
    written = codegen.generate(specs, tmp_path)
    assert len(written) == len(specs) + 1  # sources + manifest
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert set(manifest) == {s.name for s in specs}
    assert all(item["nvcc_flags"] and item["source_key"] for item in manifest.values())
    source = tmp_path / f"{specs[0].name}.cu"
    mtime = source.stat().st_mtime_ns
    os.utime(source, ns=(mtime - 10**9, mtime - 10**9))
    assert codegen.generate(specs, tmp_path) == []
    assert source.stat().st_mtime_ns == mtime - 10**9, "unchanged content must not be rewritten"
    source.write_text("// stale\n")
    assert codegen.generate(specs, tmp_path) == [source]


def test_templates_found_in_wheel_layout(tmp_path, monkeypatch):
    """An installed wheel has no checkout: data comes from trace_kernels/_data (setup.py copies it)."""
    root = paths.checkout_root()
    data = tmp_path / "_data"
    shutil.copytree(root / "codegen" / "templates", data / "templates")
    shutil.copytree(root / "cuda" / "include", data / "include")
    shutil.copytree(root / "codegen" / "moe_tables", data / "moe_tables")
    monkeypatch.setattr(paths, "checkout_root", lambda: None)
    monkeypatch.setattr(paths, "DATA_DIR", data)
    spec = quantize.spec("bf16", 64)
    assert paths.templates_dir() == data / "templates"
    assert paths.include_dir() == data / "include"
    assert paths.moe_tables_dir() == data / "moe_tables"
    assert spec.name in spec.render()
    monkeypatch.setattr(paths, "DATA_DIR", tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="broken install"):
        paths.templates_dir()


@pytest.mark.nvcc
def test_generated_sources_compile_for_sm90a(tmp_path, monkeypatch):
    """A few small kernels through the real nvcc (every op and variant, every input dtype once)."""
    from trace_kernels import jit
    from trace_kernels.jit import compiler
    monkeypatch.setenv("TRACE_KERNELS_CACHE_DIR", str(tmp_path))
    specs = [quantize.spec("bf16", 64), guided_fake_quantize.spec("f32", 16), refit_weights.spec("f16"),
             quantize.spec("f16", 32), guided_fake_quantize.spec("bf16", 32), guided_fake_quantize.spec("f16", 32),
             guided_fake_quantize.spec("bf16", 32, "v7", "compact_counters"),
             guided_fake_quantize.spec("f16", 32, "v7", "full"),
             guided_fake_quantize.spec("bf16", 32, "v7", "full_counters"),
             refit_weights.spec("f32", "v2"), refit_weights.spec("bf16", "v8")]
    entries = jit.build_all(specs, jobs=2)
    for spec, entry in zip(specs, entries):
        assert entry.is_valid() and entry.cubin.read_bytes()[:4] == b"\x7fELF", spec.name
        report = compiler.parse_ptxas((entry.folder / "ptxas.txt").read_text())
        assert report.registers > 0 and report.spill_stores == 0 and report.stack_frame == 0, spec.name
        assert "warning" not in report.text, report.text


def test_guided_kernels_per_mode():
    """The trainer's call (compact guidance, no counters) launches v6's kernel; compact guidance with counters and
    full guidance with and without have a v7 kernel each (tables, their own geometry)."""
    g = guided_fake_quantize
    assert [g.mode_of(full, counters) for full in (False, True) for counters in (False, True)] == list(g.MODES)
    compact = g.spec("bf16", 2048)
    assert compact.name == "nvfp4_guided_fake_quantize_bf16_v6_compact_d2048_sm90a" and compact == g.spec("bf16", 2048, "v7")
    text = compact.render()
    assert f"__launch_bounds__(256, {g.COMPACT_CTAS_PER_SM})" in text and "guided_fake_quantize_v5.cuh" in text
    assert set(g.V7_GEOMETRY) == set(g.MODES[1:])
    for mode, (threads, per_sm, *plain_slots) in g.V7_GEOMETRY.items():
        s = g.spec("bf16", 2048, "v7", mode)
        slots = plain_slots[0] if plain_slots else g.SLOTS
        assert s.name == f"nvfp4_guided_fake_quantize_bf16_v7_{mode}_d2048_sm90a"
        assert s.launch["threads"] == threads and s.launch["units_per_cta"] == threads * slots
        text = s.render()
        assert f"__launch_bounds__({threads}, {per_sm})" in text and "guided_fake_quantize_v7.cuh" in text
        assert f"/*KSLOTS=*/{slots}," in text and f"/*PIPELINED=*/{str(not plain_slots).lower()}>" in text
        assert f"/*FULL=*/{str(mode.startswith('full')).lower()}" in text
        assert f"/*COUNT=*/{str(mode.endswith('_counters')).lower()}" in text
    assert len({g.spec("bf16", 2048, mode=m).name for m in g.MODES}) == 4
    with pytest.raises(ValueError, match="mode"):
        g.spec("bf16", 2048, "v7", "counters")
    with pytest.raises(ValueError, match="v4"):
        g.spec("bf16", 2048, "v4")  # removed: lost to v6 / v7 on the H200


def test_quantize_block_size_names(monkeypatch):
    """A non-default block size (the benchmark's sweep) is in the name."""
    default = quantize.spec("bf16", 2048)
    monkeypatch.setattr(quantize, "MIN_CTA", 256)
    wide = quantize.spec("bf16", 2048)
    assert default.launch["threads"] == quantize.DEFAULT_MIN_CTA and "_cta" not in default.name
    assert wide.launch["threads"] == 256 and wide.name == default.name.replace("_d2048", "_d2048_cta256")


def test_shape_kernels_names_the_ops_left_out():
    shape = shapes.parse_custom("E=8,H=256,I=128,k=2,hq=4,hkv=2,hd=256")
    specs, unsupported = codegen.shape_kernels(shape)
    assert list(unsupported) == ["decode_attention"] and "head_dim 256" in unsupported["decode_attention"]
    assert specs == codegen.specs_for_shape(shape) and not any(s.op == "decode_attention" for s in specs)
    assert {s.op for s in specs} == set(codegen.all_ops()) - {"decode_attention"}
    with pytest.raises(codegen.UnsupportedShape, match="head_dim 256"):
        codegen.shape_kernels(shape, ["decode_attention"])
    assert codegen.shape_kernels(shapes.preset("tiny")) == (codegen.specs_for_shape(shapes.preset("tiny")), {})
    odd = shapes.parse_custom("E=8,H=1040,I=528,k=2,hq=8,hkv=2,hd=64")  # NVFP4 blocks, but not 64-wide GEMM tiles
    assert list(codegen.shape_kernels(odd)[1]) == ["moe_gemm"]
    with pytest.raises(codegen.UnsupportedShape, match=r"hidden \(1040\) and intermediate \(528\) must be multiples"):
        codegen.specs_for_shape(odd, ["moe_gemm"])
