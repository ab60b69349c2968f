"""The device scripts (profiling/device/*.sh) parse, and gpu_env.sh, which they all source, defines each helper once:
a second definition silently replaces the first, and the scripts calling the first then fail on the device, after
the machine's start-up has been paid for (it happened: two `moe_layer_ab`s, thirty-eighth session)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

DEVICE = Path(__file__).resolve().parent.parent / "profiling" / "device"
FUNCTION = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\(\)\s*\{", re.MULTILINE)


def test_gpu_env_defines_each_helper_once():
    names = FUNCTION.findall((DEVICE / "gpu_env.sh").read_text())
    assert len(names) >= 10
    assert [name for name, count in Counter(names).items() if count > 1] == []


def test_scripts_do_not_redefine_gpu_env_helpers():
    helpers = set(FUNCTION.findall((DEVICE / "gpu_env.sh").read_text()))
    for script in sorted(DEVICE.glob("*.sh")):
        if script.name == "gpu_env.sh" or "gpu_env.sh" not in script.read_text():
            continue
        assert helpers.isdisjoint(FUNCTION.findall(script.read_text())), script.name


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.parametrize("script", sorted(p.name for p in DEVICE.glob("*.sh")))
def test_device_script_parses(script):
    result = subprocess.run(["bash", "-n", str(DEVICE / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
