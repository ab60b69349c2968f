#!/usr/bin/env bash
# The fused SwiGLU epilogue's last-CTA handshake (fortieth session): one thread's acq_rel atomic after the barrier
# (tile_arrival.cuh, MEMBAR.ALL.GPU) instead of every thread's __threadfence() (MEMBAR.SC.GPU) before it and again in
# the last CTA; and the one-warpgroup ws tiles' last-CTA quantization holding each row's blocks in registers (one L2
# round trip per row instead of two), as the wide tiles did (since 1d58d52 only above 64 blocks per row:
# run_gpu_checks_moe_held_rows.sh). auto runs that epilogue in the ws gate_up tile at T <= 2 (top-8 of 128 experts),
# where it cost 3.0 us of the 30B kernel's 14.9 (Nsight Compute, thirty-ninth session). One call (BUDGET s):
#   1. the kernels: the MoE GPU tests' and 235B auto's, the engine tests' models (carried in .tkcache_moe_new with the
#      base tree's auto kernels of both presets)
#   2. the layer, this tree (auto, and auto_qk: auto with every fused gate_up quantized by its own last CTA, v1 tiles
#      too, as before quantize_after) against BASE (.ab_base: the previous commit's python/, cuda/, codegen/ and bench
#      script, auto), two rounds, the trees in turn (base first in the second), T = 1, 2, 8, 32, 64, 256 (ws tiles at
#      T <= 2; from T = 8 auto's v1 gate_up quantizes in the quantize kernel: the control for the tree A/B)
#   3. the MoE GPU tests, the RL layer's GPU tests, memcheck and racecheck on the tiny layer over every tiling
#      (AB_ONLY=1: steps 1-2 alone; ROUNDS=N rounds instead of 2, the base tree first in the even ones; TOKENS=T1,T2,..)
# Usage (repo root; carry .whl, .tkcache_moe_new, .ab_base): TRACE_KERNELS_BENCH_COMMIT=<commit> OUT=$OUT \
#     [BUDGET=560] bash profiling/device/run_gpu_checks_moe_tile_arrival.sh
#   .ab_base: rm -rf .ab_base && mkdir .ab_base && git archive BASE_COMMIT python cuda codegen \
#     profiling/bench_moe_gemm.py profiling/sweep_moe_gemm_tiles.py profiling/device/gpu_env.sh | tar -x -C .ab_base
#   .tkcache_moe_new: python profiling/prebuild_device_caches.py --cache .tkcache_moe_new moe_tests engine; then, into
#     the same folder, this tree's and the base tree's moe_prebuild.py --no-extras qwen3-30b-a3b qwen3-235b-a22b with
#     --tables auto_qk and --tables auto (the fortieth session's later calls carried it renamed .tkcache_moe, with
#     TRACE_KERNELS_CACHE_DIR=$PWD/.tkcache_moe)
#   -> $OUT/moe_tile_arrival.tar
set -uo pipefail
source profiling/device/gpu_env.sh --call moe_tile_arrival 560 .tkcache_moe_new
BASE=${BASE:-.ab_base}

moe_build_ab "$DIR" auto
prebuild_engine_test_models 60 "$DIR/build_engine.log"; echo "build_engine exit $? (${SECONDS}s)"
TOKENS=${TOKENS:-1,2,8,32,64,256}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in $([ $((round % 2)) = 1 ] && echo "new base" || echo "base new"); do
    [ "$(left)" -lt "$([ "${AB_ONLY:-0}" = 1 ] && echo 60 || echo 300)" ] && break
    if [ "$tree" = new ]; then
      timeout 100 python3 profiling/bench_moe_gemm.py --variants auto,auto_qk --tokens "$TOKENS" --reps 10 \
        --out "$DIR/moe_tile_arrival_new$round.json" > "$DIR/bench_new$round.log" 2>&1
      echo "bench new $round exit $? (${SECONDS}s)"
      python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["shape"][6:9], r["tokens"], " ".join("%s=%.4f" % (k, x["nvfp4_ms"]) for k, x in sorted(r["variants"].items())))' \
        "$DIR/moe_tile_arrival_new$round.json"
    else
      bench_moe_tree base "$DIR" moe_tile_arrival "$round" "$TOKENS" 80 "$BASE"
    fi
  done
done
[ "${AB_ONLY:-0}" = 1 ] || moe_and_rl_checks "$DIR" 160 100
echo "== done ($(left)s left)"
