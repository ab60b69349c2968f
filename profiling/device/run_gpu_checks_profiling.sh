#!/usr/bin/env bash
# Issue 8 on the H200 in one device call (< 10 min): (a) Nsight Compute through profiling/ncu.py on a
# small eager NVFP4 engine decode, filtered to the MoE GEMM ranges inside rollout/decode_step, and a
# check that the report holds exactly the gate_up + down kernels, as many as the decode steps launch,
# and nothing else (a second run without --within must also see the prefill's launches); (b)
# profiling/bench.py --quick. Table printed last.
# Usage (repo root; the device tool sets OUT; carry .whl for nvidia-cutlass + nvtx):
#   bash profiling/device/run_gpu_checks_profiling.sh
# Files in $OUT (the device tool returns at most 8): setup.log ncu.log decode_moe.ncu-rep decode_moe.csv
# bench.log bench_h200_quick.json plots.tar (4 PNG + table.md)
set -uo pipefail
OUT=${OUT:-runs/profiling}
BUDGET=${BUDGET:-570}  # seconds for the whole script
mkdir -p "$OUT"
source profiling/device/gpu_env.sh "$OUT/setup.log"  # wheels, PYTHONPATH, JIT cache, left()
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  python3 -c "import torch, sys, nvtx; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
  ncu --version | tail -1; } >> "$OUT/setup.log" 2>&1

echo "== prebuild ($(left)s left)"
# (shape:tokens per MoE call): the decode case (tiny-kernels) and bench --quick (MoE, rollout bench preset)
timeout 150 python3 profiling/prebuild_engine_kernels.py "E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64:1,4,32" \
  qwen3-30b-a3b:1,2,64,1024,4096,16384 >> "$OUT/setup.log" 2>&1
echo "prebuild exit $?"; grep -E "FAILED|built|Error" "$OUT/setup.log" | tail -5

echo "== ncu: MoE GEMM ranges inside rollout/decode_step ($(left)s left)"
timeout 100 python3 profiling/ncu.py --ranges 'trace_kernels/moe_gemm_*' --within rollout/decode_step \
  --out-dir "$OUT" --name decode_moe -- python3 profiling/ncu.py decode-case --new-tokens 4 > "$OUT/ncu.log" 2>&1
echo "ncu (decode only) exit $?" | tee -a "$OUT/ncu.log"
echo "== ncu: the same ranges in every phase (control) ($(left)s left)"
timeout 80 python3 profiling/ncu.py --ranges 'trace_kernels/moe_gemm_*' --out-dir /tmp/ncu_all --name all_moe \
  -- python3 profiling/ncu.py decode-case --new-tokens 4 > /tmp/ncu_all.log 2>&1
echo "ncu (all phases) exit $?" | tee -a "$OUT/ncu.log"; tail -6 /tmp/ncu_all.log >> "$OUT/ncu.log"
python3 - "$OUT" << 'EOF' 2>&1 | tee -a "$OUT/ncu.log"
import re, sys
from pathlib import Path
sys.path.insert(0, "profiling")
import ncu
out = Path(sys.argv[1])

def launches(csv_path):
    rows = ncu.parse_raw_csv(csv_path.read_text()) if csv_path.exists() else []
    return [ncu.kernel_base(r["Kernel Name"]) for r in rows]

m = re.search(r"expect (\d+) launches", (out / "ncu.log").read_text())
expect = int(m.group(1)) if m else None
names = launches(out / "decode_moe.csv")
allphases = launches(Path("/tmp/ncu_all/all_moe.csv"))
up = [n for n in names if n.startswith("moe_gemm_gate_up_swiglu")]
down = [n for n in names if n.startswith("moe_gemm_down_routed")]
other = sorted(set(names) - set(up) - set(down))
ok = bool(up) and bool(down) and not other and len(up) == len(down) == expect and len(allphases) > len(names)
print(f"decode-only report: {len(up)} gate_up + {len(down)} down launches (expected {expect} each), "
      f"other kernels: {other or 'none'}; all-phase control: {len(allphases)} launches")
print("kernel names:", sorted(set(names)))
print("NCU FILTER CHECK:", "PASS" if ok else "FAIL")
EOF
grep -A8 "^kernel " "$OUT/ncu.log" | head -8

echo "== bench.py --quick ($(left)s left)"
t=$(left)
timeout $(( t > 60 ? t - 20 : 40 )) python3 profiling/bench.py --quick --time-budget $(( t > 90 ? t - 90 : 10 )) \
  --out "$OUT/bench_h200_quick.json" --plots-dir /tmp/plots > "$OUT/bench.log" 2>&1
echo "bench exit $?"
tar -cf "$OUT/plots.tar" -C /tmp/plots . 2> /dev/null
grep -E "TFLOP|done in|skipped|failed" "$OUT/bench.log" | tail -8
echo "total ${SECONDS}s"
grep -E "NCU FILTER CHECK" "$OUT/ncu.log"
grep -v "groups=" /tmp/plots/table.md 2> /dev/null | head -40
