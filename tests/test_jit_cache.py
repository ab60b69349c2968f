"""JIT cache: keys, atomic concurrent builds, corrupt-entry rebuild, AOT lookup, env knobs.

A fake nvcc (a small script) stands in for the compiler so these run anywhere in well under a
second each; the real compiler is exercised in test_codegen.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trace_kernels import jit, paths
from trace_kernels.codegen.ops import quantize
from trace_kernels.jit import cache, compiler

FAKE_NVCC = textwrap.dedent("""\
    #!{python}
    import sys, time, os
    args = sys.argv[1:]
    if "--version" in args:
        print("fake nvcc, release 13.0, " + os.environ.get("FAKE_NVCC_VERSION", "V13.0.0"))
        sys.exit(0)
    out = args[args.index("-o") + 1]
    time.sleep(float(os.environ.get("FAKE_NVCC_SLEEP", "0")))
    with open(os.environ["FAKE_NVCC_LOG"], "a") as log:
        log.write(str(os.getpid()) + "\\n")
    with open(out, "wb") as f:
        f.write(b"\\x7fELF fake cubin for " + open(args[-1], "rb").read()[:64])
    print("ptxas info    : Used 32 registers, used 0 barriers")
    print("    0 bytes stack frame, " + os.environ.get("FAKE_NVCC_SPILL", "0") + " bytes spill stores, 0 bytes spill loads")
""")


@pytest.fixture
def fake_nvcc(tmp_path, monkeypatch):
    script = tmp_path / "nvcc"
    script.write_text(FAKE_NVCC.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "compiles.log"
    log.touch()
    monkeypatch.setenv("TRACE_KERNELS_NVCC", str(script))
    monkeypatch.setenv("TRACE_KERNELS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_NVCC_LOG", str(log))
    compiler.nvcc_version.cache_clear()
    jit._resolved.clear()
    yield log
    compiler.nvcc_version.cache_clear()
    jit._resolved.clear()


def compiles(log) -> int:
    return len(log.read_text().split())


def test_cache_key_depends_on_source_flags_compiler_and_headers(tmp_path):
    base = dict(source="src", flags=["-O3"], nvcc_version="13.0", headers="h")
    key = cache.cache_key(**base)
    assert key == cache.cache_key(**base)
    for change in (dict(source="src2"), dict(flags=["-O2"]), dict(nvcc_version="13.1"), dict(headers="h2")):
        assert cache.cache_key(**{**base, **change}) != key


def test_header_edit_changes_the_key(tmp_path):
    include = tmp_path / "include"
    shutil.copytree(paths.include_dir(), include)
    before = cache.header_digest(include)
    assert before == cache.header_digest(include)
    header = include / "trace_kernels" / "nvfp4.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    edited = cache.header_digest(include)
    assert edited != before
    (include / "trace_kernels" / "new_header.cuh").write_text("#pragma once\n")
    assert cache.header_digest(include) not in (before, edited)


def test_kernel_keys_follow_only_their_own_headers(tmp_path):
    """A kernel is keyed on the headers its source reaches (transitively): editing or adding another
    header leaves its key alone; editing one it includes, even indirectly, changes it."""
    include = tmp_path / "include"
    shutil.copytree(paths.include_dir(), include)
    source = quantize.spec("bf16", 64).render()
    reached = {p.relative_to(include).as_posix() for p in cache.included_headers(source, include)}
    assert {"trace_kernels/quantize.cuh", "trace_kernels/nvfp4.cuh", "trace_kernels/vec.cuh"} <= reached
    assert "trace_kernels/attention_decode.cuh" not in reached
    before = cache.header_digest(include, source=source)
    assert before == cache.header_digest(include, source=source) != cache.header_digest(include)
    (include / "trace_kernels" / "new_variant.cuh").write_text("#pragma once\n")
    unrelated = include / "trace_kernels" / "attention_decode.cuh"
    unrelated.write_text(unrelated.read_text() + "\n// an edit\n")
    assert cache.header_digest(include, source=source) == before
    indirect = include / "trace_kernels" / "vec.cuh"  # quantize.cuh -> vec.cuh
    indirect.write_text(indirect.read_text() + "\n// an edit\n")
    assert cache.header_digest(include, source=source) != before


def test_build_then_reuse(fake_nvcc):
    spec = quantize.spec("bf16", 64)
    entry = jit.build(spec)
    assert entry.is_valid() and entry.folder.name.startswith(spec.name + "-")
    assert entry.folder.parent == cache.cache_root() and cache.cache_root().name == f"v{cache.CACHE_FORMAT}"
    assert jit.build(spec) == entry and compiles(fake_nvcc) == 1
    assert jit.cubin_for(spec) == entry.cubin
    assert not [p for p in entry.folder.parent.iterdir() if p.name.startswith(".tmp")]


def test_compiler_version_change_rebuilds(fake_nvcc, monkeypatch):
    spec = quantize.spec("bf16", 64)
    first = jit.build(spec)
    monkeypatch.setenv("FAKE_NVCC_VERSION", "V13.0.99")
    compiler.nvcc_version.cache_clear()
    second = jit.build(spec)
    assert second.key != first.key and compiles(fake_nvcc) == 2


def test_corrupt_or_half_written_entries_are_rebuilt(fake_nvcc):
    spec = quantize.spec("bf16", 64)
    entry = jit.build(spec)
    entry.cubin.write_bytes(entry.cubin.read_bytes()[:10])  # truncated cubin
    assert not entry.is_valid()
    assert jit.build(spec).is_valid() and compiles(fake_nvcc) == 2
    (entry.folder / cache.META).unlink()  # a folder without meta.json (crash mid-write)
    assert not entry.is_valid()
    assert jit.build(spec).is_valid() and compiles(fake_nvcc) == 3
    (entry.folder / cache.META).write_text("{not json")
    assert jit.build(spec).is_valid() and compiles(fake_nvcc) == 4


def test_two_processes_building_the_same_kernel(fake_nvcc, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SLEEP", "0.5")  # both compile at the same time
    code = ("from trace_kernels import jit; from trace_kernels.codegen.ops import quantize; "
            "print(jit.build(quantize.spec('bf16', 64)).folder)")
    env = dict(os.environ, PYTHONPATH=str(paths.PACKAGE_DIR.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    folders = {r[0].strip() for r in results}
    assert len(folders) == 1
    folder = Path(folders.pop())
    meta = json.loads((folder / cache.META).read_text())
    assert cache.Entry(meta["name"], meta["key"], folder).is_valid()
    assert compiles(fake_nvcc) == 2  # both compiled; one published, the other reused it
    leftovers = [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_ptxas_check_fails_on_spills(fake_nvcc, monkeypatch):
    monkeypatch.setenv("FAKE_NVCC_SPILL", "16")
    spec = quantize.spec("bf16", 64)
    jit.build(spec)  # spills are only reported without the knob
    monkeypatch.setenv("TRACE_KERNELS_PTXAS_CHECK", "1")
    with pytest.raises(jit.CompileError, match="spill"):
        jit.build(spec, force=True)


def test_lineinfo_changes_flags_and_keeps_source(fake_nvcc, monkeypatch):
    spec = quantize.spec("bf16", 64)
    plain = jit.build(spec)
    monkeypatch.setenv("TRACE_KERNELS_LINEINFO", "1")
    assert "-lineinfo" in compiler.flags(spec)
    with_lines = jit.build(spec)
    assert with_lines.key != plain.key and (with_lines.folder / cache.SOURCE).is_file()
    assert not (plain.folder / cache.SOURCE).exists()


def test_disable_jit_and_missing_nvcc(fake_nvcc, monkeypatch, tmp_path):
    spec = quantize.spec("bf16", 128)
    monkeypatch.setenv("TRACE_KERNELS_DISABLE_JIT", "1")
    with pytest.raises(jit.KernelUnavailable, match="TRACE_KERNELS_DISABLE_JIT"):
        jit.cubin_for(spec)
    monkeypatch.delenv("TRACE_KERNELS_DISABLE_JIT")
    monkeypatch.setenv("TRACE_KERNELS_NVCC", str(tmp_path / "no-nvcc"))
    with pytest.raises(jit.KernelUnavailable, match="no nvcc"):
        jit.cubin_for(spec)


def test_aot_manifest_is_used_only_for_matching_sources(fake_nvcc, monkeypatch, tmp_path):
    from trace_kernels import cli
    aot = tmp_path / "aot"
    assert cli.main(["build", "--preset", "tiny", "--op", "nvfp4_quantize", "--out", str(aot)]) == 0
    manifest = json.loads((aot / "manifest.json").read_text())
    spec = quantize.spec("bf16", 64)
    assert spec.name in manifest and (aot / manifest[spec.name]["cubin"]).is_file()
    monkeypatch.setenv("TRACE_KERNELS_AOT_DIR", str(aot))
    monkeypatch.setenv("TRACE_KERNELS_DISABLE_JIT", "1")
    monkeypatch.setenv("TRACE_KERNELS_CACHE_DIR", str(tmp_path / "empty-cache"))
    jit._aot_manifest.cache_clear()
    try:
        assert jit.cubin_for(spec) == aot / f"{spec.name}.cubin"
        manifest[spec.name]["source_key"] = "stale"
        (aot / "manifest.json").write_text(json.dumps(manifest))
        jit._aot_manifest.cache_clear()
        jit._resolved.clear()
        with pytest.raises(jit.KernelUnavailable):
            jit.cubin_for(spec)
    finally:
        jit._aot_manifest.cache_clear()
