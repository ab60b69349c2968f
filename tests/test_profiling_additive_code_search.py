"""profiling/additive_code_search.c: it builds, accepts kv_codes' XOR layout and rejects layouts that lose words (CPU)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parent.parent / "profiling" / "additive_code_search.c"


def _has_bmi2() -> bool:
    try:
        return " bmi2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def search_binary(tmp_path_factory) -> Path:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None or not _has_bmi2():
        pytest.skip("needs a C compiler and an x86 CPU with BMI2 (pext)")
    binary = tmp_path_factory.mktemp("acs") / "additive_code_search"
    subprocess.run([compiler, "-O2", "-mbmi2", "-o", str(binary), str(SOURCE)], check=True, capture_output=True)
    return binary


def test_xor_layout_is_a_lane_bijection_and_random_additive_ones_are_not(search_binary):
    out = subprocess.run([str(search_binary), "random", "2000"], check=True, capture_output=True, text=True).stdout
    assert "kv_codes' XOR layout: bijective" in out
    tried, found = map(int, re.search(r"tried (\d+), lane-bijective (\d+)", out).groups())
    assert (tried, found) == (4000, 0)


def test_bad_arguments_are_refused(search_binary):
    result = subprocess.run([str(search_binary), "random"], capture_output=True, text=True)
    assert result.returncode == 2 and "usage" in result.stderr
