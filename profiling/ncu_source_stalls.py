"""Where a kernel's warps stall, per SASS instruction, from Nsight Compute's source page.

    ncu --section SourceCounters -k regex:KERNEL -c 1 -o rep python ...
    ncu --import rep.ncu-rep --page source --print-source sass --csv > rep.source.csv
    python profiling/ncu_source_stalls.py rep.source.csv [--top 30] [--split-loop]

Prints the instructions with the most warp-stall samples (address, share of all samples, SASS, and the largest stall
reasons of each where the page has the stall_* columns) and the samples summed per opcode, so a profile says which
instruction a kernel waits at (a wgmma wait, a barrier, a shared-memory load) rather than only which stall reason
dominates. (Nsight Compute counts a warpgroup's wait for its own wgmmas, WARPGROUP.DEPBAR, as a "barrier" stall, like a
CTA barrier.) --split-loop also sums the samples of the instructions a CTA runs many times (the main loop) apart from
those it runs about once (prologue, epilogue). The sample column is the first whose name contains
"Sampling (All" unless --column names one (the source page's headers differ between Nsight Compute versions: with
no such column the script lists the headers and exits with status 2).
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter


def _number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_rows(path: str) -> tuple[list[str], list[dict[str, str]]]:
    """The CSV's header and rows. Lines before the header are skipped: ncu's "==PROF==" notes, and the
    '"Kernel Name","..."' line that Nsight Compute 2025 puts above the source page's header. The header is the
    first line with a "Source" column; with none, the first line."""
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("==")]
    start = next((i for i, fields in enumerate(csv.reader(lines)) if "Source" in fields), 0)
    reader = csv.DictReader(lines[start:])
    return list(reader.fieldnames or []), list(reader)


def stall_columns(row: dict[str, str]) -> list[tuple[str, float]]:
    """(reason, samples) of the row's 'stall_*' columns: all samples, not the '(Not Issued)' copies."""
    return [(k[len("stall_"):], _number(v)) for k, v in row.items() if k and k.startswith("stall_") and "(" not in k]


def stall_reasons(row: dict[str, str], top: int = 3) -> str:
    """The row's largest stall reasons: 'barrier 61, wait 9'."""
    reasons = sorted(((n, name) for name, n in stall_columns(row)), reverse=True)
    return ", ".join(f"{name} {n:.0f}" for n, name in reasons[:top] if n > 0)


def pick_column(header: list[str], wanted: str | None, needle: str = "Sampling (All") -> str | None:
    if wanted:
        return wanted if wanted in header else None
    return next((h for h in header if needle in h), None)


def opcode(sass: str) -> str:
    """'@!P0 HGMMA.64x128x16.F32.BF16 R24, ...' -> 'HGMMA' (predicate and modifiers dropped)."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def summarize(rows: list[dict[str, str]], column: str, source: str, address: str | None, top: int) -> list[str]:
    samples = [(_number(r.get(column, "")), r) for r in rows]
    total = sum(s for s, _ in samples) or 1.0
    out = [f"{total:.0f} samples in {column!r}; top {top} instructions:"]
    for s, r in sorted(samples, key=lambda p: -p[0])[:top]:
        where = r.get(address, "") if address else ""
        reasons = stall_reasons(r)
        out.append(f"{100 * s / total:6.2f}%  {where:>8s}  {r.get(source, '').strip()}" +
                   (f"  [{reasons}]" if reasons else ""))
    per_op: Counter[str] = Counter()
    for s, r in samples:
        per_op[opcode(r.get(source, ""))] += s
    out.append("per opcode: " + ", ".join(f"{op} {100 * s / total:.1f}%" for op, s in per_op.most_common(12)))
    return out


def split_by_repeats(rows: list[dict[str, str]], column: str, source: str, factor: float = 1.5) -> list[str]:
    """Samples and stall reasons of the instructions a CTA runs many times (executed more than `factor` times as
    often as the kernel's first instruction: the main loop) against those it runs about once (prologue, epilogue,
    and rarely taken paths), so a profile says how much of the warps' time each CTA's fixed costs take."""
    executed = "Instructions Executed"
    if not rows or executed not in rows[0]:
        return [f"no {executed!r} column: no split"]
    entry = _number(rows[0][executed]) or 1.0
    total = sum(_number(r.get(column, "")) for r in rows) or 1.0
    out = [f"split at {factor} x the first instruction's {entry:.0f} executions:"]
    for name, keep in (("repeated (main loop)", lambda n: n > factor * entry),
                       ("about once per CTA", lambda n: n <= factor * entry)):
        part = [r for r in rows if keep(_number(r[executed]))]
        reasons: Counter[str] = Counter()
        ops: Counter[str] = Counter()
        for r in part:
            ops[opcode(r.get(source, ""))] += _number(r.get(column, ""))
            for reason, n in stall_columns(r):
                reasons[reason] += n
        share = sum(_number(r.get(column, "")) for r in part)
        out.append(f"{name}: {len(part)} instructions, {100 * share / total:.1f}% of samples")
        out.append("  reasons: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in reasons.most_common(6)))
        out.append("  opcodes: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in ops.most_common(8)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--column", default=None, help="the sample column (default: the first 'Sampling (All' one)")
    parser.add_argument("--split-loop", action="store_true",
                        help="also split the samples between the main loop and the once-per-CTA code")
    args = parser.parse_args(argv)
    header, rows = read_rows(args.csv)
    column = pick_column(header, args.column)
    source = pick_column(header, None, "Source")
    if column is None or source is None:
        print("no sample or source column; headers: " + " | ".join(header))
        return 2
    print("\n".join(summarize(rows, column, source, pick_column(header, None, "Address"), args.top)))
    if args.split_loop:
        print("\n".join(split_by_repeats(rows, column, source)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
