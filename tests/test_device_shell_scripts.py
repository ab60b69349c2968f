"""The device scripts (profiling/device/*.sh) parse, and gpu_env.sh, which they all source, defines each helper once:
a second definition silently replaces the first, and the scripts calling the first then fail on the device, after
the machine's start-up has been paid for (it happened: two `moe_layer_ab`s, thirty-eighth session)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
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


def test_call_scripts_do_not_repeat_the_call_start():
    """`source gpu_env.sh --call` already packs DIR on exit and logs the machine: a script that does it again writes
    every GPU line of machine.log twice (run_gpu_bench_decode_fill.sh and run_gpu_checks_shared_16bit.sh did)."""
    for script in sorted(DEVICE.glob("*.sh")):
        text = script.read_text()
        if "gpu_env.sh --call" in text:
            assert not re.search(r"^(tar_on_exit|log_machine) ", text, re.MULTILINE), script.name


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.parametrize("script", sorted(p.name for p in DEVICE.glob("*.sh")))
def test_device_script_parses(script):
    result = subprocess.run(["bash", "-n", str(DEVICE / script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("tar") is None, reason="no bash or tar here")
@pytest.mark.parametrize("caller_budget", ["", "50"])
def test_gpu_env_call_start(tmp_path, caller_budget):
    """`source gpu_env.sh --call NAME BUDGET CACHE`: OUT, BUDGET (the caller's first), DIR and the cache set, and DIR
    packed into OUT/NAME.tar with the machine's log when the script ends."""
    script = tmp_path / "probe.sh"
    script.write_text(f"""set -uo pipefail
source {DEVICE / "gpu_env.sh"} --call probe 123 .cachex
echo "$DIR|$BUDGET|$TRACE_KERNELS_CACHE_DIR|$(left)"
echo measured > "$DIR/result.txt"
""")
    env = {k: v for k, v in os.environ.items() if k not in ("BUDGET", "TRACE_KERNELS_CACHE_DIR", "OUT")}
    env["OUT"] = str(tmp_path / "out")
    if caller_budget:
        env["BUDGET"] = caller_budget
    run = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    out_dir, budget, cache, left = run.stdout.splitlines()[0].split("|")
    assert out_dir == f"{tmp_path}/out/probe" and cache == f"{tmp_path}/.cachex"
    assert budget == (caller_budget or "123") and 0 < int(left) <= int(budget)
    with tarfile.open(tmp_path / "out" / "probe.tar") as tar:
        assert {"probe/result.txt", "probe/machine.log"} <= set(tar.getnames())
    assert not (tmp_path / "out" / "probe").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.parametrize("card", ["NVIDIA H100 80GB HBM3", "NVIDIA H200", None])
def test_gpu_env_require_gpu(tmp_path, card):
    """REQUIRE_GPU=H200: a script on another card (or none) exits 3 before writing anything; on an H200 it runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"  # a stand-in that names the card, or fails as it does without a driver
    fake.write_text("#!/usr/bin/env bash\n" + (f"echo '{card}'\n" if card else "echo 'no driver' >&2\nexit 9\n"))
    fake.chmod(0o755)
    script = tmp_path / "probe.sh"
    script.write_text(f"""set -uo pipefail
source {DEVICE / "gpu_env.sh"} --call probe 123
echo ran
""")
    env = {k: v for k, v in os.environ.items() if k not in ("BUDGET", "TRACE_KERNELS_CACHE_DIR")}
    env.update(OUT=str(tmp_path / "out"), REQUIRE_GPU="H200", PATH=f"{bin_dir}:/usr/bin:/bin")
    run = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    if card == "NVIDIA H200":
        assert run.returncode == 0 and "ran" in run.stdout, run.stderr
        assert (tmp_path / "out" / "probe.tar").exists()
    else:
        assert run.returncode == 3 and "ran" not in run.stdout
        assert f"this machine's GPU is '{card or 'none found'}'; nothing run" in run.stdout
        assert not (tmp_path / "out").exists()
