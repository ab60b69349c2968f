"""The digest of the sources a benchmark's numbers depend on (trace_kernels.testing.provenance.source_digest), of the
working tree or of a commit, and the commits whose sources match a digest: a result JSON measured on a copy of the tree
records "COMMIT+dirty (sources DIGEST)", and COMMIT may be older than the copy's files (the borrowed GPU's git metadata
is that of the session's start).

    python profiling/source_digest.py                      # the working tree
    python profiling/source_digest.py --rev HEAD~2         # a commit
    python profiling/source_digest.py --find 3f3e2101c8a2819e [--last 100]
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from trace_kernels.testing.provenance import SOURCE_DIRS, SOURCE_FILES, repo_root, source_digest


def commit_digest(rev: str, root: Path) -> str:
    """source_digest of commit rev's tree (its source folders and build files, extracted with git archive)."""
    listing = subprocess.run(["git", "ls-tree", "--name-only", rev], capture_output=True, text=True, cwd=root)
    if listing.returncode:
        raise ValueError(f"not a commit of {root}: {rev!r} ({listing.stderr.strip()})")
    paths = [p for p in (*SOURCE_DIRS, *SOURCE_FILES) if p in listing.stdout.split()]
    archive = subprocess.run(["git", "archive", "--format=tar", rev, *paths], capture_output=True, check=True,
                             cwd=root).stdout
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp, filter="data")
        return source_digest(Path(tmp))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", default="", help="a commit (default: the working tree)")
    parser.add_argument("--find", default="", metavar="DIGEST", help="print the commits whose sources have DIGEST")
    parser.add_argument("--last", type=int, default=50, help="how many commits back --find looks (default 50)")
    args = parser.parse_args(argv)
    root = repo_root()
    if not args.find:
        try:
            print(commit_digest(args.rev, root) if args.rev else source_digest(root))
        except ValueError as error:
            parser.error(str(error))
        return 0
    revs = subprocess.run(["git", "rev-list", f"--max-count={args.last}", "HEAD"], capture_output=True, text=True,
                          check=True, cwd=root).stdout.split()
    found = [rev for rev in revs if commit_digest(rev, root) == args.find]
    if source_digest(root) == args.find:
        found.insert(0, "working tree")
    print("\n".join(found) if found else f"no commit of the last {args.last} has sources {args.find}")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
