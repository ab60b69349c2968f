"""Benchmark provenance: the sources' digest names a tree whatever its git metadata, and a commit's digest (git
archive) equals its checkout's, so a result measured on a copy of the tree can be matched to its commit."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trace_kernels.testing import provenance

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "profiling"))
import source_digest as digest_cli  # noqa: E402  (profiling/ is a script folder)


def _tree(root: Path) -> Path:
    """A small tree with the source layout, some results, caches and build outputs among it."""
    for rel, text in {"python/pkg/mod.py": "x = 1\n", "cuda/include/k.cuh": "// kernel\n",
                      "codegen/t.cu.jinja": "{{ a }}\n", "rl/cfg.toml": "a = 1\n", "profiling/bench.py": "print()\n",
                      "pyproject.toml": "[project]\n",
                      "profiling/results/run.json": "{}\n", "python/pkg/__pycache__/mod.cpython-312.pyc": "bytecode",
                      "cuda/include/k.cubin": "binary", "README.md": "not a source\n"}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_digest_covers_sources_only(tmp_path):
    root = _tree(tmp_path / "a")
    first = provenance.source_digest(root)
    assert len(first) == 16 and int(first, 16) >= 0
    assert [p.relative_to(root).as_posix() for p in provenance.source_files(root)] == [
        "codegen/t.cu.jinja", "cuda/include/k.cuh", "profiling/bench.py", "pyproject.toml", "python/pkg/mod.py",
        "rl/cfg.toml"]
    for rel in ("profiling/results/run.json", "python/pkg/__pycache__/mod.cpython-312.pyc", "cuda/include/k.cubin",
                "README.md"):
        (root / rel).write_text("changed")
    assert provenance.source_digest(root) == first  # results, caches, build outputs and docs do not count
    copy = shutil.copytree(root, tmp_path / "b")
    assert provenance.source_digest(copy) == first  # by relative path and content, not location
    (copy / "cuda/include/k.cuh").write_text("// kernel, edited\n")
    assert provenance.source_digest(copy) != first
    (copy / "cuda/include/k.cuh").write_text("// kernel\n")
    (copy / "cuda/include/k2.cuh").write_text("// kernel\n")  # a new header
    assert provenance.source_digest(copy) != first


@pytest.mark.skipif(shutil.which("git") is None, reason="no git on this machine")
def test_commit_digest_matches_its_checkout_and_find(tmp_path, monkeypatch, capsys):
    root = _tree(tmp_path / "repo")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], cwd=root, check=True)
    first = provenance.source_digest(root)
    assert digest_cli.commit_digest("HEAD", root) == first
    (root / "python/pkg/mod.py").write_text("x = 2\n")
    subprocess.run([*git, "commit", "-q", "-am", "two"], cwd=root, check=True)
    second = provenance.source_digest(root)
    assert second != first and digest_cli.commit_digest("HEAD", root) == second
    assert digest_cli.commit_digest("HEAD~1", root) == first
    monkeypatch.setattr(digest_cli, "repo_root", lambda: root)
    assert digest_cli.main(["--find", first]) == 0
    one = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=root, capture_output=True, text=True).stdout.strip()
    assert capsys.readouterr().out.split() == [one]
    assert digest_cli.main(["--find", "0" * 16]) == 1


def test_git_commit_names_the_sources(monkeypatch):
    monkeypatch.setenv("TRACE_KERNELS_BENCH_COMMIT", "abc1234")
    assert provenance.git_commit() == f"abc1234 (sources {provenance.source_digest()})"
    monkeypatch.delenv("TRACE_KERNELS_BENCH_COMMIT")
    commit = provenance.git_commit()
    assert commit.endswith(f"(sources {provenance.source_digest()})") or "+" not in commit
