"""Paged decode attention (NVFP4 / BF16 pages) vs SDPA over a contiguous BF16 cache vs the copy roofline.

    python profiling/bench_attention.py --out profiling/results/attention_h200.json
    python profiling/bench_attention.py --decode-only --nvfp4-variants mma4l,mma4l_w1s2,mma2_w2s2  # A/B

Issue 5's matrix: Hq=32, Hkv=4, D=128, P=16 (--heads HQxHKVxDxP for another shape, e.g. 40x8x128x16), (B, L) in
(8, 8K), (8, 32K), (4, 128K), (32, 32K), plus a batch at 128K whose NVFP4 cache is --fill-gb GB. Every sequence has
length L; pages are a random permutation (non-contiguous); page contents are random valid NVFP4 / BF16 bytes (the
kernels have no value-dependent branches, and quantizing tens of GB first would cost minutes of device time).
Contenders, in the same run: our NVFP4 paged decode kernels (--nvfp4-variants, JSON keys "nvfp4_<variant>": the
default mma4l and the fallback mma2_w2s2), the BF16 one ("bf16_mma"), torch SDPA over a contiguous BF16 cache (GQA folded into the query length: q [B, Hkv, G, D] against K/V [B, Hkv, L, D],
which lets the flash backend run it), and the copy roofline = bytes / the fastest of three 1 GiB
device copies measured here (graph memcpy node, eager memcpy, elementwise kernel).
Bytes = K and V pages read once (+ q and out). Time = median of CUDA-graph replays rotating over
cache sets (working set >= 4x L2). Also: kv_append bandwidth, extend (prefill) over NVFP4 pages vs
SDPA, and the max batch at 128K on a 141 GB card. --extend-only: kv_gather's bandwidth and extend alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex

import torch
import torch.nn.functional as F

from trace_kernels import attention, kv_cache
from trace_kernels.kv_append import kv_append
from trace_kernels.runtime import multiprocessor_count
from trace_kernels.testing.bench import time_eager, time_graph, variants_for
from trace_kernels.testing.provenance import git_commit, utc_now

HQ, HKV, D, P = 32, 4, 128, 16  # every case's heads and page size: Issue 5's by default, --heads sets them

CASES = ((8, 8192), (8, 32768), (4, 131072), (32, 32768))
GB = 1e9
CARD_BYTES = 141e9
LAYERS_30B = 48  # Qwen3-30B-A3B layers (Hkv=4, D=128)


def set_heads(text: str) -> None:
    """--heads 'HQxHKVxDxP' (the page size optional): the head shape of every case here, and of the decode tools that
    import this module (decode_ab.py, decode_timeline.py)."""
    global HQ, HKV, D, P
    try:
        values = [int(x) for x in text.lower().split("x")]
    except ValueError:
        values = []
    if len(values) not in (3, 4) or min(values) <= 0 or values[0] % values[1]:
        raise ValueError(f"--heads {text!r}: expected HQxHKVxD[xP], positive, HQ a multiple of HKV (e.g. 40x8x128x16)")
    HQ, HKV, D = values[:3]
    P = values[3] if len(values) == 4 else P


def token_head_bytes(fmt: str, d: int | None = None) -> int:
    d = D if d is None else d
    return (d // 2 + d // 16 + 4) if fmt == "nvfp4" else 2 * d


def random_pages(fmt: str, num_pages: int, hkv: int | None = None, d: int | None = None) -> object:
    hkv, d = (HKV if hkv is None else hkv), (D if d is None else d)
    if fmt == "nvfp4":
        shape = (num_pages, P, hkv)
        codes = torch.randint(0, 256, (*shape, d // 2), dtype=torch.uint8, device="cuda")
        # E4M3 bytes 0x30..0x5F: positive normal scales 2^-1 .. 2^4 range, never NaN
        scales = torch.randint(0x30, 0x60, (*shape, d // 16), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        row = torch.rand(shape, device="cuda") * 1e-3 + 1e-4
        return kv_cache.NVFP4Pages(codes, scales, row)
    return kv_cache.BF16Pages(torch.randn(num_pages, P, hkv, d, dtype=torch.bfloat16, device="cuda"))


def make_set(fmt: str, batch: int, length: int, generator: torch.Generator) -> dict:
    pages_per_seq = -(-length // P)
    num_pages = batch * pages_per_seq
    table = torch.randperm(num_pages, generator=generator).view(batch, pages_per_seq).to(torch.int32).cuda()
    return {"k": random_pages(fmt, num_pages), "v": random_pages(fmt, num_pages), "table": table,
            "lengths": torch.full((batch,), length, dtype=torch.int32, device="cuda"),
            "q": torch.randn(batch, HQ, D, dtype=torch.bfloat16, device="cuda")}


def copy_bandwidth(l2: int) -> dict:
    """Device-to-device copy of 1 GiB, read + write bytes per second, three ways; the roofline is the
    fastest. (A copy_ captured in a CUDA graph becomes a memcpy node, which ran at only 2.76 TB/s on
    the H200 on 2026-11-29, below what SDPA reached in the same run; eager copies use the SMs.)"""
    n = 1 << 30  # 1 GiB
    src = [torch.empty(n, dtype=torch.uint8, device="cuda").random_() for _ in range(2)]
    dst = torch.empty(n, dtype=torch.uint8, device="cuda")
    out = {"graph_memcpy": 2 * n / (time_graph(lambda i: dst.copy_(src[i]), 2) * 1e-3),
           "eager_memcpy": 2 * n / (time_eager(lambda i: dst.copy_(src[i]), 2, replays=20) * 1e-3)}
    src32 = [s.view(torch.float32) for s in src]
    dst32 = dst.view(torch.float32)
    out["elementwise_kernel"] = 2 * n / (time_graph(lambda i: torch.mul(src32[i], 1.0, out=dst32), 2) * 1e-3)
    out["roofline"] = max(out.values())
    return out


def bench_paged(fmt: str, batch: int, length: int, l2: int, max_sets: int = 4, variant: str | None = None,
                num_splits: int | None = None) -> dict:
    per_set = 2 * batch * length * HKV * token_head_bytes(fmt)
    sets = variants_for(per_set, l2, max_sets)
    g = torch.Generator().manual_seed(batch * 7 + length)
    data = [make_set(fmt, batch, length, g) for _ in range(sets)]
    fn = lambda i: attention.decode_attention(data[i]["q"], data[i]["k"], data[i]["v"], data[i]["table"],  # noqa: E731
                                              data[i]["lengths"], check_values=False, variant=variant,
                                              num_splits=num_splits)
    ms = time_graph(fn, sets)
    bytes_moved = per_set + 2 * batch * HQ * D * 2
    del data
    torch.cuda.empty_cache()
    return {"ms": ms, "bytes": bytes_moved, "tb_per_s": bytes_moved / (ms * 1e-3) / 1e12, "variant": variant,
            **launch_geometry(fmt, batch, length, variant, num_splits)}


def launch_geometry(fmt: str, batch: int, length: int, variant: str, num_splits: int | None = None) -> dict:
    """The launch decode_attention planned for this case: CTAs per SM (occupancy query), splits, grid."""
    spec, _, plan, resident = attention.decode_launch_plan(fmt, batch, HQ, HKV, D, P, -(-length // P), 0, variant,
                                                           num_splits)
    return {"kernel": spec.name, "threads": spec.launch["threads"], "stages": spec.launch["stages"],
            "ctas_per_sm": resident // multiprocessor_count(0), "splits": plan.splits,
            "tiles_per_split": plan.tiles_per_split, "ctas": batch * spec.launch["ctas_per_split"] * plan.splits}


def ncu_case(batch: int, length: int, variant: str, calls: int = 3) -> None:
    """Launch one decode case a few times, eagerly (a driver for ncu -k ... -c 1)."""
    g = torch.Generator().manual_seed(batch * 7 + length)
    data = make_set("nvfp4", batch, length, g)
    for _ in range(calls):
        attention.decode_attention(data["q"], data["k"], data["v"], data["table"], data["lengths"],
                                   check_values=False, variant=variant)
    torch.cuda.synchronize()
    print(f"ncu case B={batch} L={length} {variant}: {launch_geometry('nvfp4', batch, length, variant)}")


def bench_sdpa(batch: int, length: int, l2: int, max_sets: int = 4) -> dict:
    per_set = 2 * batch * HKV * length * D * 2
    sets = variants_for(per_set, l2, max_sets)
    g = HQ // HKV
    data = [(torch.randn(batch, HKV, g, D, dtype=torch.bfloat16, device="cuda"),
             torch.randn(batch, HKV, length, D, dtype=torch.bfloat16, device="cuda"),
             torch.randn(batch, HKV, length, D, dtype=torch.bfloat16, device="cuda")) for _ in range(sets)]
    ms = time_graph(lambda i: F.scaled_dot_product_attention(*data[i]), sets)
    bytes_moved = per_set + 2 * batch * HQ * D * 2
    del data
    torch.cuda.empty_cache()
    return {"ms": ms, "bytes": bytes_moved, "tb_per_s": bytes_moved / (ms * 1e-3) / 1e12}


# token t -> a random slot (decode: one token per sequence) / slot t (a prefill into consecutive pages) / slot t % P
# of a random page (a prefill into a fragmented cache: pages shuffled, tokens in position order inside each)
APPEND_SLOTS = ("random", "contiguous", "pages")


def append_slot_mapping(slots: str, tokens: int, pages: int) -> torch.Tensor:
    """int64 [tokens] on the GPU: where token t is appended, by pattern (APPEND_SLOTS)."""
    if slots == "contiguous":
        return torch.arange(tokens, device="cuda")
    if slots == "pages":
        t = torch.arange(tokens, device="cuda")
        return torch.randperm(pages, device="cuda")[t // P] * P + t % P
    return torch.randperm(pages * P, device="cuda")[:tokens].contiguous()


def bench_append(fmt: str, tokens: int, guidance: bool, l2: int, variant: str | None = None,
                 slots: str = "random", hkv: int | None = None, d: int | None = None) -> dict:
    hkv, d = (HKV if hkv is None else hkv), (D if d is None else d)
    pages = -(-tokens // P)
    caches = (random_pages(fmt, pages, hkv, d), random_pages(fmt, pages, hkv, d))
    sets = 2
    xs = [(torch.randn(tokens, hkv, d, dtype=torch.bfloat16, device="cuda"),
           torch.randn(tokens, hkv, d, dtype=torch.bfloat16, device="cuda"), append_slot_mapping(slots, tokens, pages))
          for _ in range(sets)]
    fn = lambda i: kv_append(xs[i][0], xs[i][1], xs[i][2], *caches, guidance=guidance, check_values=False,  # noqa: E731
                             variant=variant)
    ms = time_graph(fn, sets)
    rows = 2 * tokens * hkv
    written = rows * token_head_bytes(fmt, d) + (rows * (4 + d // 16 + d // 8) if guidance else 0)
    bytes_moved = rows * d * 2 + written + tokens * 8
    return {"format": fmt, "guidance": guidance, "variant": variant or "default", "tokens": tokens, "slots": slots,
            "hkv": hkv, "d": d, "ms": ms, "bytes": bytes_moved,
            "tb_per_s": bytes_moved / (ms * 1e-3) / 1e12}


def bench_scatter_writes(tokens: int, slots: str) -> dict:
    """What a scattered write costs without kv_append's arithmetic: torch index_copy_ of the rows kv_append
    writes per token (K and V: codes, E4M3 block scales, FP32 row scales of Hkv heads) from contiguous sources
    into NVFP4-sized caches at the same slot pattern (APPEND_SLOTS); bytes = the rows read + written."""
    pages = -(-tokens // P)
    row_bytes = (HKV * D // 2, HKV * D // 16, HKV * 4)
    # 8-byte elements (every row is a multiple of 8 bytes): torch's index kernels move one element per thread
    dsts = [torch.empty(pages * P, n // 8, dtype=torch.int64, device="cuda") for n in row_bytes for _ in range(2)]
    srcs = [torch.randint(-2**62, 2**62, (tokens, d.shape[1]), dtype=torch.int64, device="cuda") for d in dsts]
    maps = [append_slot_mapping(slots, tokens, pages) for _ in range(2)]

    def fn(i):
        for dst, src in zip(dsts, srcs):
            dst.index_copy_(0, maps[i], src)

    ms = time_graph(fn, 2)
    bytes_moved = 2 * sum(src.numel() * 8 for src in srcs) + tokens * 8
    return {"contender": "index_copy_ of the written rows", "tokens": tokens, "slots": slots, "ms": ms,
            "bytes": bytes_moved, "tb_per_s": bytes_moved / (ms * 1e-3) / 1e12}


APPEND_VARIANTS = ("b1", "b2", "b4", "b2_cta128")  # b2_cta128: the default (kv_append.DEFAULT_NVFP4_VARIANT)


def bench_append_variants(l2: int, copy_bw: float, tokens_list=(262144,), variants=APPEND_VARIANTS,
                          slot_patterns=("random",), heads=None) -> list[dict]:
    """kv_append NVFP4 variants (b1, b2 = default, b4: one, two, four blocks per thread; ...; without
    and with guidance) and BF16 pages, at each (kv heads, head_dim), token count and slot pattern
    (APPEND_SLOTS); fraction_of_copy against copy_bw (bytes/s)."""
    rows = []
    for hkv, d in heads or ((HKV, D),):
        for slots in slot_patterns:
            for tokens in tokens_list:
                rows += [bench_append("nvfp4", tokens, g, l2, v, slots, hkv, d) for v in variants for g in (False, True)]
                rows.append(bench_append("bf16", tokens, False, l2, slots=slots, hkv=hkv, d=d))
    for r in rows:
        r["fraction_of_copy"] = r["tb_per_s"] * 1e12 / copy_bw
    return rows


def print_append(rows: list[dict]) -> None:
    for r in rows:
        print(f"kv_append {r['format']:>5} {r['variant']:>7} guidance={r['guidance']!s:5} {r['tokens']:>7} tokens "
              f"{r.get('hkv', HKV)}x{r.get('d', D)} "
              f"{r.get('slots', 'random'):>10} slots: "
              f"{r['ms']:.3f} ms {r['tb_per_s']:.2f} TB/s ({r['fraction_of_copy']:.0%} of copy)")


GATHER_CASES = ((4, 8192), (8, 32768), (32, 32768))  # (B, L) of the kv_gather bandwidth rows
GATHER_ITEMS = (1, 2, 4)  # kv_gather's 16-element blocks per thread (codegen.ops.kv_gather.ITEM_CHOICES)
EXTEND_CASES = ((4, 8192, 1024), (2, 32768, 1024))  # (B, context, new tokens)


def bench_gather(batch: int, length: int, l2: int, items: int) -> dict:
    """kv_gather of every position (BF16 out): NVFP4 K and V pages read once, BF16 K and V written."""
    from trace_kernels.kv_gather import kv_gather
    per_set = 2 * batch * length * HKV * token_head_bytes("nvfp4")
    written = 2 * batch * length * HKV * D * 2
    sets = variants_for(per_set + written, l2, 4)
    g = torch.Generator().manual_seed(batch * 5 + length)
    data = [make_set("nvfp4", batch, length, g) for _ in range(sets)]
    fn = lambda i: kv_gather(data[i]["k"], data[i]["v"], data[i]["table"], data[i]["lengths"],  # noqa: E731
                             check_values=False, items=items)
    ms = time_graph(fn, sets)
    del data
    torch.cuda.empty_cache()
    moved = per_set + written
    return {"batch": batch, "length": length, "items": items, "ms": ms, "bytes": moved,
            "tb_per_s": moved / (ms * 1e-3) / 1e12}


def bench_extend(batch: int, context: int, new: int) -> dict:
    """Prefill of `new` tokens at the end of `context`: extend_attention over NVFP4 pages (kv_gather, and the
    torch gather it replaced: kv_gather_reference run with torch ops on the GPU) vs SDPA over a contiguous BF16
    cache with the same mask, timed eagerly as a caller runs them (one call, then a sync: the Python work before
    each launch counts), and, but for the torch gather (it builds small tensors on the host), as CUDA-graph
    replays (the GPU's time alone)."""
    from trace_kernels import kv_gather as kv_gather_module
    g = torch.Generator().manual_seed(1)
    s = make_set("nvfp4", batch, context, g)
    q = torch.randn(batch, new, HQ, D, dtype=torch.bfloat16, device="cuda")
    ext = lambda i: attention.extend_attention(q, s["k"], s["v"], s["table"], s["lengths"],  # noqa: E731
                                               check_values=False)
    ms_ext = time_eager(ext, 1, replays=10)
    ms_ext_graph = time_graph(ext, 1, replays=10)  # no host work between the launches
    gather = attention.kv_gather
    attention.kv_gather = lambda k, v, t, n, dtype, check_values: kv_gather_module.kv_gather_reference(  # noqa: E731
        k, v, t, n, t.shape[1] * P, dtype)
    try:
        ms_torch = time_eager(ext, 1, replays=10)
    finally:
        attention.kv_gather = gather
    k = torch.randn(batch, HKV, context, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    qt = q.transpose(1, 2).contiguous()
    pos = torch.arange(context, device="cuda")
    mask = (pos[None, :] <= (context - new + torch.arange(new, device="cuda"))[:, None])[None, None]
    sdpa = lambda i: F.scaled_dot_product_attention(qt, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
    ms_sdpa = time_eager(sdpa, 1, replays=10)
    ms_sdpa_graph = time_graph(sdpa, 1, replays=10)
    # The rollout engine's PagedAttention form: one mask per sequence [B, 1, Tq, S], boolean (SDPA converts it on
    # every call) or additive in q's dtype (trace_rl's AttentionMask: built once per step for every layer).
    per_batch = mask.expand(batch, 1, new, context).contiguous()
    additive = torch.where(per_batch, qt.new_zeros(()), float("-inf"))
    sdpa_bool = lambda i: F.scaled_dot_product_attention(qt, k, v, attn_mask=per_batch, enable_gqa=True)  # noqa: E731
    sdpa_add = lambda i: F.scaled_dot_product_attention(qt, k, v, attn_mask=additive, enable_gqa=True)  # noqa: E731
    if not torch.equal(sdpa_bool(0), sdpa_add(0)):
        raise AssertionError("SDPA with the additive mask differs from SDPA with the boolean mask")
    ms_bool_graph, ms_add_graph = time_graph(sdpa_bool, 1, replays=10), time_graph(sdpa_add, 1, replays=10)
    del s, k, v, per_batch, additive
    torch.cuda.empty_cache()
    return {"batch": batch, "context": context, "new_tokens": new, "extend_nvfp4_ms": ms_ext,
            "extend_nvfp4_torch_gather_ms": ms_torch, "sdpa_bf16_contiguous_masked_ms": ms_sdpa,
            "ratio": ms_ext / ms_sdpa, "ratio_torch_gather": ms_torch / ms_sdpa,
            "extend_nvfp4_graph_ms": ms_ext_graph, "sdpa_bf16_contiguous_masked_graph_ms": ms_sdpa_graph,
            "ratio_graph": ms_ext_graph / ms_sdpa_graph,
            "sdpa_per_sequence_bool_mask_graph_ms": ms_bool_graph, "sdpa_per_sequence_additive_mask_graph_ms": ms_add_graph}


def print_gather(gather: list[dict], extend: list[dict]) -> None:
    for r in gather:
        print(f"kv_gather B={r['batch']} L={r['length']} items={r['items']}: {r['ms']:.3f} ms {r['tb_per_s']:.2f} TB/s "
              f"({r['fraction_of_copy']:.0%} of copy)")
    for e in extend:
        print(f"extend {e['batch']} x {e['new_tokens']} new @ {e['context']}: NVFP4 pages {e['extend_nvfp4_ms']:.2f} ms "
              f"(torch gather {e['extend_nvfp4_torch_gather_ms']:.2f}) vs SDPA BF16 "
              f"{e['sdpa_bf16_contiguous_masked_ms']:.2f} ms ({e['ratio']:.2f}x; torch gather {e['ratio_torch_gather']:.2f}x); "
              f"graph-replayed {e['extend_nvfp4_graph_ms']:.2f} vs {e['sdpa_bf16_contiguous_masked_graph_ms']:.2f} ms "
              f"({e['ratio_graph']:.2f}x); SDPA per-sequence mask, bool {e['sdpa_per_sequence_bool_mask_graph_ms']:.3f} vs "
              f"additive {e['sdpa_per_sequence_additive_mask_graph_ms']:.3f} ms")


def max_batch(length: int) -> dict:
    out = {}
    for fmt in ("nvfp4", "bf16"):
        per_layer = 2 * length * HKV * token_head_bytes(fmt)
        out[fmt] = {"bytes_per_seq_per_layer": per_layer,
                    "max_batch_one_layer": int(CARD_BYTES // per_layer),
                    f"max_batch_{LAYERS_30B}_layers_cache_only": int(CARD_BYTES // (per_layer * LAYERS_30B))}
    out["ratio"] = out["nvfp4"]["max_batch_one_layer"] / out["bf16"]["max_batch_one_layer"]
    return out


def key(fmt: str, variant: str) -> str:
    """JSON key of a paged contender. (Results before 2026-12-05 also hold "nvfp4" / "bf16": the removed FP32
    CUDA-core kernel.)"""
    return f"{fmt}_{variant}"


def save(result: dict, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)


def print_decode_table(rows: list, contenders: list) -> None:
    """One line per (case, contender): ms, TB/s, fraction of the copy roofline, speedup over SDPA."""
    for row in rows:
        sdpa = row.get("sdpa_bf16", {})
        if "ms" in sdpa:
            print(f"{row['batch']:>5} {row['length']:>7} | SDPA BF16 {sdpa['ms']:.3f} ms {sdpa['tb_per_s']:.2f} TB/s")
        for name, *_ in contenders:
            r = row.get(name, {})
            if "ms" in r:
                print(f"{row['batch']:>5} {row['length']:>7} | {name:>15} {r['ms']:.3f} ms {r['tb_per_s']:.2f} TB/s "
                      f"{r['fraction_of_copy']:.1%} of copy"
                      + (f", {r['speedup_vs_sdpa']:.2f}x SDPA" if "speedup_vs_sdpa" in r else "")
                      + (f" | {r['ctas_per_sm']} CTAs/SM x {r['threads']} thr, {r['splits']} splits x "
                         f"{r['tiles_per_split']} tiles, {r['ctas']} CTAs" if "ctas_per_sm" in r else ""))
            elif name in row:
                print(f"{row['batch']:>5} {row['length']:>7} | {name:>15} {r.get('error', '?')}")


def expand_variants(text: str) -> list[str]:
    """The comma list of NVFP4 variants, 'configs' expanded to the default, the fallback and
    decode_attention.CONFIG_TEST_VARIANTS."""
    from trace_kernels.codegen.ops import decode_attention
    out = []
    for v in (v for v in text.split(",") if v):
        if v == "configs":
            out += [attention.DEFAULT_NVFP4_VARIANT, attention.NVFP4_FALLBACK_VARIANT,
                    *decode_attention.CONFIG_TEST_VARIANTS]
        else:
            out.append(v)
    return list(dict.fromkeys(out))


def build_kernels(jobs: int, nvfp4_variants: list[str] = (), named_only: bool = False) -> bool:
    """Build (or find in the JIT cache) every decode / append kernel the GPU tests and this benchmark
    launch, plus the NVFP4 variants named (at the benchmark's and the configuration tests' shapes); one line per
    kernel (registers, spills). No GPU needed, so the cache can be filled on a build machine
    (TRACE_KERNELS_CACHE_DIR) and carried. named_only: just the named variants at CONFIG_TEST_SHAPES and the
    combine kernels."""
    import re
    import time

    from trace_kernels import jit, kv_testing
    from trace_kernels.codegen.ops import decode_attention
    from trace_kernels.jit import compiler
    start = time.time()
    if named_only:
        specs = [decode_attention.combine_spec(d) for d in decode_attention.HEAD_DIMS]
        configured = nvfp4_variants
    else:
        specs = kv_testing.kernel_specs()
        configured = nvfp4_variants
    specs += [decode_attention.spec("nvfp4", hq, hkv, d, p, v) for v in configured
              for hq, hkv, d, p in decode_attention.CONFIG_TEST_SHAPES]
    if not named_only and (HQ, HKV, D, P) not in kv_testing.TEST_SHAPES:  # a --heads shape of its own
        specs += [decode_attention.spec("nvfp4", HQ, HKV, D, P, v) for v in nvfp4_variants]
        specs += [decode_attention.spec("nvfp4", HQ, HKV, D, P, attention.default_variant("nvfp4", HQ, HKV, D, P)),
                  decode_attention.spec("bf16", HQ, HKV, D, P, "mma"), decode_attention.combine_spec(D)]
    specs = list({s.name: s for s in specs}.values())
    ok = True
    for spec, entry in zip(specs, jit.build_all(specs, jobs=jobs, keep_going=True)):
        if isinstance(entry, Exception):
            ok = False
            print(f"{spec.name}: BUILD FAILED {str(entry)[-1500:]}")
            continue
        text = (entry.folder / "ptxas.txt").read_text()
        r = compiler.parse_ptxas(text)
        smem = max((int(m) for m in re.findall(r"(\d+) bytes smem", text)), default=0)
        print(f"{spec.name}: {r.registers} registers, {r.spill_stores}/{r.spill_loads} B spill st/ld, "
              f"{r.stack_frame} B stack, {smem} B smem")
    print(f"{len(specs)} kernels built or found in the cache in {time.time() - start:.1f}s")
    return ok


def recorded_command(args: argparse.Namespace) -> str:
    """The command line that repeats this run: every option with its value, flags only when set, options left at
    None (their default: the library's choice) omitted, so that the line parses back to the same arguments."""
    words = ["python", "profiling/bench_attention.py"]
    for name, value in vars(args).items():
        option = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            words += [option] if value else []
        elif value is not None:
            words += [option, shlex.quote(str(value))]
    return " ".join(words)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="profiling/results/attention_h200.json")
    parser.add_argument("--fill-gb", type=float, default=40.0, help="NVFP4 cache size of the memory-filling case")
    parser.add_argument("--quick", action="store_true", help="first two cases only")
    parser.add_argument("--decode-only", action="store_true",
                        help="the four decode cases only (no memory-filling batch, kv_append, extend)")
    parser.add_argument("--nvfp4-variants", default="mma4l,mma2_w2s2",
                        help="comma list of NVFP4 decode kernels; 'configs' = the default, the fallback and "
                             "decode_attention.CONFIG_TEST_VARIANTS (e.g. mma4l_w1s2: 1 warp per kv head, 2 stages)")
    parser.add_argument("--build-named-only", action="store_true",
                        help="with --build-only: only the --nvfp4-variants kernels (CONFIG_TEST_SHAPES) and the "
                             "combine")
    parser.add_argument("--ncu-case", default="", metavar="B,L",
                        help="only launch the NVFP4 decode of one case 3 times with the first --nvfp4-variants "
                             "kernel (a driver for ncu) and exit")
    parser.add_argument("--bf16-variants", default="mma", help="comma list of BF16 decode kernels")
    parser.add_argument("--splits", default="", metavar="S,...",
                        help="also time each NVFP4 variant at these split counts (num_splits; contender "
                             "nvfp4_<variant>_s<S>) besides the planned one")
    parser.add_argument("--append-only", action="store_true",
                        help="only kv_append (the --append-variants with and without guidance, BF16) at 64K and 256K tokens")
    parser.add_argument("--append-slots", default="random",
                        help="comma list of slot patterns for --append-only: random (decode), contiguous (prefill), "
                             "pages (prefill into shuffled pages)")
    parser.add_argument("--heads", default=f"{HQ}x{HKV}x{D}x{P}", metavar="HQxHKVxDxP",
                        help="q heads, kv heads, head_dim and page size of every case (default: Issue 5's; e.g. "
                             "40x8x128x16 for Llama 4's attention)")
    parser.add_argument("--append-heads", default="",
                        help="comma list of KVHEADSxHEAD_DIM for --append-only (default: the --heads shape's; e.g. "
                             "4x128,8x64: the same elements per token, FP32 row scales of 16 vs 32 bytes per token)")
    parser.add_argument("--append-variants", default=",".join(APPEND_VARIANTS),
                        help="comma list of NVFP4 kv_append variants (kv_append.py: b1, b2, b4, + p, + _cta128, ...)")
    parser.add_argument("--extend-only", action="store_true",
                        help="only kv_gather (GATHER_CASES x GATHER_ITEMS) and extend_attention (EXTEND_CASES)")
    parser.add_argument("--build-only", type=int, default=0, metavar="JOBS",
                        help="only build the kernels (JOBS parallel nvcc) and exit; no GPU needed")
    parser.add_argument("--decode-pdl", type=int, choices=(0, 1), default=None,
                        help="launch the decode kernels as programmatic dependents (1) or not (0); default: the "
                             "library's (attention.DECODE_PDL)")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    try:
        set_heads(args.heads)
    except ValueError as error:
        parser.error(str(error))
    args.append_heads = args.append_heads or f"{HKV}x{D}"
    if args.decode_pdl is not None:
        attention.DECODE_PDL = bool(args.decode_pdl)
    nvfp4_variants = expand_variants(args.nvfp4_variants)
    if args.build_only:
        raise SystemExit(0 if build_kernels(args.build_only, nvfp4_variants, args.build_named_only) else 1)
    if args.ncu_case:
        batch, length = (int(x) for x in args.ncu_case.split(","))
        ncu_case(batch, length, nvfp4_variants[0])
        return
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    copies = copy_bandwidth(l2)
    copy_bw = copies["roofline"]
    print(f"{props.name}: copy {copy_bw / 1e12:.2f} TB/s (read + write; "
          + ", ".join(f"{k} {v / 1e12:.2f}" for k, v in copies.items()) + ")", flush=True)

    if args.append_only:
        patterns = [s for s in args.append_slots.split(",") if s]
        if any(s not in APPEND_SLOTS for s in patterns):
            parser.error(f"--append-slots: each of {APPEND_SLOTS}")
        heads = [tuple(int(x) for x in h.split("x")) for h in args.append_heads.split(",") if h]
        append = bench_append_variants(l2, copy_bw, (65536, 262144), args.append_variants.split(","), patterns, heads)
        scatter = [bench_scatter_writes(262144, s) for s in patterns]
        for r in scatter:
            r["fraction_of_copy"] = r["tb_per_s"] * 1e12 / copy_bw
            print(f"scatter writes ({r['contender']}) {r['tokens']} tokens {r['slots']:>10} slots: {r['ms']:.3f} ms "
                  f"{r['tb_per_s']:.2f} TB/s ({r['fraction_of_copy']:.0%} of copy)")
        save({"gpu": props.name, "date": utc_now(), "commit": git_commit(), "torch": torch.__version__,
              "command": f"python profiling/bench_attention.py --append-only --append-variants {args.append_variants} "
                         f"--append-slots {args.append_slots} --heads {args.heads} --append-heads {args.append_heads} "
                         f"--out {args.out}",
              "shape": {"hq": HQ, "hkv": HKV, "d": D, "page": P}, "copy_tb_per_s": copy_bw / 1e12,
              "kv_append": append, "scatter_writes": scatter}, args.out)
        print_append(append)
        return
    if args.extend_only:
        gather = [bench_gather(b, n, l2, items) for b, n in GATHER_CASES for items in GATHER_ITEMS]
        for r in gather:
            r["fraction_of_copy"] = r["tb_per_s"] * 1e12 / copy_bw
        extend = [bench_extend(*case) for case in EXTEND_CASES]
        save({"gpu": props.name, "date": utc_now(), "commit": git_commit(), "torch": torch.__version__,
              "command": f"python profiling/bench_attention.py --extend-only --heads {args.heads} --out {args.out}",
              "shape": {"hq": HQ, "hkv": HKV, "d": D, "page": P}, "copy_tb_per_s": copy_bw / 1e12,
              "kv_gather": gather, "extend": extend}, args.out)
        print_gather(gather, extend)
        return
    fill_batch = int(args.fill_gb * GB // (2 * 131072 * HKV * token_head_bytes("nvfp4")))
    cases = list(CASES[:2] if args.quick else CASES) + ([] if args.decode_only else [(fill_batch, 131072)])
    bf16_variants = [v for v in args.bf16_variants.split(",") if v]
    split_counts = [int(x) for x in args.splits.split(",") if x]
    contenders = [(key("nvfp4", v), "nvfp4", v, None) for v in nvfp4_variants]
    contenders += [(f"{key('nvfp4', v)}_s{n}", "nvfp4", v, n) for v in nvfp4_variants for n in split_counts]
    contenders += [(key("bf16", v), "bf16", v, None) for v in bf16_variants]
    rows = []
    result = {"gpu": props.name, "date": utc_now(),
              "commit": git_commit(), "torch": torch.__version__,
              "command": recorded_command(args),
              "shape": {"hq": HQ, "hkv": HKV, "d": D, "page": P}, "copy_tb_per_s": copy_bw / 1e12,
              "copy_variants_tb_per_s": {k: v / 1e12 for k, v in copies.items()}, "decode": rows}
    for batch, length in cases:
        row = {"batch": batch, "length": length}
        sets = 2 if batch == fill_batch else 4
        runs = [(name, (lambda f=fmt, v=variant, n=splits: bench_paged(f, batch, length, l2,
                                                                         sets if f == "nvfp4" else 4, v, n)))
                for name, fmt, variant, splits in contenders]
        for name, fn in runs + [("sdpa_bf16", lambda: bench_sdpa(batch, length, l2))]:
            if batch == fill_batch and not name.startswith("nvfp4"):
                # the BF16 cache of this batch would need 3.4x the memory; time BF16 at the same bytes instead
                continue
            try:
                r = fn()
            except torch.cuda.OutOfMemoryError as error:
                r = {"error": f"out of memory: {str(error)[:120]}"}
                torch.cuda.empty_cache()
            except Exception as error:  # one failing variant (build, launch) must not cost the others' numbers
                r = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            if "ms" in r:
                r["roofline_ms"] = r["bytes"] / copy_bw * 1e3
                r["fraction_of_copy"] = r["roofline_ms"] / r["ms"]
            row[name] = r
        if "ms" in row.get("sdpa_bf16", {}):
            for name, *_ in contenders:
                if "ms" in row.get(name, {}):
                    row[name]["speedup_vs_sdpa"] = row["sdpa_bf16"]["ms"] / row[name]["ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        save(result, args.out)  # after every case: a time limit cannot cost the cases already measured

    if args.decode_only:
        print_decode_table(rows, contenders)
        return

    append = bench_append_variants(l2, copy_bw)
    extend = [bench_extend(*case) for case in EXTEND_CASES]
    result.update({"kv_append": append, "extend": extend, "max_batch_128k": max_batch(131072)})
    save(result, args.out)

    print_decode_table(rows, contenders)
    print_append(append)
    print_gather([], extend)
    mb = result["max_batch_128k"]
    print(f"max batch @128K on 141 GB, one layer: NVFP4 {mb['nvfp4']['max_batch_one_layer']} vs BF16 "
          f"{mb['bf16']['max_batch_one_layer']} ({mb['ratio']:.2f}x); {LAYERS_30B} layers, cache only: "
          f"{mb['nvfp4'][f'max_batch_{LAYERS_30B}_layers_cache_only']} vs {mb['bf16'][f'max_batch_{LAYERS_30B}_layers_cache_only']}")


if __name__ == "__main__":
    main()
