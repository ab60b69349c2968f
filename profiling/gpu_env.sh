# Sourced (not run) by the run_gpu_checks_*.sh scripts, from the repo root: installs the carried
# wheels in .whl/ (nvidia-cutlass for its headers, nvtx: without it no NVTX ranges exist) into
# /tmp/site, puts them, python/ and rl/ on PYTHONPATH, keeps the JIT cache in the tree and defines
# left(): the seconds of BUDGET still left.
# Usage: source profiling/gpu_env.sh LOGFILE   (LOGFILE gets pip's output)
gpu_env_log=${1:?usage: source profiling/gpu_env.sh LOGFILE}
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
