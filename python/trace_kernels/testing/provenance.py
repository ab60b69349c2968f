"""Where a benchmark number came from: the commit and the UTC time every profiling JSON records."""

from __future__ import annotations

import datetime
import os
import subprocess


def git_commit() -> str:
    """HEAD, with "+dirty" when tracked files differ from it.

    TRACE_KERNELS_BENCH_COMMIT overrides it (a copy of the tree without git metadata, e.g. on the
    borrowed GPU machine).
    """
    explicit = os.environ.get("TRACE_KERNELS_BENCH_COMMIT")
    if explicit:
        return explicit
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git metadata)"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
