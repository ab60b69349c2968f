"""PCIe facts behind the guidance capture's copy pacing (docs/rollout.md): device-to-host bandwidth
into pinned memory, and whether a small device-to-host copy on one stream (a decode step's token
read-back) waits for a large one already queued on another stream (a guidance copy).

    python profiling/pcie_copy_probe.py --out profiling/results/pcie_copy_probe_h200.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from trace_kernels.testing.provenance import git_commit, utc_now


def d2h_gb_per_s(nbytes: int, reps: int = 5) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src, non_blocking=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return nbytes / statistics.median(times) / 1e9


def small_readback_ms(big_bytes: int, reps: int = 5) -> list[float]:
    """Host wall ms of a 4 KB device-to-host read-back (``.tolist()``-like, on the current stream)
    issued right after a big device-to-host copy was queued on a side stream (0: no big copy)."""
    side = torch.cuda.Stream()
    small = torch.arange(1024, dtype=torch.int32, device="cuda")
    big_src = torch.empty(max(big_bytes, 1), dtype=torch.uint8, device="cuda")
    big_dst = torch.empty(max(big_bytes, 1), dtype=torch.uint8, pin_memory=True)
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        if big_bytes:
            with torch.cuda.stream(side):
                big_dst.copy_(big_src, non_blocking=True)
        t0 = time.perf_counter()
        small.tolist()
        out.append(1e3 * (time.perf_counter() - t0))
        torch.cuda.synchronize()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    args = p.parse_args()
    result = {"device": torch.cuda.get_device_name(), "date": utc_now(), "commit": git_commit(),
              "command": "python profiling/pcie_copy_probe.py" + (f" --out {args.out}" if args.out else ""),
              "d2h_pinned_gb_per_s": {str(mb): d2h_gb_per_s(mb << 20) for mb in (4, 32, 256, 1024)},
              "readback_ms_behind_big_copy": {str(mb): small_readback_ms(mb << 20) for mb in (0, 4, 32, 256)}}
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
