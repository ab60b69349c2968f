#!/usr/bin/env bash
# One H200 call (<= BUDGET s, every step under `timeout`):
#   (1) the GPU tests of every op whose status-word bit moved to status.cuh's StatusOp on 2026-12-02
#       (c91d057: compile-checked only until now): the quantize / guided / refit non-finite flags, the
#       fused MoE gate_up's, refit_weights_packed_'s (its whole file), and the tiny MoE layer's ws tests
#   (2) issue 4: the down GEMM's prefill tilings, v1 (the table's TN=128, also at 1 CTA/SM) against ws
#       (1 CTA/SM, m_tiles 1 and 2), on qwen3-30b-a3b and qwen3-235b-a22b at T = 1024, 4096, 16384
#       (sweep_moe_gemm_tiles.py --kinds down_routed; L2 flushed, CUDA graphs, same routing per T)
# Everything goes to $OUT/st/, tarred to $OUT/st.tar at the end.
# Usage (repo root, carry .whl and .tkcache): OUT=$OUT bash profiling/device/run_gpu_checks_status_down_tiles.sh
set -uo pipefail
OUT=${OUT:-runs/status_down_tiles}
BUDGET=${BUDGET:-540}
A="$OUT/st"
mkdir -p "$A"
source profiling/device/gpu_env.sh "$A/setup.log"
tar_on_exit "$A"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv >> "$A/setup.log" 2>&1

# (1) (-k applies to both files: refit_packed's non-finite test among them)
gpu_tests 150 "$A/gpu_tests_status.log" tests/gpu/test_quantize_kernels.py tests/gpu/test_refit_packed.py -k "nonfinite"
gpu_tests 120 "$A/gpu_tests_moe.log" tests/gpu/test_moe_gemm.py -k "nonfinite or few_persistent or bad_inputs or extreme_rows"

# (2)
for shape in qwen3-30b-a3b qwen3-235b-a22b; do
  for grid in "--variant v1 --min-blocks 1,2 --m-tiles 1" "--variant ws --min-blocks 1 --m-tiles 1,2"; do
    tag="$shape-$(echo "$grid" | cut -d' ' -f2)"
    limit=$(( $(left) - 10 ))
    if [ "$limit" -lt 30 ]; then echo "sweep $tag: skipped, $(left)s left" | tee -a "$A/setup.log"; continue; fi
    timeout "$limit" python3 profiling/sweep_moe_gemm_tiles.py --shape "$shape" --tokens 1024,4096,16384 --kinds down_routed \
      --tile-tokens 128 --stages 4 --warpgroups 2 --overlap 0 $grid --reps 10 \
      --out "$A/moe_down_tiles_${tag}.json" > "$A/sweep_${tag}.log" 2>&1
    echo "sweep $tag exit: $? (${SECONDS}s)" | tee -a "$A/sweep_${tag}.log"; grep -E "^T=" "$A/sweep_${tag}.log" | grep -v best
  done
done
