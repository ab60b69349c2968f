#!/usr/bin/env bash
# Issue 7's experiments on the H200 in one device call (< 10 min): the shared SFT warm start of the
# `small` preset, then the five arms (rl/configs/small_arm*.toml) and the README's GPU main job
# (rl/configs/default_gpu.toml, SFT in-line) side by side, each stopped at its step limit or at the
# time limit (metrics.jsonl holds every finished step); then, alone on the GPU, the TRACE step-time
# overhead runs (small_overhead_*.toml); then `trace-rl compare` of the arms.
# Usage (repo root; the device tool sets OUT; carry .whl, and .tkcache if prebuilt here):
#   bash profiling/device/run_rl_experiments_h200.sh
# Knobs: STEPS (RL steps per arm, 300), OVERHEAD_STEPS (40), BUDGET (seconds for the script, 570),
# ARMS (config names; ARMS= runs none), MAIN_JOB (1: the main job beside the arms),
# RUNS (run dirs, /tmp/rl_small), TRAIN_SET / SFT_SET (extra "--set k=v" for every train / the SFT;
# a CPU dry run of this script: TRAIN_SET="--set rollout.prompts_per_step=2" SFT_SET="--set sft.steps=2").
# $OUT gets setup.log, run.log (this script's console) and rl_h200.tar: every run's config.json and
# metrics.jsonl, the train logs and the compare plots + summary.json (checkpoints stay on the device).
set -uo pipefail
OUT=${OUT:-runs/rl_h200}
BUDGET=${BUDGET:-570}
STEPS=${STEPS:-300}
OVERHEAD_STEPS=${OVERHEAD_STEPS:-40}
RUNS=${RUNS:-/tmp/rl_small}
mkdir -p "$OUT" "$RUNS/logs"
source profiling/device/gpu_env.sh "$OUT/setup.log"  # wheels, PYTHONPATH, JIT cache, left()
export OMP_NUM_THREADS=2  # six trainers share 16 cores
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  git log -1 --format='commit %H' 2> /dev/null; } >> "$OUT/setup.log" 2>&1
ARMS=${ARMS-small_arm1_bf16_bf16 small_arm2_nvfp4_bf16 small_arm3_nvfp4_qat small_arm4_nvfp4_trace small_arm5_nvfp4_trace_replay}
MAIN_JOB=${MAIN_JOB:-1}  # 0: no main-job run beside the arms
JOBS="$ARMS"; [ "$MAIN_JOB" = 1 ] && JOBS="$JOBS main_job_default_gpu"
train() {  # LIMIT_S CONFIG RUN_DIR STEPS [--set ...]: one trace-rl train, its log in $RUNS/logs
  local limit=$1 cfg=$2 dir=$3 steps=$4; shift 4
  timeout "$limit" python3 -m trace_rl.cli train --config "rl/configs/$cfg.toml" --out "$RUNS/$dir" --no-progress \
    --set "run.steps=$steps" "$@" ${TRAIN_SET:-} > "$RUNS/logs/$dir.log" 2>&1
}
steps_done() { [ -f "$RUNS/$1/metrics.jsonl" ] && wc -l < "$RUNS/$1/metrics.jsonl" || echo 0; }
pack() {
  tar -cf "$OUT/rl_h200.tar" -C "$RUNS" logs $(cd "$RUNS" && ls -d */metrics.jsonl */config.json plots 2> /dev/null)
}
trap pack EXIT

echo "== prebuild ($(left)s left)"
# decode rows (256 sequences), prefill (256 x ~10 prompt tokens), the engine tests' counts
timeout 150 python3 profiling/prebuild_engine_kernels.py "E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64:1,8,256,2560" \
  >> "$OUT/setup.log" 2>&1
echo "prebuild exit $?"; grep -E "FAILED|built" "$OUT/setup.log" | tail -4

echo "== trainer GPU tests ($(left)s left)"
timeout 60 python3 -m pytest tests/rl/test_trainer_quantizers.py -m gpu -q -p no:cacheprovider \
  > "$RUNS/logs/trainer_gpu_tests.log" 2>&1
echo "pytest exit $?"; tail -2 "$RUNS/logs/trainer_gpu_tests.log"

echo "== SFT warm start ($(left)s left)"
t0=$SECONDS
timeout 150 python3 -m trace_rl.cli sft --config rl/configs/small_sft.toml --out "$RUNS/sft" --no-progress \
  ${SFT_SET:-} > "$RUNS/logs/sft.log" 2>&1
echo "sft exit $? in $((SECONDS - t0))s"; tail -2 "$RUNS/logs/sft.log"

if [ -n "$JOBS" ]; then
  echo "== arms + main job in parallel: $JOBS ($(left)s left)"
  arms_limit=$(( $(left) - 150 ))  # leave time for the overhead runs and the plots
  for arm in $ARMS; do
    train "$arms_limit" "$arm" "$arm" "$STEPS" --set "model.init=$RUNS/sft" &
  done
  [ "$MAIN_JOB" = 1 ] && train "$arms_limit" default_gpu main_job_default_gpu "$STEPS" &
  sleep 90
  for arm in $JOBS; do echo "$arm: $(steps_done "$arm") steps after 90 s"; done
  wait
  for arm in $JOBS; do
    echo "$arm: $(steps_done "$arm") steps"; grep -E "Error|error:" "$RUNS/logs/$arm.log" | tail -2
  done
fi

echo "== TRACE overhead runs, alone on the GPU ($(left)s left)"
for spec in "small_overhead_nvfp4_qat overhead_nvfp4" "small_overhead_trace_compact overhead_trace" \
            "small_overhead_trace_compact overhead_trace_file_roundtrip --set run.guidance_io=roundtrip" \
            "small_overhead_trace_compact overhead_trace_reference_rounding --set trainer.guided_rounding=reference"; do
  set -- $spec
  t=$(( $(left) - 25 )); [ "$t" -lt 20 ] && { echo "skipped $2: ${t}s left"; continue; }
  train "$t" "$1" "$2" "$OVERHEAD_STEPS" --set "model.init=$RUNS/sft" "${@:3}"
  echo "$2: exit $?, $(steps_done "$2") steps"
done
python3 - "$RUNS" << 'EOF'
import json, statistics, sys
from pathlib import Path
runs = Path(sys.argv[1])
def med(name, keys):
    path = runs / name / "metrics.jsonl"
    recs = [json.loads(l) for l in path.read_text().splitlines()][5:] if path.exists() else []
    return statistics.median(sum(r[k] for k in keys) for r in recs) if recs else float("nan")
phases = {"rollout": ["seconds_rollout"], "guidance io": ["seconds_guidance_io"],
          "rollout side": ["seconds_rollout", "seconds_guidance_io"], "train": ["seconds_train"],
          "step": ["seconds_rollout", "seconds_guidance_io", "seconds_train", "seconds_refit"]}
for label, keys in phases.items():
    base = med("overhead_nvfp4", keys)
    for name in ("overhead_trace", "overhead_trace_file_roundtrip", "overhead_trace_reference_rounding"):
        v = med(name, keys)
        rel = f"{100 * (v / base - 1):+.1f}%" if base > 1e-6 else "-"
        print(f"{label:12s} {name:34s} median {v:.4f} s vs {base:.4f} s: {rel}")
EOF

if [ -n "$ARMS" ]; then
  echo "== compare ($(left)s left)"
  python3 -m trace_rl.cli compare $(for a in $ARMS; do echo "$RUNS/$a"; done) --out "$RUNS/plots" 2>&1 | tail -3
  python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])), indent=1)[:3000])" "$RUNS/plots/summary.json"
fi
echo "total ${SECONDS}s"
