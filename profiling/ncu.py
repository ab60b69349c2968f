"""Nsight Compute on any project command, filtered to our NVTX ranges.

    python profiling/ncu.py --ranges 'trace_kernels/moe_gemm_*' --within rollout/decode_step \
        --out-dir runs/ncu --name decode_moe -- python profiling/ncu.py decode-case
    python profiling/ncu.py --import runs/ncu/decode_moe.ncu-rep        # summary of a saved report
    python profiling/ncu.py ... --dry-run                               # print the ncu command only

Ranges and domains: kernel launches sit in `trace_kernels/<op>` (domain `trace_kernels`), the rollout
engine's phases in `rollout/<phase>` (domain `trace_rl`). A filter is one `--nvtx-include` per kernel
range in ncu's regex form `regex:<domain>@<regex>/` (the trailing `/` marks a push/pop range; the `/`
inside our names is matched by `.` so it cannot be read as ncu's nesting separator; `*` in a range
is a wildcard). NVTX push/pop stacks are per domain, so "inside rollout/decode_step" cannot be spelt as
one nested path across the two domains: `--within` keeps the kernel ranges as includes and adds an
`--nvtx-exclude` for every other engine phase (prefill, refit, guidance_*), which leaves the kernels
of decode steps. Kernels replayed from a CUDA graph carry the NVTX state of the graph launch, not of
the capture: profile engines with cuda_graphs off (decode-case does).

Always `--clock-control none` (the lent H200's clocks stay as found). The metrics read (exact ncu
names) are METRICS below; metrics this ncu does not know are dropped with a warning, not fatal.
Writes <out-dir>/<name>.ncu-rep, <name>.csv (one row per profiled kernel, raw page) and prints a
per-kernel summary (count, median of each metric).
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

# (exact ncu metric name, what it answers)
METRICS = (
    ("gpu__time_duration.sum", "kernel time"),
    ("dram__bytes_read.sum", "DRAM bytes read"),
    ("dram__bytes_write.sum", "DRAM bytes written"),
    ("dram__bytes.sum.per_second", "achieved DRAM bandwidth"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM throughput, % of peak"),
    # tensor pipe: all MMA kinds (wgmma included), the mma.sync share, wgmma count, BF16 tensor math
    # (the names the H200's ncu lists; ncu has no wgmma-only utilisation metric)
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe utilisation (all MMA kinds)"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe (mma.sync) utilisation"),
    ("sm__inst_executed_pipe_tensor_op_gmma.sum", "wgmma instructions executed"),
    ("sm__ops_path_tensor_src_bf16_dst_fp32.sum", "BF16->FP32 tensor math ops (2 per FMA)"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM throughput, % of peak"),
    ("launch__registers_per_thread", "registers per thread"),
    ("launch__shared_mem_per_block_dynamic", "dynamic shared memory per block"),
    ("launch__occupancy_limit_registers", "blocks per SM allowed by registers"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "achieved occupancy"),
    ("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "local-memory (spill) bytes loaded"),
    ("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum", "local-memory (spill) bytes stored"),
)

# engine phases (domain trace_rl); --within one of them excludes the others
ENGINE_PHASES = ("rollout/prefill", "rollout/decode_step", "rollout/refit", "rollout/guidance_finalize",
                 "rollout/guidance_write", "rollout/guidance_read")
DOMAINS = {"trace_kernels/": "trace_kernels", "rollout/": "trace_rl"}


def domain_of(range_name: str) -> str:
    for prefix, domain in DOMAINS.items():
        if range_name.startswith(prefix):
            return domain
    raise ValueError(f"unknown NVTX range {range_name!r}: ours start with {', '.join(DOMAINS)}")


def nvtx_filter(range_name: str) -> str:
    """ncu --nvtx-include/--nvtx-exclude value matching the push/pop range `range_name` in its domain."""
    pattern = ".*".join(re.escape(part).replace("/", ".") for part in range_name.split("*"))
    return f"regex:{domain_of(range_name)}@{pattern}/"


def filter_args(ranges: list[str], within: str | None) -> list[str]:
    if not ranges:
        raise ValueError("give at least one kernel range (--ranges)")
    args = ["--nvtx"]
    for r in ranges:
        args += ["--nvtx-include", nvtx_filter(r)]
    if within:
        if within not in ENGINE_PHASES:
            raise ValueError(f"--within must be one of {', '.join(ENGINE_PHASES)}, got {within!r}")
        for phase in ENGINE_PHASES:
            if phase != within:
                args += ["--nvtx-exclude", nvtx_filter(phase)]
    return args


def ncu_command(target: list[str], ranges: list[str], within: str | None, report: Path, metrics: list[str],
                launch_count: int | None = None, ncu: str = "ncu") -> list[str]:
    if not target:
        raise ValueError("no command to profile: put it after `--`")
    cmd = [ncu, "--clock-control", "none", "--target-processes", "all", *filter_args(ranges, within),
           "--metrics", ",".join(metrics), "--export", str(report), "--force-overwrite"]
    if launch_count:
        cmd += ["--launch-count", str(launch_count)]
    return cmd + list(target)


def known_metrics(ncu: str) -> set[str] | None:
    """Base metric names this ncu knows on this GPU (None when it cannot say)."""
    try:
        text = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = {line.split()[0] for line in text.splitlines() if line and "__" in line.split()[0]}
    return names or None


def usable_metrics(ncu: str) -> list[str]:
    known = known_metrics(ncu)
    wanted = [m for m, _ in METRICS]
    if known is None:
        return wanted
    # launch__* and gpu__time_duration are launch/timing facts, not always listed as counters
    kept = [m for m in wanted if m.startswith(("launch__", "gpu__")) or m.split(".")[0] in known]
    for m in wanted:
        if m not in kept:
            print(f"ncu.py: this ncu does not know {m}; not collected", file=sys.stderr)
    return kept


def parse_raw_csv(text: str) -> list[dict]:
    """Rows of `ncu --import R --csv --page raw` (a header row, a units row, one row per kernel)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]  # drop ==PROF== chatter
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    return [r for r in rows if r.get("ID", "").strip().isdigit()]


def as_float(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def kernel_base(name: str) -> str:
    return re.sub(r"\(.*", "", name).strip()


def summarize(rows: list[dict], metrics: list[str]) -> list[dict]:
    """Per kernel name: launches and the median of each metric."""
    out = {}
    for r in rows:
        k = kernel_base(r.get("Kernel Name", "?"))
        out.setdefault(k, []).append(r)
    summary = []
    for k, rs in out.items():
        entry = {"kernel": k, "launches": len(rs)}
        for m in metrics:
            values = [v for v in (as_float(r.get(m, "")) for r in rs) if v is not None]
            if values:
                entry[m] = statistics.median(values)
        summary.append(entry)
    return summary


def import_report(report: Path, ncu: str = "ncu") -> list[dict]:
    proc = subprocess.run([ncu, "--import", str(report), "--csv", "--page", "raw"], capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"ncu --import failed: {proc.stderr[-500:]}")
    report.with_suffix(".csv").write_text(proc.stdout)
    return parse_raw_csv(proc.stdout)


def print_summary(summary: list[dict], metrics: list[str]) -> None:
    short = {m: m.split("__")[1].split(".")[0][:22] for m in metrics}
    print(f"{'kernel':60s} {'n':>4s} " + " ".join(f"{short[m]:>22s}" for m in metrics))
    for e in summary:
        print(f"{e['kernel'][:60]:60s} {e['launches']:4d} "
              + " ".join(f"{e[m]:22.4g}" if m in e else f"{'-':>22s}" for m in metrics))


def decode_case(argv: list[str]) -> int:
    """A small eager NVFP4 decode on the kernels backend (the profiling target of the GPU check)."""
    p = argparse.ArgumentParser(prog="ncu.py decode-case")
    p.add_argument("--preset", default="tiny-kernels")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=3, help="tokens per sequence: 1 from prefill, the rest decode")
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default="kernels", help="engine backend (kernels: the project's CUDA kernels)")
    args = p.parse_args(argv)
    import torch
    from trace_rl.config import load_preset
    from trace_rl.engine import EngineConfig, RolloutEngine, SamplingParams
    from trace_rl.model import MoEForCausalLM
    model = MoEForCausalLM(load_preset(args.preset)).init_weights(seed=0).to(args.device, torch.bfloat16)
    cfg = EngineConfig(block_size=16, max_model_len=64, max_num_seqs=args.batch, cuda_graphs=False,
                       backend=args.backend)
    engine = RolloutEngine(model, cfg, mode="nvfp4", capture="off", device=args.device)
    prompts = torch.randint(3, model.config.vocab_size, (args.batch, 8), generator=torch.Generator().manual_seed(0))
    out = engine.generate(prompts.tolist(), SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True), seed=0)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    layers = model.config.num_hidden_layers
    print(f"decode-case: backend {engine.backend}, {layers} layers, {out.stats['decode_steps']} decode steps "
          f"-> expect {out.stats['decode_steps'] * layers} launches each of gate_up and down inside decode steps")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["decode-case"]:
        return decode_case(argv[1:])
    target = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranges", default="trace_kernels/moe_gemm_*",
                   help="comma-separated kernel ranges (trace_kernels/<op>, '*' wildcard)")
    p.add_argument("--within", default=None, help=f"only kernels inside this engine phase ({', '.join(ENGINE_PHASES)})")
    p.add_argument("--out-dir", default="runs/ncu")
    p.add_argument("--name", default="report")
    p.add_argument("--launch-count", type=int, default=None, help="stop after this many profiled kernels")
    p.add_argument("--ncu", default=shutil.which("ncu") or "ncu")
    p.add_argument("--import", dest="import_report", default=None, help="summarize an existing .ncu-rep")
    p.add_argument("--dry-run", action="store_true", help="print the ncu command and exit")
    args = p.parse_args(own)
    metrics = [m for m, _ in METRICS]
    if args.import_report:
        rows = import_report(Path(args.import_report), args.ncu)
        print_summary(summarize(rows, metrics), metrics)
        return 0
    out_dir = Path(args.out_dir)
    report = out_dir / f"{args.name}.ncu-rep"
    ranges = [r for r in args.ranges.split(",") if r]
    if not args.dry_run:
        metrics = usable_metrics(args.ncu)
    cmd = ncu_command(target, ranges, args.within, report, metrics, args.launch_count, args.ncu)
    print(" ".join(f"'{c}'" if any(ch in c for ch in " *|()$") else c for c in cmd), flush=True)
    if args.dry_run:
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    rc = subprocess.run(cmd).returncode
    if rc:
        print(f"ncu exited {rc}", file=sys.stderr)
        return rc
    rows = import_report(report, args.ncu)
    print_summary(summarize(rows, metrics), metrics)
    print(f"wrote {report} and {report.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
