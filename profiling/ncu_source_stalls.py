"""Where a kernel's warps stall, per SASS instruction, from Nsight Compute's source page.

    ncu --section SourceCounters -k regex:KERNEL -c 1 -o rep python ...
    ncu --import rep.ncu-rep --page source --print-source sass --csv > rep.source.csv
    python profiling/ncu_source_stalls.py rep.source.csv [--top 30]

Prints the instructions with the most warp-stall samples (address, share of all samples, SASS) and the samples
summed per opcode, so a profile says which instruction a kernel waits at (a wgmma wait, a barrier, a shared-memory
load) rather than only which stall reason dominates. The sample column is the first whose name contains
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
    """The CSV's header and rows; lines before the header (ncu's "==PROF==" notes) are skipped."""
    with open(path, newline="") as f:
        lines = [line for line in f if not line.startswith("==")]
    reader = csv.DictReader(lines)
    return list(reader.fieldnames or []), list(reader)


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
        out.append(f"{100 * s / total:6.2f}%  {where:>8s}  {r.get(source, '').strip()}")
    per_op: Counter[str] = Counter()
    for s, r in samples:
        per_op[opcode(r.get(source, ""))] += s
    out.append("per opcode: " + ", ".join(f"{op} {100 * s / total:.1f}%" for op, s in per_op.most_common(12)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--column", default=None, help="the sample column (default: the first 'Sampling (All' one)")
    args = parser.parse_args(argv)
    header, rows = read_rows(args.csv)
    column = pick_column(header, args.column)
    source = pick_column(header, None, "Source")
    if column is None or source is None:
        print("no sample or source column; headers: " + " | ".join(header))
        return 2
    print("\n".join(summarize(rows, column, source, pick_column(header, None, "Address"), args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
