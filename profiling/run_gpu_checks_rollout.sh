#!/usr/bin/env bash
# Issue 6 (rollout engine on the kernels) on the H200 in one go, under 10 minutes: install the
# carried wheels, prebuild the kernels the engine launches (tiny-kernels, small and bench shapes)
# in parallel, the engine's GPU tests, bench_rollout --quick, then compute-sanitizer memcheck on a
# small engine test with the time that is left. Logs + JSON go to ${OUT:-runs/rollout}.
# Usage (repo root; the device tool sets OUT):
#   bash profiling/run_gpu_checks_rollout.sh
set -uo pipefail
OUT=${OUT:-runs/rollout}
BUDGET=${BUDGET:-570}  # seconds for the whole script
mkdir -p "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then  # nvidia-cutlass (headers) and nvtx, like the other runs
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl > "$OUT/pip.log" 2>&1 || echo "wheel install failed (see pip.log)"
  export PYTHONPATH=/tmp/site:$PWD/python:$PWD/rl${PYTHONPATH:+:$PYTHONPATH}
else
  export PYTHONPATH=$PWD/python:$PWD/rl${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
export TRACE_KERNELS_CACHE_DIR=${TRACE_KERNELS_CACHE_DIR:-$PWD/.tkcache}
left() { echo $(( BUDGET - SECONDS )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())" \
  >> "$OUT/gpu.txt" 2>&1
python3 -c "import safetensors" 2> /dev/null || echo "safetensors missing: the guidance-store GPU test will skip" | tee -a "$OUT/gpu.txt"

echo "== prebuild ($(left)s left)"
timeout 150 python3 - > "$OUT/build.log" 2>&1 << 'EOF'
import time
from trace_kernels import jit, shapes
from trace_kernels.codegen.ops import moe_gemm as mg, quantize as q, refit_weights as rw
t = time.time()
specs = {}
# (shape, token counts the tests and the quick bench route per MoE call): only the tiles they use
for name, tokens in (("E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64", (1, 8, 40)),      # tiny-kernels
                     ("E=32,H=512,I=256,k=4,hq=8,hkv=2,hd=64", (1, 8, 40)),   # small
                     ("qwen3-30b-a3b", (2, 64, 16384))):                       # bench
    shape = shapes.resolve(name)
    tiles = {mg.tile_for_rows(t * shape.top_k, shape.experts) for t in tokens}
    ss = [mg.gemm_spec(shape, kind, tile) for kind in ("gate_up_swiglu", "down_routed") for tile in tiles]
    ss += [mg.combine_spec(shape), *q.specs_for_shape(shape), *rw.specs_for_shape(shape)]
    try:  # the paged-KV kernels (issue 5), if present
        from trace_kernels.codegen.ops import decode_attention as da, kv_append as ka
        ss += [*ka.specs_for_shape(shape), *da.specs_for_shape(shape)]
    except Exception as e:
        print("no paged-KV kernel specs:", e)
    specs.update((s.name, s) for s in ss)
entries = jit.build_all(list(specs.values()), jobs=16, keep_going=True)
for name, e in zip(specs, entries):
    print(name, "FAILED: " + str(e)[:400] if isinstance(e, BaseException) else "ok")
print(f"built/verified {len(specs)} kernels in {time.time() - t:.1f}s")
EOF
echo "prebuild exit $?"; grep -E "FAILED|built" "$OUT/build.log" | tail -8

echo "== GPU tests ($(left)s left)"
timeout 200 python3 -m pytest tests/rl/test_engine_gpu.py tests/rl/test_engine.py -m gpu -q -rfE -p no:cacheprovider \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest exit $?"; tail -25 "$OUT/gpu_tests.log"

echo "== bench_rollout --quick ($(left)s left)"
timeout $(( $(left) > 60 ? $(left) - 45 : 15 )) python3 profiling/bench_rollout.py --quick \
  --out "$OUT/rollout_h200_quick.json" > "$OUT/bench.log" 2>&1
echo "bench exit $?"; tail -14 "$OUT/bench.log"

t=$(left)
if [ "$t" -lt 25 ]; then
  echo "memcheck skipped: ${t}s left" | tee "$OUT/sanitizer_memcheck.log"
else
  echo "== memcheck (${t}s)"
  timeout "$t" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --print-limit 20 \
    python3 -m pytest tests/rl/test_engine_gpu.py -q -p no:cacheprovider \
    -k "tiny-kernels and graph_replay_equals_eager and nvfp4" \
    > "$OUT/sanitizer_memcheck.log" 2>&1
  echo "memcheck exit: $? (limit ${t}s)" | tee -a "$OUT/sanitizer_memcheck.log"
  grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer_memcheck.log" | tail -3
fi
echo "total ${SECONDS}s"
