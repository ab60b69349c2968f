#!/usr/bin/env bash
# Nsight Systems timeline of any project command with our NVTX ranges (CUDA, NVTX and OS-runtime
# trace; graph replays traced per kernel node), then the NVTX-range and kernel summaries as CSV.
#   bash profiling/nsys.sh OUT_DIR NAME -- python3 profiling/bench_rollout.py --quick
# NSYS_CAPTURE='rollout/decode_step@trace_rl' records only inside that range (nsys spells range@domain,
# the reverse of ncu's domain@range); NSYS=path picks the binary.
# Not on the lent H200: nsys is not on its PATH, and the copy inside Nsight Compute wrote a .qdstrm
# but could not turn it into a report (.library/device/KINDS.md, 2026-11-04). The script stops with
# a clear message there; use profiling/ncu.py on that machine. Not yet run anywhere by this project.
set -euo pipefail
OUT_DIR=${1:?usage: nsys.sh OUT_DIR NAME -- command...}; NAME=${2:?usage: nsys.sh OUT_DIR NAME -- command...}
shift 2
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "nsys.sh: no command to profile" >&2; exit 2; }
NSYS=${NSYS:-$(command -v nsys || true)}
if [ -z "$NSYS" ]; then
  echo "nsys.sh: nsys not found (not installed on the lent H200: use profiling/ncu.py there)" >&2; exit 3
fi
mkdir -p "$OUT_DIR"
capture=()
if [ -n "${NSYS_CAPTURE:-}" ]; then capture=(--capture-range=nvtx "--nvtx-capture=$NSYS_CAPTURE" --capture-range-end=repeat); fi
"$NSYS" profile --trace=cuda,nvtx,osrt --cuda-graph-trace=node --force-overwrite=true "${capture[@]}" \
  -o "$OUT_DIR/$NAME" "$@"
if [ ! -f "$OUT_DIR/$NAME.nsys-rep" ]; then
  echo "nsys.sh: nsys wrote no .nsys-rep (found: $(ls "$OUT_DIR/$NAME".* 2> /dev/null | tr '\n' ' '))" >&2; exit 4
fi
"$NSYS" stats --report nvtx_sum,cuda_gpu_kern_sum --format csv --output "$OUT_DIR/$NAME" "$OUT_DIR/$NAME.nsys-rep"
echo "wrote $OUT_DIR/$NAME.nsys-rep and $OUT_DIR/${NAME}_*.csv"
