"""profiling/same_sass.py: two JIT caches compared kernel by kernel (CPU; a stand-in nvdisasm prints the cubin)."""

import json
import stat
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profiling"))

import same_sass  # noqa: E402

# nvdisasm's layout: section lines without addresses, then one instruction per line with address and encoding
LISTING = """\t.target\tsm_90a
.text.{name}:
        /*0000*/                   LDC R1, c[0x0][0x28] ;                   /* 0x00000a00ff017b82 */
        /*0010*/                   {op} ;   /* 0x000fe20000000f00 */
.L_x_0:
        /*0020*/                   EXIT ;   /* 0x000fea0003800000 */
"""


def _entry(cache_dir: Path, name: str, key: str, created: str, op: str) -> None:
    """One cache entry as jit.cache.install writes it (meta.json + kernel.cubin), under the format's folder."""
    folder = cache_dir / "v1" / f"{name}-{key}"
    folder.mkdir(parents=True)
    (folder / "kernel.cubin").write_text(LISTING.format(name=name, op=op))  # the fake nvdisasm prints it back
    (folder / "meta.json").write_text(json.dumps({"name": name, "key": key, "created": created}))


def _fake_nvdisasm(tmp_path: Path) -> str:
    tool = tmp_path / "nvdisasm"
    tool.write_text('#!/bin/sh\n[ "$1" = --print-code ] || exit 2\ncat "$2"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return str(tool)


def test_lists_the_kernels_whose_instructions_differ(tmp_path, capsys):
    before, after = tmp_path / "before", tmp_path / "after"
    _entry(before, "moe_a", "k1", "2026-12-06T10:00:00Z", "IMAD R2, R3, 0x2, RZ")
    _entry(after, "moe_a", "k2", "2026-12-06T11:00:00Z", "IMAD R2, R3, 0x2, RZ")  # same code, another key
    _entry(before, "moe_b", "k3", "2026-12-06T10:00:00Z", "IADD3 R2, R3, 0x1, RZ")
    _entry(after, "moe_b", "k4", "2026-12-06T11:00:00Z", "IADD3 R2, R3, 0x2, RZ")
    _entry(after, "moe_c", "k5", "2026-12-06T11:00:00Z", "NOP")
    _entry(after, "quantize_d", "k6", "2026-12-06T11:00:00Z", "NOP")
    nvdisasm = _fake_nvdisasm(tmp_path)
    assert same_sass.main([str(before), str(after), "--match", "moe_", "--nvdisasm", nvdisasm]) == 1
    assert capsys.readouterr().out.splitlines() == ["differs: moe_b", "only after: moe_c",
                                                    "1 of 2 kernels have the same SASS"]
    # the newest entry of a name is the one compared: a rebuilt moe_b equal to before's
    _entry(after, "moe_b", "k7", "2026-12-06T12:00:00Z", "IADD3 R2, R3, 0x1, RZ")
    assert same_sass.main([str(before), str(after), "--match", "moe_b", "--nvdisasm", nvdisasm]) == 0
    assert capsys.readouterr().out.splitlines() == ["1 of 1 kernels have the same SASS"]


def test_drops_addresses_encodings_and_labels(tmp_path):
    _entry(tmp_path, "k", "key", "2026-12-06T10:00:00Z", "@!P0 BRA `(.L_x_0)")
    cubin = tmp_path / "v1" / "k-key" / "kernel.cubin"
    assert same_sass.sass(cubin, _fake_nvdisasm(tmp_path)) == ["LDC R1, c[0x0][0x28] ;", "@!P0 BRA `(.L_x_0) ;",
                                                               "EXIT ;"]


def test_opcodes_tell_renamed_registers_from_new_arithmetic(tmp_path, capsys):
    before, after = tmp_path / "before", tmp_path / "after"
    _entry(before, "renamed", "k1", "2026-12-06T10:00:00Z", "@P0 IADD3 R2, R3, 0x1, RZ")
    _entry(after, "renamed", "k2", "2026-12-06T11:00:00Z", "@P1 IADD3 R4, R3, 0x1, RZ")  # other guard and registers
    _entry(before, "rewritten", "k3", "2026-12-06T10:00:00Z", "IADD3 R2, R3, 0x1, RZ")
    _entry(after, "rewritten", "k4", "2026-12-06T11:00:00Z", "IMAD R2, R3, 0x2, RZ")
    nvdisasm = _fake_nvdisasm(tmp_path)
    assert same_sass.main([str(before), str(after), "--opcodes", "--nvdisasm", nvdisasm]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "differs: renamed", "  3 -> 3 instructions, the same opcodes in the same counts: yes",
        "differs: rewritten", "  3 -> 3 instructions, the same opcodes in the same counts: no",
        "0 of 2 kernels have the same SASS"]
