"""Build, on this machine (nvcc only, no GPU), the JIT cache a device call carries, so that the call spends its
minutes on the GPU rather than on nvcc. A fresh checkout has none: the caches are ignored files.

    python profiling/prebuild_device_caches.py kv engine memory             # .tkcache: decode_ends.sh, issue3.sh
    python profiling/prebuild_device_caches.py --cache .tkcache_shapes kv other_shapes   # other_shapes.sh
    python profiling/prebuild_device_caches.py kv wide                                   # decode_wide.sh
    python profiling/prebuild_device_caches.py --cache .tkcache_shapes other_shapes tuning  # moe_tuned_tables.sh
    python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests            # moe_gather_pieces.sh
    python profiling/prebuild_device_caches.py --cache .tkcache_moe moe_tests engine kv  # step_pipeline_default.sh,
                                                       # decode_lazy_max.sh, bench_decode_fill.sh (29.7 MiB)

Sets:
  kv            the KV GPU tests' and the attention benchmark's kernels (kv_testing.kernel_specs)
  engine        the rollout engine's kernels of the RL GPU tests' two models (gpu_env.sh's
                prebuild_engine_test_models runs this set on the device)
  memory        the memory kernels' GPU tests and benchmark (kernel_sets.memory_kernel_specs)
  other_shapes  run_gpu_checks_other_shapes.sh's MoE auto tables (gpt-oss-120b's and Mixtral-8x7B's shapes, the
                odd-chunk test shape) and the decode kernels it benchmarks at Llama 4's and GLM-4.5's heads
  wide          the decode kernels run_gpu_checks_decode_wide.sh benchmarks at GQA 16 and 12 (mma4l and mma4l_c16)
  tuning        the MoE GEMMs of sweep_moe_gemm_tiles.py --tiles tuning at the other_shapes MoE shapes
                (run_gpu_checks_moe_tuned_tables.sh)
  moe_l2_prefetch  run_gpu_checks_moe_l2_prefetch.sh's MoE kernels (the l2_prefetch and auto_gd A/B tables and their
                GPU tests' extra tiles; carried as .tkcache_pf)
  moe_cluster   run_gpu_checks_moe_cluster_quant.sh's MoE kernels (auto against auto_cq, the cluster_quant tiles;
                75 in 297 s here, 5.9 MiB, fifty-third session)
  moe_tests     the MoE GPU tests' kernels and 235B's auto / auto_sp0 / auto_ra0 tables
                (run_gpu_checks_step_pipeline_ab.sh and, with engine, run_gpu_checks_step_pipeline_default.sh and
                run_gpu_checks_moe_row_amax.sh; carried alone as .tkcache_moe: with the tree and
                the wheels it fills most of the 64 MiB; moe_tests and engine: 460 kernels, 27.8 MiB, forty-first
                session: moe_tests 416 in 1106 s here; with kv as well, 29.7 MiB in the fifty-first session, so that
                one carry serves the KV GPU tests, the decode A/Bs and the attention benchmark too)
Afterwards only the newest entry of each kernel name stays (an edited header leaves the old key's entry behind) and the
cache's size is printed: the device tool carries at most 64 MiB, the tree included. On this 2-core machine (nvcc
13.0, 2026-12-05): kv 119 kernels in 48 s, engine 54 in 69 s, memory 141 in 69 s (26 MiB the three),
other_shapes 67 in 185 s (6 MiB), moe_tests 367 in 948 s (20.8 MiB; with the step_pipeline extra tiles and 235B's
auto_sp, thirty-seventh session: 392 in 1165 s, 31.8 MiB).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

OTHER_MOE_SHAPES = ("E=128,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64", "E=8,H=4096,I=14336,k=2,hq=32,hkv=8,hd=128")
# (Hq, Hkv, D, P): NVFP4 variants, BF16 variants, as run_gpu_checks_other_shapes.sh benchmarks them
OTHER_DECODE_HEADS = {(40, 8, 128, 16): (("mma4l", "mma4l_w1s2", "mma2_w2s2"), ("mma",)),
                      (96, 8, 128, 16): (("mma4l", "mma2_w2s2"), ("mma",))}
# (Hq, Hkv, D, P): NVFP4 variants, BF16 variants, as run_gpu_checks_decode_wide.sh benchmarks them
WIDE_DECODE_HEADS = {(64, 4, 128, 16): (("mma4l", "mma4l_c16", "mma4l_w1s4_c16", "mma4l_w1s2_c16"), ("mma",)),
                     (96, 8, 128, 16): (("mma4l", "mma4l_c16", "mma4l_w1s2_c16"), ("mma",))}
# rl/configs/models.toml's tiny-kernels and small, at every decode batch the RL GPU tests use
ENGINE_TEST_MODELS = ("E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64", "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64")
ENGINE_TEST_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128)


def kv_specs() -> list:
    from trace_kernels import kv_testing
    return kv_testing.kernel_specs()


def engine_specs() -> list:
    from prebuild_engine_kernels import specs_for  # profiling/ is the script's folder
    return [s for model in ENGINE_TEST_MODELS for s in specs_for(model, list(ENGINE_TEST_TOKENS))]


def memory_specs() -> list:
    from trace_kernels.testing.kernel_sets import memory_kernel_specs
    return memory_kernel_specs()


def decode_specs(heads: dict) -> list:
    """The decode kernels of {(Hq, Hkv, D, P): (NVFP4 variants, BF16 variants)} and their combines."""
    from trace_kernels.codegen.ops import decode_attention
    specs = []
    for (hq, hkv, d, p), (nvfp4, bf16) in heads.items():
        specs += [decode_attention.spec("nvfp4", hq, hkv, d, p, v) for v in nvfp4]
        specs += [decode_attention.spec("bf16", hq, hkv, d, p, v) for v in bf16]
        specs.append(decode_attention.combine_spec(d))
    return specs


def other_shapes_specs() -> list:
    from trace_kernels import shapes
    from trace_kernels.codegen.ops import moe_gemm as codegen, quantize
    from trace_kernels.moe_testing import ODD_CHUNKS_SHAPE
    specs = []
    for shape in [*(shapes.resolve(s) for s in OTHER_MOE_SHAPES), ODD_CHUNKS_SHAPE]:
        specs += codegen.specs_for_shape(shape, ("auto",)) + quantize.specs_for_shape(shape)
    return specs + decode_specs(OTHER_DECODE_HEADS)


def tuning_specs() -> list:
    from sweep_moe_gemm_tiles import TUNING_TILES, explicit_tiles, shape_tiles  # profiling/ is the script's folder
    from trace_kernels import shapes
    from trace_kernels.codegen.ops import moe_gemm as codegen
    kinds = ("gate_up_swiglu", "down_routed")
    specs = []
    for shape in (shapes.resolve(s) for s in OTHER_MOE_SHAPES):
        for tile in shape_tiles(shape, explicit_tiles(TUNING_TILES), kinds):
            specs += [codegen.gemm_spec(shape, codegen.launched_kind(kind, tile), tile) for kind in kinds]
    return specs


def moe_test_specs() -> list:
    """The MoE GPU tests' kernels (every table and extra tile of tiny and Qwen3-30B-A3B, as moe_prebuild.py builds
    them) and Qwen3-235B-A22B's auto, auto_sp0 and auto_ra0 tables (the layer A/Bs of
    run_gpu_checks_step_pipeline_{ab,default}.sh and run_gpu_checks_moe_row_amax.sh; the other A/B scripts' 235B
    tables compile on the device, in their moe_build_ab)."""
    import moe_prebuild  # profiling/ is the script's folder
    from trace_kernels.codegen.ops import moe_gemm as codegen
    tests = moe_prebuild.kernel_specs(["tiny", "qwen3-30b-a3b"], tuple(codegen.TILE_TABLES))
    tables_235b = ("auto", "auto_sp0", "auto_ra0")
    big = moe_prebuild.kernel_specs(["qwen3-235b-a22b"], tables_235b, extras=False)
    return list(tests.values()) + list(big.values())


def moe_cluster_specs() -> list:
    """run_gpu_checks_moe_cluster_quant.sh's kernels: the auto and auto_cq tables of tiny, Qwen3-30B-A3B and
    Qwen3-235B-A22B (the layer A/B and the auto_cq layer test), for tiny and 30B the cluster_quant extra tiles and
    the same tiles quantized afterwards (the GPU tests that compare them), and for tiny the TN=8 one quantized by its
    last CTA (the non-finite report's comparison)."""
    import moe_prebuild  # profiling/ is the script's folder
    from dataclasses import replace
    from trace_kernels import shapes
    from trace_kernels.codegen.ops import moe_gemm as codegen
    specs = moe_prebuild.kernel_specs(["tiny", "qwen3-30b-a3b", "qwen3-235b-a22b"], ("auto", "auto_cq"), extras=False)
    clustered = [t for t in codegen.EXTRA_TILES if t.cluster_quant]
    twins = [replace(t, cluster_quant=False, quantize_after=True) for t in clustered]
    last_cta = replace(clustered[0], cluster_quant=False)
    for shape, tiles in ((shapes.resolve("tiny"), clustered + twins + [last_cta]),
                         (shapes.resolve("qwen3-30b-a3b"), clustered + twins)):
        specs.update(moe_prebuild.launched_specs(shape, tiles))
    return list(specs.values())


def moe_l2_prefetch_specs() -> list:
    """run_gpu_checks_moe_l2_prefetch.sh's kernels: the auto, auto_pfd, auto_pf, auto_gd and auto_v1pf tables of
    Qwen3-30B-A3B and Qwen3-235B-A22B (the layer A/Bs) and, for 30B, the GPU tests' extra tiles that prefetch
    (l2_prefetch), combine (fused_combine) or run the direct tile quantized afterwards (auto_gd's gate_up), every call
    kind as the ops launch them, with 30B's quantize and combine kernels (sixty-third session: 92 in about 5 min
    here)."""
    import moe_prebuild  # profiling/ is the script's folder
    from trace_kernels import shapes
    from trace_kernels.codegen.ops import moe_gemm as codegen, quantize
    tables = ("auto", "auto_pfd", "auto_pf", "auto_gd", "auto_v1pf")
    specs = moe_prebuild.kernel_specs(["qwen3-30b-a3b", "qwen3-235b-a22b"], tables, extras=False)
    shape = shapes.resolve("qwen3-30b-a3b")
    specs.update(moe_prebuild.launched_specs(shape, [
        t for t in codegen.EXTRA_TILES if t.l2_prefetch or t.fused_combine or (t.weights_direct and t.quantize_after)]))
    for spec in [*quantize.specs_for_shape(shape), codegen.combine_spec(shape)]:
        specs[spec.name] = spec
    return list(specs.values())


SETS = {"kv": kv_specs, "engine": engine_specs, "memory": memory_specs, "other_shapes": other_shapes_specs,
        "wide": lambda: decode_specs(WIDE_DECODE_HEADS), "tuning": tuning_specs, "moe_tests": moe_test_specs,
        "moe_cluster": moe_cluster_specs, "moe_l2_prefetch": moe_l2_prefetch_specs}


def keep_newest(root: Path) -> int:
    """Remove every cache entry (NAME-KEY folder) but the newest of its kernel name; returns how many went."""
    newest: dict[str, Path] = {}
    removed = 0
    folders = [f for f in root.glob("v*/*-*") if f.is_dir() and not f.name.startswith(".")]  # (.tmp-, .trash-)
    for folder in sorted(folders, key=lambda f: f.stat().st_mtime):
        name = folder.name.rsplit("-", 1)[0]
        if name in newest:
            shutil.rmtree(newest[name])
            removed += 1
        newest[name] = folder
    return removed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sets", nargs="+", choices=tuple(SETS))
    parser.add_argument("--cache", default=".tkcache", help="cache folder (TRACE_KERNELS_CACHE_DIR of the call)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    root = Path(args.cache).resolve()
    os.environ["TRACE_KERNELS_CACHE_DIR"] = str(root)  # before the JIT reads it
    from trace_kernels import jit
    failed = 0
    for name in args.sets:
        t = time.time()
        specs = list({s.name: s for s in SETS[name]()}.values())
        entries = jit.build_all(specs, jobs=args.jobs, keep_going=True)
        bad = [(s.name, str(e)[-400:]) for s, e in zip(specs, entries) if isinstance(e, Exception)]
        for kernel, error in bad:
            print("FAILED", kernel, error)
        failed += len(bad)
        print(f"{name}: {len(specs) - len(bad)} of {len(specs)} kernels in {time.time() - t:.0f} s", flush=True)
    removed = keep_newest(root)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"{root}: {size / 2**20:.1f} MiB after removing {removed} older entries")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
