"""profiling/decode_timeline.py off the GPU: the per-CTA summary on synthetic stamps, and the stamps' compile switch;
profiling/decode_ab.py's arm syntax."""

import sys
from pathlib import Path

import pytest

PROFILING = Path(__file__).resolve().parents[1] / "profiling"
sys.path.insert(0, str(PROFILING))

import decode_timeline  # noqa: E402

US = 1000  # ns


def cta(entry, waited, q_ready, first_tile, loop_done, stored, merge_buffer, smid, tiles):
    """One CTA's 16 slots as the kernel writes them: globaltimer 0-6, smid 7, clock64 8-14, tile count 15."""
    times = [entry, waited, q_ready, first_tile, loop_done, stored, merge_buffer]
    clocks = [2 * t for t in times]  # a 2 GHz SM clock
    return [t * US for t in times] + [smid] + [c * US for c in clocks] + [tiles]


def test_summary_of_two_sms_with_an_unequal_pair():
    rows = [
        cta(0, 1, 4, 5, 35, 38, 36, smid=0, tiles=11),   # 30 us loop over 10 tile steps: 3 us per tile
        cta(0, 1, 4, 5, 45, 48, 46, smid=0, tiles=11),   # its neighbour on SM 0 ends 10 us later
        cta(1, 2, 5, 6, 36, 39, 37, smid=1, tiles=11),
        cta(1, 2, 5, 6, 26, 29, 27, smid=2, tiles=11),   # alone on its SM: 2 us per tile
    ]
    s = decode_timeline.summarize(rows)
    assert s["ctas"] == 4 and s["sms_used"] == 3 and s["max_ctas_per_sm"] == 2
    assert s["span_us"] == 48
    assert s["start_spread_us"]["max"] == 1
    assert s["wait_us"] == 1 and s["q_us"] == 3 and s["first_tile_after_wait_us"] == 4
    assert s["per_tile_us"] == 3 and s["per_tile_cycles"] == 6000  # medians over the four CTAs
    assert s["merge_store_us"] == 3 and s["merge_buffer_us"] == 1 and s["merge_outputs_us"] == 2
    assert s["end_us"]["min"] == 29 and s["end_us"]["max"] == 48
    assert s["timer_step_ns"] == 1000
    assert s["pairs"] == 1 and s["pairs_first_placed_ends_first"] == 1 and s["pair_end_gap_us"] == 10
    assert s["sm_end_us"] == {"min": 29, "p50": 39, "max": 48}


def test_combine_summary_is_on_the_decode_clock():
    t0 = 5 * US
    rows = [cta(50, 51, 0, 0, 0, 53, 0, smid=3, tiles=0), cta(50, 52, 0, 0, 0, 54, 0, smid=4, tiles=0),
            [0] * decode_timeline.SLOTS]  # a CTA that never ran (cleared slots) is left out
    c = decode_timeline.combine_summary(rows, t0)
    assert c == {"ctas": 2, "first_entry_us": 45, "first_past_wait_us": 46, "last_past_wait_us": 47, "end_us": 49}
    assert decode_timeline.combine_summary([[0] * decode_timeline.SLOTS] * 3, 0) is None  # no combine kernel ran


@pytest.mark.nvcc
def test_stamps_are_compiled_in_only_with_the_macro(tmp_path):
    """The decode kernels call CTA_STAMP unconditionally: without TRACE_KERNELS_CTA_TIMELINE the timeline array
    (the name the script reads back) must not exist, with it it must."""
    from trace_kernels.codegen.ops import decode_attention as codegen
    spec = codegen.combine_spec(64)  # small: seconds to compile, and it carries the same hooks as the decode kernels
    with_stamps = decode_timeline.compile_with_stamps(spec, tmp_path, stamps=True).read_bytes()
    without = decode_timeline.compile_with_stamps(spec, tmp_path, stamps=False).read_bytes()
    assert decode_timeline.SYMBOL.encode() in with_stamps
    assert decode_timeline.SYMBOL.encode() not in without


def test_bench_attention_heads_option(monkeypatch):
    """--heads sets the shape every bench_attention case (and decode_ab / decode_timeline) uses; the helpers' defaults
    follow it at call time."""
    import bench_attention
    for name in ("HQ", "HKV", "D", "P"):
        monkeypatch.setattr(bench_attention, name, getattr(bench_attention, name))  # restored after the test
    assert (bench_attention.HQ, bench_attention.HKV, bench_attention.D, bench_attention.P) == (32, 4, 128, 16)
    bench_attention.set_heads("40x8x64")
    assert (bench_attention.HQ, bench_attention.HKV, bench_attention.D, bench_attention.P) == (40, 8, 64, 16)
    assert bench_attention.token_head_bytes("nvfp4") == 64 // 2 + 64 // 16 + 4
    bench_attention.set_heads("10X2x128x64")
    assert (bench_attention.HQ, bench_attention.HKV, bench_attention.D, bench_attention.P) == (10, 2, 128, 64)
    for bad in ("40x7x128", "32x4", "32x4x128x16x1", "axbxc", "32x0x128"):
        with pytest.raises(ValueError, match="--heads"):
            bench_attention.set_heads(bad)


def test_bench_attention_recorded_command_parses_back():
    """The command a bench_attention JSON records repeats the run: it parses back to the same arguments, with the
    options left at None (the library's choice) omitted instead of written as an unparsable 'None'."""
    import shlex

    import bench_attention
    parser = bench_attention.build_parser()
    for argv in (["--fill-gb", "23", "--nvfp4-variants", "mma4l"],
                 ["--decode-only", "--decode-pdl", "0", "--heads", "64x4x128x16", "--splits", "16,32"]):
        args = parser.parse_args(argv)
        words = shlex.split(bench_attention.recorded_command(args))
        assert words[:2] == ["python", "profiling/bench_attention.py"]
        assert parser.parse_args(words[2:]) == args
        assert ("--decode-pdl" in words) == ("--decode-pdl" in argv)
        assert "None" not in words


def test_decode_ab_arm_syntax():
    """profiling/decode_ab.py's --arm NAME=DIR[:MACRO,...]."""
    import decode_ab
    assert decode_ab.parse_arm("base=.ab_base/cuda/include") == decode_ab.Arm("base", ".ab_base/cuda/include", [])
    assert decode_ab.parse_arm("m=cuda/include:A,B=2") == decode_ab.Arm("m", "cuda/include", ["A", "B=2"])
    for bad in ("cuda/include", "=cuda/include", "x=", "x=:A"):
        with pytest.raises(ValueError, match="--arm"):
            decode_ab.parse_arm(bad)
