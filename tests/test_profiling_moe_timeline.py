"""profiling/moe_timeline.py off the GPU: the per-SM summary of a GEMM's CTA stamps on synthetic rows, and the MoE
kernels' stamps compiled in only with TRACE_KERNELS_CTA_TIMELINE."""

import sys
from pathlib import Path

import pytest

PROFILING = Path(__file__).resolve().parents[1] / "profiling"
sys.path.insert(0, str(PROFILING))

import cta_timeline  # noqa: E402
import moe_timeline  # noqa: E402

US = 1000  # ns


def cta(entry, found, waited, first, done, stored, quantized=0, *, smid, rows=8, expert=0):
    """One GEMM CTA's 16 slots as the kernel writes them (globaltimer 0-6, smid 7, clock64 8-14, note 15); 0 = a
    point it never reached."""
    times = [entry, found, waited, first, done, stored, quantized]
    return [t * US for t in times] + [smid] + [2 * t * US for t in times] + [expert << 32 | rows]


def test_coverage_and_count_histogram():
    u = moe_timeline.Coverage([(0, 10), (5, 15), (20, 30), (40, 40)])  # the empty one adds nothing
    assert u.covered(0, 30) == 25
    assert u.covered(12, 22) == 3 + 2
    assert u.covered(-5, 3) == 3 and u.covered(15, 20) == 0 and u.covered(50, 60) == 0 and u.covered(9, 9) == 0
    two = moe_timeline.Coverage([(0, 10), (5, 15), (8, 30), (20, 30)], at_least=2)  # [5, 15) and [20, 30)
    assert two.covered(0, 40) == 20 and two.covered(12, 22) == 3 + 2 and two.covered(0, 5) == 0
    assert moe_timeline.Coverage([(0, 10)], at_least=2).covered(0, 10) == 0
    assert moe_timeline.count_histogram([(0, 10), (5, 15)], 0, 20) == {0: 5, 1: 10, 2: 5}
    assert moe_timeline.count_histogram([(0, 10), (5, 15)], 6, 12) == {2: 4, 1: 2}  # clipped to the window


def test_summary_of_a_lockstep_sm_and_a_staggered_one():
    rows = [
        cta(1, 2, 3, 4, 14, 16, smid=0),                  # SM 0: two CTAs in lockstep
        cta(1, 2, 3, 4, 14, 16, smid=0, rows=5),
        cta(1, 2, 3, 4, 14, 16, smid=1, expert=3),        # SM 1: the second starts when the first's loop ends
        cta(11, 12, 13, 14, 24, 26, smid=1, expert=3),
        cta(2, 0, 0, 0, 0, 0, smid=1),                    # a CTA past the routing's token tiles: entry only
        [0] * cta_timeline.SLOTS,                         # a CTA never recorded (cleared row)
    ]
    s = moe_timeline.summarize_gemm(rows, t0=0)
    assert (s["ctas"], s["ctas_with_tile"], s["sms_used"], s["max_ctas_per_sm"]) == (5, 4, 2, 3)
    assert (s["first_entry_us"], s["last_end_us"], s["span_us"]) == (1, 26, 25)
    assert s["phases_us"] == {"find_tile": 1, "to_wait_done": 1, "first_data": 1, "main_loop": 10, "epilogue": 2,
                              "life": 15}
    assert s["last_ctas"] == 0 and s["last_cta_quantize_us"] is None
    # SM time over [1, 26] x 2 SMs = 50 us: SM 0 has 2 loops for 10 us and none for 15; SM 1 one for 20, none for 5
    assert s["main_loop_ctas"] == {"0": 0.4, "1": 0.4, "2": 0.2}
    # outside their loops, SM 0's CTAs never see the other's loop; SM 1's see it for 2 of 5 and 3 of 5 us
    assert s["cover"] == {"p10": 0.0, "p50": 0.4}
    assert s["sm_idle_tail_us"]["max"] == 10  # SM 0 ends at 16, the grid at 26
    assert s["main_loop_share_of_life"] == pytest.approx(10 / 15, abs=1e-4)
    # SM 0's loops run side by side the whole time, SM 1's never: 10 us either way here
    assert s["main_loop_us_by_shared_fifth"] == {"0.0-0.2": {"ctas": 2, "median": 10},
                                                 "0.8-1.0": {"ctas": 2, "median": 10}}


def test_last_ctas_and_an_unstamped_kernel():
    rows = [cta(1, 2, 3, 4, 14, 16, 19, smid=0), cta(1, 2, 3, 4, 14, 15, smid=1)]  # (globaltimer is never 0)
    s = moe_timeline.summarize_gemm(rows, t0=0)
    assert s["last_ctas"] == 1 and s["last_cta_quantize_us"] == 3
    assert s["last_end_us"] == 19 and s["phases_us"]["life"] == pytest.approx((18 + 14) / 2)
    assert moe_timeline.summarize_gemm([[0] * cta_timeline.SLOTS] * 4, t0=0) is None  # a ws kernel: no stamps
    combine = [cta(20, 0, 21, 0, 0, 25, smid=0), cta(20, 0, 22, 0, 0, 24, smid=1)]
    assert moe_timeline.summarize_combine(combine, t0=10 * US) == {
        "ctas": 2, "first_entry_us": 10, "first_past_wait_us": 11, "last_past_wait_us": 12, "end_us": 15}


@pytest.mark.nvcc
def test_moe_stamps_are_compiled_in_only_with_the_macro(tmp_path):
    """The v1 GEMM calls CTA_STAMP unconditionally: without TRACE_KERNELS_CTA_TIMELINE the timeline array (the name
    the script reads back) must not exist, with it it must. The tiny fused gate_up's ring tile: every stamp but the
    direct tiles' point 3."""
    from trace_kernels import shapes
    from trace_kernels.codegen.ops import moe_gemm as codegen
    spec = codegen.gemm_spec(shapes.resolve("tiny"), "gate_up_swiglu", codegen.TILE_TABLE[0][1])
    with_stamps = cta_timeline.compile_with_stamps(spec, tmp_path, stamps=True).read_bytes()
    without = cta_timeline.compile_with_stamps(spec, tmp_path, stamps=False).read_bytes()
    assert cta_timeline.SYMBOL.encode() in with_stamps
    assert cta_timeline.SYMBOL.encode() not in without
