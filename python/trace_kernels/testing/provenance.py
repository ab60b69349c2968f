"""Where a benchmark number came from: the commit (and, for a tree that differs from it, the digest of its sources)
and the UTC time every profiling JSON records."""

from __future__ import annotations

import datetime
import hashlib
import os
import subprocess
from pathlib import Path

# What a benchmark's numbers depend on, relative to the repository root: every file under these folders but results,
# caches and build outputs, and the build files
SOURCE_DIRS = ("python", "cuda", "codegen", "rl", "profiling")
SOURCE_FILES = ("CMakeLists.txt", "pyproject.toml", "Makefile")
_SKIPPED_DIRS = {"__pycache__", "results", ".pytest_cache", "build"}
_SKIPPED_SUFFIXES = (".pyc", ".cubin", ".o", ".so", ".egg-info")

_CHECKOUT = Path(__file__).resolve().parents[3]


def repo_root() -> Path:
    """The source checkout this package runs from; the working directory for an installed package."""
    return _CHECKOUT if (_CHECKOUT / "cuda").is_dir() and (_CHECKOUT / "python").is_dir() else Path.cwd()


def source_files(root: Path) -> list[Path]:
    """The files source_digest hashes, sorted by their path relative to root."""
    files = [root / name for name in SOURCE_FILES if (root / name).is_file()]
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS and not d.endswith(_SKIPPED_SUFFIXES))
            files += [Path(dirpath) / f for f in filenames if not f.endswith(_SKIPPED_SUFFIXES)]
    return sorted(files, key=lambda f: f.relative_to(root).as_posix())


def source_digest(root: Path | None = None) -> str:
    """The first 16 hex digits of a sha256 over source_files(root), by relative path and content.

    The same sources give the same digest with or without git metadata, so a number measured on a copy of the tree
    (the borrowed GPU's, whose git metadata may be older than its files) can be matched to its commit:
    `python profiling/source_digest.py --find DIGEST`.
    """
    root = Path(root or repo_root())
    total = hashlib.sha256()
    for path in source_files(root):
        total.update(path.relative_to(root).as_posix().encode() + b"\0")
        total.update(hashlib.sha256(path.read_bytes()).digest())
    return total.hexdigest()[:16]


def git_commit() -> str:
    """HEAD; where the tracked files differ from it, "HEAD+dirty (sources DIGEST)" (source_digest).

    TRACE_KERNELS_BENCH_COMMIT names the commit instead (a copy of the tree without git metadata, or with stale
    metadata, as on the borrowed GPU machine); the sources' digest follows it, so a wrong name can be caught.
    """
    explicit = os.environ.get("TRACE_KERNELS_BENCH_COMMIT")
    if explicit:
        return f"{explicit} (sources {source_digest()})"
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=repo_root()).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True, cwd=repo_root()).stdout.strip()
        return f"{rev}+dirty (sources {source_digest()})" if dirty else rev
    except (OSError, subprocess.CalledProcessError):
        return f"unknown (no git metadata; sources {source_digest()})"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
