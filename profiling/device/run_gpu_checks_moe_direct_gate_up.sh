#!/usr/bin/env bash
# Issue 4, one H200 call (fourteenth session, 2026-12-03): sweeps only (no code change; the direct tiles' kernels are
# the thirteenth session's, checked bitwise by the GPU tests at other prefetch distances).
#   (1) the fused gate_up (quantize_after) on direct tiles with registers capped, T = 8-64, both presets
#   (2) below 1/8 routed row per expert: both GEMMs on direct tiles many chunks ahead against auto's ws tiles
# Bands: profiling/device/moe_direct_gate_up_tiles.sh. Usage (repo root; carry .whl and .tkcache):
#   OUT=$OUT bash profiling/device/run_gpu_checks_moe_direct_gate_up.sh
set -uo pipefail
OUT=${OUT:-runs/moe_direct_gate_up}
BUDGET=${BUDGET:-400}
DIR="$OUT/moe_direct_gate_up"
mkdir -p "$DIR"
source profiling/device/gpu_env.sh "$DIR/setup.log"
tar_on_exit "$DIR"
log_machine "$DIR/machine.log"
source profiling/device/moe_direct_gate_up_tiles.sh
sweep_bands "$DIR" direct_t1 qwen3-30b-a3b "${BANDS_T1[@]}"
sweep_bands "$DIR" direct_t1 qwen3-235b-a22b "${BANDS_T1[@]}"
sweep_bands "$DIR" direct_gate_up qwen3-30b-a3b "${BANDS_30B[@]}"
sweep_bands "$DIR" direct_gate_up qwen3-235b-a22b "${BANDS_235B[@]}"
