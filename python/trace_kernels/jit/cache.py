"""Content-hashed kernel cache: one folder per (kernel, key), built in a temp folder, renamed in.

Layout: <root>/v<CACHE_FORMAT>/<kernel name>-<key[:20]>/{kernel.cubin, meta.json[, kernel.cu]}
meta.json holds the full key and the cubin's sha256, so a truncated, corrupt or half-written entry
is detected on load and rebuilt. Two processes building the same kernel both compile in private
temp folders; the first rename wins, the loser keeps the winner's entry (rename of a folder onto a
non-empty folder fails atomically).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from trace_kernels import env, paths

CACHE_FORMAT = 1
CUBIN = "kernel.cubin"
META = "meta.json"
SOURCE = "kernel.cu"


def cache_root() -> Path:
    explicit = env.get("CACHE_DIR")
    if explicit:
        base = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = (Path(xdg) if xdg else Path.home() / ".cache") / "trace_kernels"
    return base / f"v{CACHE_FORMAT}"


_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def included_headers(source: str, include_dir: Path | None = None) -> list[Path]:
    """The project headers a source reaches through `#include "..."`, transitively, sorted.

    Read as text, so an include inside an `#if` counts whether or not it is taken (a superset of
    what the preprocessor opens: the safe direction). Names that do not resolve under the include
    dir (CUDA, CUTLASS) are left out: the nvcc version and the CUTLASS version key those.
    """
    root = include_dir or paths.include_dir()
    seen: set[str] = set()
    pending = _QUOTED_INCLUDE.findall(source)
    while pending:
        name = pending.pop()
        path = root / name
        if name in seen or not path.is_file():
            continue
        seen.add(name)
        pending += _QUOTED_INCLUDE.findall(path.read_text())
    return sorted(root / name for name in seen)


def header_digest(include_dir: Path | None = None, source: str | None = None) -> str:
    """sha256 over headers (relative path + bytes) in sorted order: those `source` includes
    (transitively, ``included_headers``), or with source None every header under the include dir.

    Hashing the files rather than running the preprocessor keeps a cache lookup cheap; keying a
    kernel on its own headers means a new or edited header rebuilds only the kernels that include it.
    """
    root = include_dir or paths.include_dir()
    files = (sorted(p for p in root.rglob("*") if p.is_file()) if source is None
             else included_headers(source, root))
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_key(source: str, flags: list[str], nvcc_version: str, headers: str, extra: str = "") -> str:
    digest = hashlib.sha256()
    for part in (f"format={CACHE_FORMAT}", source, "\0".join(flags), nvcc_version, headers, extra):
        digest.update(part.encode() + b"\0\1")
    return digest.hexdigest()


def source_key(source: str, headers: str) -> str:
    """Compiler-independent part (used to match AOT cubins on machines without nvcc)."""
    return hashlib.sha256(f"format={CACHE_FORMAT}\0{source}\0{headers}".encode()).hexdigest()


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Entry:
    name: str
    key: str
    folder: Path

    @property
    def cubin(self) -> Path:
        return self.folder / CUBIN

    def is_valid(self) -> bool:
        """Complete and uncorrupted: meta.json parses, names this key, and the cubin hash matches."""
        try:
            meta = json.loads((self.folder / META).read_text())
            return (meta.get("key") == self.key and meta.get("name") == self.name
                    and meta.get("cubin_sha256") == _sha256_file(self.cubin))
        except (OSError, ValueError):
            return False


def entry_for(name: str, key: str, root: Path | None = None) -> Entry:
    return Entry(name, key, (root or cache_root()) / f"{name}-{key[:20]}")


def install(entry: Entry, build: "callable", meta: dict) -> Entry:
    """Run build(tmp_folder) (it must write tmp_folder/kernel.cubin), then publish atomically.

    A pre-existing invalid entry is moved aside first; a valid one published by another process
    in the meantime is kept and ours discarded.
    """
    root = entry.folder.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".tmp-{entry.name}-"))
    try:
        build(tmp)
        cubin = tmp / CUBIN
        if not cubin.is_file() or cubin.stat().st_size == 0:
            raise RuntimeError(f"build of {entry.name} produced no cubin")
        full_meta = dict(meta, name=entry.name, key=entry.key, cubin_sha256=_sha256_file(cubin),
                         created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        (tmp / META).write_text(json.dumps(full_meta, indent=1, sort_keys=True) + "\n")
        for _ in range(3):
            try:
                os.rename(tmp, entry.folder)
                return entry
            except OSError:
                if entry.is_valid():
                    return entry  # another process won the race
                _discard(entry.folder)  # corrupt or half-written: move it aside and retry
        raise RuntimeError(f"could not publish cache entry {entry.folder}")
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _discard(folder: Path) -> None:
    """Move a bad entry out of the way atomically, then delete it (tolerates concurrent removal)."""
    trash = folder.parent / f".trash-{folder.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def list_entries(root: Path | None = None) -> list[dict]:
    """Valid-looking entries with their meta (for `trace-kernels list`)."""
    root = root or cache_root()
    out = []
    if not root.is_dir():
        return out
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            meta = json.loads((folder / META).read_text())
        except (OSError, ValueError):
            meta = {"name": folder.name, "corrupt": True}
        meta["folder"] = str(folder)
        out.append(meta)
    return out
