"""profiling/ncu.py: the ncu command line it builds and the report parsing (CPU, no ncu needed)."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profiling"))

import ncu  # noqa: E402


def _regex_of(value: str) -> tuple[str, str]:
    m = re.fullmatch(r"regex:(\w+)@(.*)/", value)
    assert m, value
    return m.group(1), m.group(2)


def test_filters_name_the_domain_and_match_only_the_intended_ranges():
    domain, pattern = _regex_of(ncu.nvtx_filter("trace_kernels/moe_gemm_*"))
    assert domain == "trace_kernels"
    assert "/" not in pattern  # our '/' must not read as ncu's nesting separator
    hits = [n for n in ("trace_kernels/moe_gemm_gate_up_swiglu", "trace_kernels/moe_gemm_down_routed",
                        "trace_kernels/moe_combine", "trace_kernels/quantize") if re.fullmatch(pattern, n)]
    assert hits == ["trace_kernels/moe_gemm_gate_up_swiglu", "trace_kernels/moe_gemm_down_routed"]
    domain, pattern = _regex_of(ncu.nvtx_filter("rollout/decode_step"))
    assert domain == "trace_rl" and re.fullmatch(pattern, "rollout/decode_step")
    with pytest.raises(ValueError, match="unknown NVTX range"):
        ncu.nvtx_filter("moe_gemm_down_routed")


def test_command_has_clock_control_none_includes_and_phase_excludes(tmp_path):
    cmd = ncu.ncu_command(["python3", "x.py"], ["trace_kernels/moe_gemm_*"], "rollout/decode_step",
                          tmp_path / "r.ncu-rep", ["gpu__time_duration.sum", "dram__bytes.sum.per_second"])
    assert cmd[:3] == ["ncu", "--clock-control", "none"] and cmd[-2:] == ["python3", "x.py"]
    includes = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--nvtx-include"]
    excludes = [cmd[i + 1] for i, c in enumerate(cmd) if c == "--nvtx-exclude"]
    assert "--nvtx" in cmd and len(includes) == 1
    assert len(excludes) == len(ncu.ENGINE_PHASES) - 1 and ncu.nvtx_filter("rollout/decode_step") not in excludes
    assert cmd[cmd.index("--metrics") + 1] == "gpu__time_duration.sum,dram__bytes.sum.per_second"
    with pytest.raises(ValueError, match="--within"):
        ncu.filter_args(["trace_kernels/quantize"], "rollout/nothing")
    with pytest.raises(ValueError, match="no command"):
        ncu.ncu_command([], ["trace_kernels/quantize"], None, tmp_path / "r", [])


def test_dry_run_prints_the_command(capsys):
    assert ncu.main(["--ranges", "trace_kernels/quantize", "--dry-run", "--ncu", "ncu", "--", "python3", "y.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ncu --clock-control none") and "regex:trace_kernels@trace_kernels.quantize/" in out


def test_raw_csv_summary():
    text = "\n".join([
        "==PROF== Disconnected from process 1",
        '"ID","Kernel Name","gpu__time_duration.sum","launch__registers_per_thread"',
        '"","","nsecond","register/thread"',
        '"0","moe_gemm_gate_up_swiglu_nvfp4_e8 (1, 2, 1)x(384, 1, 1)","1,000","168"',
        '"1","moe_gemm_down_routed_nvfp4_e8 (1, 2, 1)x(384, 1, 1)","500","90"',
        '"2","moe_gemm_gate_up_swiglu_nvfp4_e8 (1, 2, 1)x(384, 1, 1)","3,000","168"',
    ])
    rows = ncu.parse_raw_csv(text)
    assert len(rows) == 3
    summary = {e["kernel"]: e for e in ncu.summarize(rows, ["gpu__time_duration.sum", "launch__registers_per_thread"])}
    up = summary["moe_gemm_gate_up_swiglu_nvfp4_e8"]
    assert up["launches"] == 2 and up["gpu__time_duration.sum"] == 2000 and up["launch__registers_per_thread"] == 168
    assert summary["moe_gemm_down_routed_nvfp4_e8"]["launches"] == 1


def test_decode_case_runs_and_states_the_expected_launches(capsys):
    """The profiling target itself (on the CPU reference backend here; the GPU check uses `kernels`)."""
    pytest.importorskip("trace_rl")
    assert ncu.main(["decode-case", "--device", "cpu", "--backend", "auto", "--new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"(\d+) layers, (\d+) decode steps -> expect (\d+) launches", out)
    assert m and int(m.group(3)) == int(m.group(1)) * int(m.group(2)) and int(m.group(2)) == 2
