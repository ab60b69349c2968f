"""profiling/prebuild_device_caches.py without nvcc: its kernel sets and the pruning of stale cache entries."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "profiling"))

import prebuild_device_caches as caches  # noqa: E402


def _entry(root: Path, name: str, mtime: float) -> Path:
    folder = root / "v1" / name
    folder.mkdir(parents=True)
    (folder / "kernel.cubin").write_bytes(b"\x7fELF")
    os.utime(folder, (mtime, mtime))
    return folder


def test_keep_newest_leaves_one_entry_per_kernel_name(tmp_path):
    old = _entry(tmp_path, "decode_attention_nvfp4_mma4l_hq32_hkv4_d128_p16_sm90a-aaaa", 100.0)
    new = _entry(tmp_path, "decode_attention_nvfp4_mma4l_hq32_hkv4_d128_p16_sm90a-bbbb", 200.0)
    older = _entry(tmp_path, "decode_attention_nvfp4_mma4l_hq32_hkv4_d128_p16_sm90a-cccc", 50.0)
    other = _entry(tmp_path, "nvfp4_quantize_bf16_v2_d2048_sm90a-dddd", 10.0)
    building = _entry(tmp_path, ".tmp-nvfp4_quantize_bf16_v2_d2048_sm90a-x1y2", 300.0)  # another process's build
    assert caches.keep_newest(tmp_path) == 2
    assert new.is_dir() and other.is_dir() and building.is_dir()
    assert not old.exists() and not older.exists()


def test_every_set_names_its_kernels():
    """Each set enumerates specs (no build here): the ops and shapes they name still exist."""
    for name, specs_of in caches.SETS.items():
        specs = specs_of()
        assert specs and all(s.name.endswith("_sm90a") for s in specs), name
    ops = {s.op for s in caches.SETS["other_shapes"]()}
    assert {"decode_attention", "nvfp4_quantize"} <= ops and any(op.startswith("moe") for op in ops)
    # the gather_pieces call's set: the tests' tiles of both test shapes, and 235B's A/B kernels of both arms
    moe = {s.name for s in caches.SETS["moe_tests"]()}
    assert any("_e8_h256_i128_" in n and "_gp1_" in n for n in moe)  # tiny's gather_pieces extra tiles
    assert any(n.startswith("moe_gemm_gate_up_swiglu_h_nvfp4_e128_h4096_i1536_tn128") and n.endswith("_gp1_sm90a")
               for n in moe)
