# Sourced (not run) by the run_gpu_checks_*.sh scripts, from the repo root: installs the carried
# wheels in .whl/ (nvidia-cutlass for its headers, nvtx: without it no NVTX ranges exist) into
# /tmp/site, puts them, python/ and rl/ on PYTHONPATH, keeps the JIT cache in the tree and defines
# left(): the seconds of BUDGET still left.
# Usage: source profiling/device/gpu_env.sh LOGFILE   (LOGFILE gets pip's output)
#    or: source profiling/device/gpu_env.sh --call NAME [BUDGET] [CACHE]: a one-call script's whole start as well:
#        OUT (default runs/NAME), BUDGET (the caller's, else this default, else 560), DIR=$OUT/NAME created,
#        TRACE_KERNELS_CACHE_DIR (the caller's, else $PWD/CACHE, default .tkcache_moe), pip's output in DIR/setup.log,
#        DIR packed into $OUT/NAME.tar when the script ends (tar_on_exit) and the machine in DIR/machine.log
# REQUIRE_GPU=TEXT (either form): exit 3 at once, before anything is installed or written, unless the first GPU's name
#   contains TEXT. For a call whose numbers only one card can give (REQUIRE_GPU=H200): the device tool may lend another
#   (docs/profiling.md), and a call that stops here costs seconds, not the script's budget.
if [ -n "${REQUIRE_GPU:-}" ]; then
  gpu_env_card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$gpu_env_card" in
    *"$REQUIRE_GPU"*) ;;
    *) echo "REQUIRE_GPU=$REQUIRE_GPU: this machine's GPU is '${gpu_env_card:-none found}'; nothing run"; exit 3 ;;
  esac
fi
if [ "${1:-}" = --call ]; then
  gpu_env_call=${2:?usage: source profiling/device/gpu_env.sh --call NAME [BUDGET] [CACHE]}
  OUT=${OUT:-runs/$gpu_env_call}
  BUDGET=${BUDGET:-${3:-560}}
  DIR="$OUT/$gpu_env_call"
  mkdir -p "$DIR"
  export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/${4:-.tkcache_moe}}
  gpu_env_log="$DIR/setup.log"
else
  gpu_env_call=""
  gpu_env_log=${1:?usage: source profiling/device/gpu_env.sh LOGFILE}
fi
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl > "$gpu_env_log" 2>&1 || echo "wheel install failed (see $(basename "$gpu_env_log"))"
  export PYTHONPATH=/tmp/site:$PWD/python:$PWD/rl${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD/python:$PWD/rl${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache}
left() { echo $(( BUDGET - SECONDS )); }

# Helpers the run_gpu_checks_*.sh scripts share. Each runs one step under `timeout`, writes its whole
# output to LOG and prints a short summary (the device tool returns the last lines of stdout).

# tar_on_exit DIR: pack DIR into DIR.tar when the script ends (the device tool returns files, not
# folders) and print the script's total time.
tar_on_exit() {
  trap "echo \"total \${SECONDS}s\"; tar -cf '$1.tar' -C '$(dirname "$1")' '$(basename "$1")' && rm -rf '$1'" EXIT
}

# log_machine LOG: the GPU (name, driver, clocks) and the tree's commit and changes, appended to LOG (the
# device copy's git metadata is that of the session's start: the sources' digest names the tree,
# `python profiling/source_digest.py --find DIGEST` its commit).
log_machine() {
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv
    git log -1 --format='%H %s' 2>/dev/null; git status --short 2>/dev/null | head -20
    python3 -c 'from trace_kernels.testing.provenance import source_digest; print("sources", source_digest())'
  } >> "$1" 2>&1
}

# gpu_tests LIMIT LOG PYTEST_ARGS...: pytest, quiet, failures listed, no cache folder.
gpu_tests() {
  local limit=$1 log=$2; shift 2
  timeout "$limit" python3 -m pytest -q -rfE -p no:cacheprovider "$@" > "$log" 2>&1
  local rc=$?  # before any command substitution: "$(basename ...) exit $?" printed basename's status, 0
  echo "$(basename "$log" .log) exit $rc"; grep -E "^FAILED|^ERROR" "$log" | head -5; tail -1 "$log"
}

# sanitize TOOL LIMIT LOG CMD...: compute-sanitizer memcheck / racecheck on CMD. API errors are not
# reported: cuda.bindings' symbol lookups at module load return INVALID_VALUE by design.
sanitize() {
  local tool=$1 limit=$2 log=$3; shift 3
  timeout "$limit" compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 9 --print-limit 20 "$@" \
    > "$log" 2>&1
  echo "$tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|OK|FAIL" "$log" | tail -3
}

# ncu_report REP LIMIT KERNEL_REGEX CMD...: Nsight Compute (clocks not locked) on the first launch of
# a kernel matching KERNEL_REGEX; REP.txt has the section pages, REP.raw.csv every metric collected,
# REP.log the run's output. NCU_SOURCE=1 also samples warp stalls per SASS instruction (SourceCounters):
# REP.source.csv is the source page, and profiling/ncu_source_stalls.py prints where the warps wait.
NCU_SECTIONS="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis
  --section ComputeWorkloadAnalysis --section InstructionStats --section LaunchStats"
ncu_report() {
  local rep=$1 limit=$2 regex=$3; shift 3
  local src_sections=()
  [ "${NCU_SOURCE:-0}" = 1 ] && src_sections=(--section SourceCounters)
  # shellcheck disable=SC2086  # NCU_SECTIONS is a list of options
  timeout "$limit" ncu --clock-control none --target-processes all -k "regex:$regex" -c 1 $NCU_SECTIONS \
    "${src_sections[@]}" -o "$rep" "$@" > "$rep.log" 2>&1
  echo "ncu $(basename "$rep") exit: $? (limit ${limit}s, ${SECONDS}s)" | tee -a "$rep.log"
  [ -f "$rep.ncu-rep" ] || return 0
  timeout 6 ncu --import "$rep.ncu-rep" --page details > "$rep.txt" 2>&1
  timeout 6 ncu --import "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv" 2>&1
  if [ "${NCU_SOURCE:-0}" = 1 ]; then
    timeout 20 ncu --import "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.source.csv" 2>&1
    python3 profiling/ncu_source_stalls.py "$rep.source.csv" --top 25 --split-loop > "$rep.stalls.txt" 2>&1
    head -30 "$rep.stalls.txt"
  fi
  rm -f "$rep.ncu-rep"  # both exports hold what it does; it would only add bytes to bring back
  grep -E "Memory Throughput|DRAM Throughput|Duration|SM Frequency|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Registers Per|Block Limit|Eligible|Active Warps" \
    "$rep.txt" | head -20
}

# decode_sanitizers DIR: memcheck (half the time left, at most 70 s), then racecheck (what is left, at most 90 s) on
# mma4l's growing-score, CUDA-graph, bytes-past-the-end and GQA 5 / 12 KV GPU tests (20 tests; racecheck got through 20
# of 26 in 70 s on the H100 on 2026-12-05); logs DIR/sanitizer_{memcheck,racecheck}.log.
decode_sanitizers() {
  local dir=$1 limit
  local tests=(tests/gpu/test_kv_kernels.py -k "(test_decode_attention_growing_scores_and_special_rows or test_decode_attention_cuda_graph or past_the_end or (matches_reference and (10-2-128 or 24-2-64))) and mma4l")
  limit=$(( ($(left) - 4) / 2 )); [ "$limit" -gt 70 ] && limit=70
  sanitize memcheck "$limit" "$dir/sanitizer_memcheck.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${tests[@]}"
  limit=$(( $(left) - 3 )); [ "$limit" -gt 90 ] && limit=90
  sanitize racecheck "$limit" "$dir/sanitizer_racecheck.log" python3 -m pytest -q -p no:cacheprovider -m gpu "${tests[@]}"
}

# decode_ab NAME LIMIT DECODE_AB_ARGS...: profiling/decode_ab.py with those arguments (its --arm NAME=DIR arms and any
# options) and ROUNDS rounds (default 2), DIR/NAME.{json,log}; prints its registers, bitwise checks and errors, then the
# timed rounds on one line.
decode_ab() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 profiling/decode_ab.py "$@" --rounds "${ROUNDS:-2}" --out "$DIR/$name.json" \
    > "$DIR/$name.log" 2>&1
  echo "$name exit $? (${SECONDS}s)"; grep -E "registers|bitwise|reference|differ|Error" "$DIR/$name.log"
  grep -E "^round" "$DIR/$name.log" | tr -s ' ' | tr '\n' ';'; echo
}

# prebuild_engine_test_models LIMIT LOG: the rollout engine's kernels of the GPU tests' two models
# (rl/configs/models.toml's tiny-kernels and small) at every decode batch the tests use: prebuild_device_caches.py's
# engine set, into the cache the call uses.
prebuild_engine_test_models() {
  timeout "$1" python3 profiling/prebuild_device_caches.py --cache "$TRACE_KERNELS_CACHE_DIR" engine > "$2" 2>&1
}

# sweep_bands DIR PREFIX SHAPE BAND...: sweep_moe_gemm_tiles.py --tiles per band ("TOKENS|KINDS|TILES"), while more
# than 150 s are left; JSONs DIR/PREFIX_SHAPE_I.json, logs DIR/sweep_SHAPE_I.log, each band's best tiles printed.
sweep_bands() {
  local dir=$1 prefix=$2 shape=$3 i=0 band tokens kinds tiles; shift 3
  for band in "$@"; do
    IFS='|' read -r tokens kinds tiles <<< "$band"
    i=$((i + 1))
    [ "$(left)" -lt 150 ] && { echo "skip $shape band $i: $(left)s left"; continue; }
    timeout 120 python3 profiling/sweep_moe_gemm_tiles.py --shape "$shape" --tokens "$tokens" --kinds "$kinds" \
      --tiles "$tiles" --reps 10 --out "$dir/${prefix}_${shape}_$i.json" > "$dir/sweep_${shape}_$i.log" 2>&1
    echo "sweep $shape $i ($kinds) exit $? (${SECONDS}s)"; grep -E "best" "$dir/sweep_${shape}_$i.log" | cut -c1-260
  done
}

# layer_ab_rounds DIR ROUNDS LIMIT MIN_LEFT BENCH_ARGS...: ROUNDS runs of bench_moe_gemm.py BENCH_ARGS (every arm in
# one process; LIMIT s each) while more than MIN_LEFT s are left; JSONs DIR/layer_ab_R.json, logs DIR/layer_ab_R.log,
# one line per (shape, T) with each arm's layer ms.
layer_ab_rounds() {
  local dir=$1 rounds=$2 limit=$3 min_left=$4 round; shift 4
  for round in $(seq 1 "$rounds"); do
    [ "$(left)" -lt "$min_left" ] && break
    layer_ab_round "$dir" "$round" "$limit" "$@"
  done
}

# layer_ab_swapped DIR LIMIT MIN_LEFT VARIANTS BENCH_ARGS...: layer_ab_rounds' two rounds with --variants VARIANTS, the
# second with the arms in reverse order.
layer_ab_swapped() {
  local dir=$1 limit=$2 min_left=$3 variants=$4 round; shift 4
  for round in 1 2; do
    [ "$(left)" -lt "$min_left" ] && break
    layer_ab_round "$dir" "$round" "$limit" --variants "$variants" "$@"
    variants=$(tr ',' '\n' <<< "$variants" | tac | paste -sd,)
  done
}

# layer_ab_round DIR ROUND LIMIT BENCH_ARGS...: one run of bench_moe_gemm.py BENCH_ARGS --reps 10 (LIMIT s), JSON
# DIR/layer_ab_ROUND.json, log DIR/layer_ab_ROUND.log; one line per (shape, T) with each arm's layer ms, arms by name.
layer_ab_round() {
  local dir=$1 round=$2 limit=$3 rc; shift 3
  timeout "$limit" python3 profiling/bench_moe_gemm.py "$@" --reps 10 --out "$dir/layer_ab_$round.json" \
    > "$dir/layer_ab_$round.log" 2>&1
  rc=$?
  echo "layer A/B $round exit $rc (${SECONDS}s)"
  python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["shape"][6:9], r["tokens"], " ".join("%s=%.4f" % (k, x["nvfp4_ms"]) for k, x in sorted(r["variants"].items())))' \
    "$dir/layer_ab_$round.json"
}

# moe_sweep JSON LOG LIMIT SWEEP_ARGS...: sweep_moe_gemm_tiles.py SWEEP_ARGS --reps 10 (LIMIT s), its exit, then its timed
# rows with each tile in --tiles form (read from the log, so a sweep cut short still reports what it timed).
moe_sweep() {
  local json=$1 log=$2 limit=$3 rc; shift 3
  timeout "$limit" python3 profiling/sweep_moe_gemm_tiles.py "$@" --reps 10 --out "$json" > "$log" 2>&1
  rc=$?
  echo "$(basename "$log" .log) exit $rc (${SECONDS}s)"
  python3 profiling/sweep_moe_gemm_tiles.py --summarize "$log"
}

# moe_sweep_rounds DIR NAME RESERVE TILES SWEEP_ARGS...: moe_sweep twice (DIR/sweep_NAME_roundR.{json,log}, at most 60 s
# each, while more than RESERVE s would be left after it), TILES (';'-separated) in reverse order in the second round.
moe_sweep_rounds() {
  local dir=$1 name=$2 reserve=$3 tiles=$4 round limit; shift 4
  for round in 1 2; do
    limit=$(( $(left) - reserve )); [ "$limit" -gt 60 ] && limit=60
    if [ "$limit" -gt 15 ]; then
      moe_sweep "$dir/sweep_${name}_round$round.json" "$dir/sweep_${name}_round$round.log" "$limit" --tiles "$tiles" "$@"
    else
      echo "skip $name round $round: $(left)s left"
    fi
    tiles=$(tr ';' '\n' <<< "$tiles" | tac | paste -sd';')
  done
}

# moe_build_ab DIR TABLES: the MoE GPU tests' kernels (tiny and Qwen3-30B-A3B, 120 s) and Qwen3-235B-A22B's TABLES (a layer
# A/B's arms, e.g. auto,auto_dws; 90 s); logs DIR/build_tests.log, DIR/build_235b.log.
moe_build_ab() {
  moe_build 120 "$1/build_tests.log" tiny qwen3-30b-a3b
  moe_build 90 "$1/build_235b.log" --tables "$2" --no-extras qwen3-235b-a22b
}

# moe_layer_ab DIR ARMS TOKENS RESERVE: the common part of a MoE layer A/B call: the MoE GPU tests' and 235B ARMS' kernels
# (moe_build_ab), the layer A/B of ARMS at TOKENS (layer_ab_swapped: two rounds, arms swapped in the second), the MoE GPU
# tests (at most 150 s, leaving RESERVE s), then memcheck and racecheck on the tiny layer over every tiling (at most
# 50 s each; moe_sanitizers_left).
moe_layer_ab() {
  local dir=$1 arms=$2 tokens=$3 reserve=$4 limit
  moe_build_ab "$dir" "$arms"
  layer_ab_swapped "$dir" 120 130 "$arms" --tokens "$tokens"
  limit=$(( $(left) - reserve )); [ "$limit" -gt 150 ] && limit=150
  [ "$limit" -gt 30 ] && gpu_tests "$limit" "$dir/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
  moe_sanitizers_left "$dir" 50
}

# moe_build LIMIT LOG MOE_PREBUILD_ARGS...: moe_prebuild.py --jobs 16 (a check of the carried cache, or a build of what
# it lacks) under timeout, its status and last line printed.
moe_build() {
  local limit=$1 log=$2 rc; shift 2
  timeout "$limit" python3 profiling/moe_prebuild.py --jobs 16 "$@" > "$log" 2>&1
  rc=$?
  echo "$(basename "$log" .log) exit $rc (${SECONDS}s)"; tail -1 "$log"
}

# ncu_down_tile DIR LABEL TOKENS FIELDS: Nsight Compute (ncu_report, 60 s) on the 30B down GEMM at TOKENS with the
# extra tile TileConfig(FIELDS) (moe_gemm_ncu_case.py --extra); reports DIR/ncu_down_tTOKENS_LABEL.*.
ncu_down_tile() {
  local dir=$1 label=$2 tokens=$3 fields=$4 index name
  read -r index name < <(python3 -c "from trace_kernels import shapes
from trace_kernels.codegen.ops import moe_gemm as c
tile = c.TileConfig($fields)
print(c.EXTRA_TILES.index(tile), c.gemm_spec(shapes.preset('qwen3-30b-a3b'), 'down_routed', tile).name)")
  [ -n "$name" ] || { echo "ncu_down_tile $label: TileConfig($fields) is not an extra tile"; return 0; }
  ncu_report "$dir/ncu_down_t${tokens}_$label" 60 "$name" \
    python3 profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens "$tokens" --repeat 1 --extra="$index"
}

# moe_and_rl_checks DIR MOE_RESERVE RL_RESERVE: the MoE GPU tests (at most 120 s, leaving MOE_RESERVE s of BUDGET), the
# RL layer's GPU tests (at most 90 s, leaving RL_RESERVE s), then memcheck and racecheck on the tiny layer over every
# tiling (moe_sanitizers_left, at most 50 s each); each step only if it still gets more than 30 s.
moe_and_rl_checks() {
  local dir=$1 limit
  limit=$(( $(left) - $2 )); [ "$limit" -gt 120 ] && limit=120
  [ "$limit" -gt 30 ] && gpu_tests "$limit" "$dir/moe_gpu_tests.log" tests/gpu/test_moe_gemm.py
  limit=$(( $(left) - $3 )); [ "$limit" -gt 90 ] && limit=90
  [ "$limit" -gt 30 ] && gpu_tests "$limit" "$dir/rl_gpu_tests.log" -m gpu tests/rl
  moe_sanitizers_left "$dir" 50
}

# moe_sanitizers_left DIR MAX: moe_sanitizers with half the time left each (at most MAX s), if that is over 15 s.
moe_sanitizers_left() {
  local limit=$(( ($(left) - 5) / 2 ))
  [ "$limit" -gt "$2" ] && limit=$2
  [ "$limit" -gt 15 ] && moe_sanitizers "$1" "$limit"
}

# moe_sanitizers DIR LIMIT: memcheck and racecheck (LIMIT s each) on the tiny fused gate_up and down GPU
# tests over every tiling; logs DIR/sanitizer_{memcheck,racecheck}.log.
moe_sanitizers() {
  local dir=$1 limit=$2 tool
  for tool in memcheck racecheck; do
    sanitize "$tool" "$limit" "$dir/sanitizer_$tool.log" python3 -m pytest -q -p no:cacheprovider \
      tests/gpu/test_moe_gemm.py -k "(test_gate_up_fused_quantization_is_exact or test_down_combine) and tiny and 64"
  done
}

# bench_moe_tree TREE DIR NAME ROUND TOKENS LIMIT BASE: the layer benchmark (auto table, 10 reps) of this
# tree (TREE=new) or of BASE (TREE=base: a carried copy of an earlier commit's python/, cuda/, codegen/ and
# bench script, see run_gpu_checks_moe_decode_gather.sh); JSON DIR/NAME_TREE ROUND.json, log
# DIR/bench_TREE ROUND.log, one summary line (shape, T, ms, x BF16).
bench_moe_tree() {
  local tree=$1 dir=$2 name=$3 round=$4 tokens=$5 limit=$6 base=$7
  local out="$dir/${name}_${tree}${round}.json" log="$dir/bench_${tree}${round}.log"
  if [ "$tree" = new ]; then
    timeout "$limit" python3 profiling/bench_moe_gemm.py --variants auto --tokens "$tokens" --reps 10 --out "$out" \
      > "$log" 2>&1
  else
    PYTHONPATH=/tmp/site:$PWD/$base/python:$PWD/rl timeout "$limit" python3 "$base/profiling/bench_moe_gemm.py" \
      --variants auto --tokens "$tokens" --reps 10 --out "$out" > "$log" 2>&1
  fi
  echo "bench $tree $round exit $? (${SECONDS}s)"
  grep -E "^qwen3\S+ +[0-9]" "$log" | awk '{print $1, $2, $5, $8}' | tr '\n' ';'; echo
}

# moe_prebuild_trees DIR TABLES PRESETS BASE: the table kernels (moe_prebuild.py --tables TABLES --no-extras) of
# this tree and of BASE (a carried copy of an earlier commit's python/, cuda/, codegen/; see bench_moe_tree),
# 16 jobs each; logs DIR/build_{new,base}.log.
moe_prebuild_trees() {
  local dir=$1 tables=$2 presets=$3 base=$4 tree
  for tree in new base; do
    # shellcheck disable=SC2086  # PRESETS is a list
    if [ "$tree" = new ]; then
      timeout 120 python3 profiling/moe_prebuild.py --tables "$tables" --no-extras $presets > "$dir/build_new.log" 2>&1
    else
      PYTHONPATH=/tmp/site:$PWD/$base/python:$PWD/rl timeout 120 python3 profiling/moe_prebuild.py --tables "$tables" \
        --no-extras $presets > "$dir/build_base.log" 2>&1
    fi
    echo "$tree build exit $? (${SECONDS}s)"; tail -1 "$dir/build_$tree.log"
  done
}

# moe_tree_ab DIR NAME TOKENS LIMIT BASE MIN_LEFT: two rounds of the layer benchmark, this tree then BASE in
# each (bench_moe_tree, LIMIT s per run), while more than MIN_LEFT s of BUDGET are left.
moe_tree_ab() {
  local dir=$1 name=$2 tokens=$3 limit=$4 base=$5 min_left=$6 round tree
  for round in 1 2; do
    for tree in new base; do
      [ "$(left)" -lt "$min_left" ] && return 0
      bench_moe_tree "$tree" "$dir" "$name" "$round" "$tokens" "$limit" "$base"
    done
  done
}

if [ -n "$gpu_env_call" ]; then
  tar_on_exit "$DIR"
  log_machine "$DIR/machine.log"
fi
