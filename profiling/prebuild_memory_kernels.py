"""Compile every memory-bound kernel the GPU tests and bench_memory_kernels.py launch, plus the
kv_append kernels of the kv tests and bench_attention.py --append-only, in parallel; print failures,
the ptxas line (registers, spills) of the kernels whose names start with a given prefix, and a total.

Usage: prebuild_memory_kernels.py [--jobs N] [NAME_PREFIX ...]   (exit 1 if any kernel failed)
"""

import sys
import time

from bench_attention import APPEND_VARIANTS  # profiling/ is the script's folder
from trace_kernels import jit, kv_testing
from trace_kernels.codegen.ops import kv_append
from trace_kernels.testing.kernel_sets import memory_kernel_specs


def main(argv: list[str]) -> int:
    jobs = 16
    if argv[:1] == ["--jobs"]:
        jobs, argv = int(argv[1]), argv[2:]
    t = time.time()
    specs = memory_kernel_specs() + [s for s in kv_testing.kernel_specs() if s.op == "kv_append"]
    specs += [kv_append.spec("nvfp4", 4, 128, v) for v in APPEND_VARIANTS]  # what bench_attention times
    specs.append(kv_append.spec("bf16", 4, 128))
    entries = jit.build_all(specs, jobs=jobs, keep_going=True)
    bad = [(s.name, str(e)[-600:]) for s, e in zip(specs, entries) if isinstance(e, Exception)]
    for name, error in bad:
        print("FAILED", name, error)
    for s, e in zip(specs, entries):
        if not isinstance(e, Exception) and any(s.name.startswith(p) for p in argv):
            print(s.name, (e.folder / "ptxas.txt").read_text().strip().splitlines()[-2][14:])
    print(f"built/verified {len(specs) - len(bad)} of {len(specs)} kernels in {time.time() - t:.1f}s")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
