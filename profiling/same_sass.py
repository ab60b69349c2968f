"""Do two JIT caches hold the same machine code for each kernel name? (no GPU)

    python profiling/same_sass.py BEFORE_CACHE AFTER_CACHE [--match moe_] [--nvdisasm PATH]

For a header change meant to leave the code alone (a refactor): build the kernels into one cache from the tree
before and into another from the tree after (prebuild_device_caches.py --cache DIR SET, each tree on PYTHONPATH),
then compare. Each kernel name found in both caches (the newest entry of each) is disassembled with nvdisasm and
compared instruction by instruction, with addresses, encodings and comments dropped; the output lists the names
whose SASS differs and those found in only one cache. Exit status 1 when any differs, so a script can gate on it.
--opcodes adds, under each kernel that differs, its instruction counts and whether its opcodes are the same in the same
counts (a rescheduling or register renaming keeps them; new arithmetic does not).
nvdisasm ships in CUDA's pip wheel nvidia-cuda-nvdisasm (unzip it anywhere; do not install it into the project's venv).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from trace_kernels.jit import cache

# an nvdisasm line: "        /*0040*/                   IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;   /* 0x... */"
_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")
_COMMENT = re.compile(r"/\*.*?\*/")


def newest_cubins(root: Path, match: str) -> dict[str, Path]:
    """{kernel name: cubin} of the newest valid-looking entry of each name in the cache at root."""
    newest: dict[str, tuple[str, Path]] = {}
    versioned = root / f"v{cache.CACHE_FORMAT}"  # TRACE_KERNELS_CACHE_DIR's layout (cache.cache_root)
    for meta in cache.list_entries(versioned if versioned.is_dir() else root):
        name = meta.get("name", "")
        if meta.get("corrupt") or match not in name:
            continue
        cubin = Path(meta["folder"]) / cache.CUBIN
        created = meta.get("created", "")
        if cubin.is_file() and (name not in newest or created > newest[name][0]):
            newest[name] = (created, cubin)
    return {name: cubin for name, (_, cubin) in newest.items()}


def sass(cubin: Path, nvdisasm: str) -> list[str]:
    """The cubin's instructions, one per line, without addresses, encodings or comments."""
    text = subprocess.run([nvdisasm, "--print-code", str(cubin)], check=True, capture_output=True, text=True).stdout
    lines = []
    for line in text.splitlines():
        if not _ADDRESS.search(line):
            continue  # labels, section headers and directives: addresses and names only
        instruction = _COMMENT.sub("", line).strip()
        if instruction:
            lines.append(instruction)
    return lines


def opcodes(instructions: list[str]) -> Counter:
    """How often each opcode (with its modifiers, without a guard predicate) stands in the instructions."""
    return Counter(next(t for t in line.split() if not t.startswith("@")) for line in instructions)


def opcode_summary(before: list[str], after: list[str]) -> str:
    same = "yes" if opcodes(before) == opcodes(after) else "no"
    return f"  {len(before)} -> {len(after)} instructions, the same opcodes in the same counts: {same}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="the JIT cache (TRACE_KERNELS_CACHE_DIR) of the tree before the change")
    parser.add_argument("after", type=Path, help="the JIT cache of the tree after it")
    parser.add_argument("--match", default="", help="compare only kernel names containing this text")
    parser.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    parser.add_argument("--opcodes", action="store_true",
                        help="under each kernel that differs: instruction counts, and whether the opcodes match")
    args = parser.parse_args(argv)

    before, after = newest_cubins(args.before, args.match), newest_cubins(args.after, args.match)
    both = sorted(before.keys() & after.keys())
    if not both:
        print("no kernel name is in both caches")
        return 1
    differ = []
    for name in both:
        code_before, code_after = sass(before[name], args.nvdisasm), sass(after[name], args.nvdisasm)
        if code_before != code_after:
            differ.append(name)
            print(f"differs: {name}")
            if args.opcodes:
                print(opcode_summary(code_before, code_after))
    for name in sorted(before.keys() - after.keys()):
        print(f"only before: {name}")
    for name in sorted(after.keys() - before.keys()):
        print(f"only after: {name}")
    print(f"{len(both) - len(differ)} of {len(both)} kernels have the same SASS")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
