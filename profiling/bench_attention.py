"""Paged decode attention (NVFP4 / BF16 pages) vs SDPA over a contiguous BF16 cache vs the copy roofline.

    python profiling/bench_attention.py --out profiling/results/attention_h200.json

Issue 5's matrix: Hq=32, Hkv=4, D=128, P=16, (B, L) in (8, 8K), (8, 32K), (4, 128K), (32, 32K), plus
a batch at 128K whose NVFP4 cache is --fill-gb GB. Every sequence has length L; pages are a random
permutation (non-contiguous); page contents are random valid NVFP4 / BF16 bytes (the kernels have no
value-dependent branches, and quantizing tens of GB first would cost minutes of device time).
Contenders, in the same run: our NVFP4 and BF16 paged decode, each as the CUDA-core kernel (JSON keys
"nvfp4", "bf16"), the tensor-core kernel ("nvfp4_mma", "bf16_mma") and, NVFP4 only, the tensor-core
kernel with tokens as MMA rows ("nvfp4_mma2"), torch SDPA over a
contiguous BF16 cache (GQA folded into the query length: q [B, Hkv, G, D] against K/V [B, Hkv, L, D],
which lets the flash backend run it), and the copy roofline = bytes / the fastest of three 1 GiB
device copies measured here (graph memcpy node, eager memcpy, elementwise kernel).
Bytes = K and V pages read once (+ q and out). Time = median of CUDA-graph replays rotating over
cache sets (working set >= 4x L2). Also: kv_append bandwidth, extend (prefill) over NVFP4 pages vs
SDPA, and the max batch at 128K on a 141 GB card.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
import torch.nn.functional as F

from trace_kernels import attention, kv_cache
from trace_kernels.kv_append import kv_append
from trace_kernels.testing.bench import time_eager, time_graph, variants_for
from trace_kernels.testing.provenance import git_commit, utc_now

HQ, HKV, D, P = 32, 4, 128, 16
CASES = ((8, 8192), (8, 32768), (4, 131072), (32, 32768))
GB = 1e9
CARD_BYTES = 141e9
LAYERS_30B = 48  # Qwen3-30B-A3B layers (Hkv=4, D=128)


def token_head_bytes(fmt: str) -> int:
    return (D // 2 + D // 16 + 4) if fmt == "nvfp4" else 2 * D


def random_pages(fmt: str, num_pages: int) -> object:
    if fmt == "nvfp4":
        shape = (num_pages, P, HKV)
        codes = torch.randint(0, 256, (*shape, D // 2), dtype=torch.uint8, device="cuda")
        # E4M3 bytes 0x30..0x5F: positive normal scales 2^-1 .. 2^4 range, never NaN
        scales = torch.randint(0x30, 0x60, (*shape, D // 16), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        row = torch.rand(shape, device="cuda") * 1e-3 + 1e-4
        return kv_cache.NVFP4Pages(codes, scales, row)
    return kv_cache.BF16Pages(torch.randn(num_pages, P, HKV, D, dtype=torch.bfloat16, device="cuda"))


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


def bench_paged(fmt: str, batch: int, length: int, l2: int, max_sets: int = 4, variant: str = "simt") -> dict:
    per_set = 2 * batch * length * HKV * token_head_bytes(fmt)
    sets = variants_for(per_set, l2, max_sets)
    g = torch.Generator().manual_seed(batch * 7 + length)
    data = [make_set(fmt, batch, length, g) for _ in range(sets)]
    fn = lambda i: attention.decode_attention(data[i]["q"], data[i]["k"], data[i]["v"], data[i]["table"],  # noqa: E731
                                              data[i]["lengths"], check_values=False, variant=variant)
    ms = time_graph(fn, sets)
    bytes_moved = per_set + 2 * batch * HQ * D * 2
    del data
    torch.cuda.empty_cache()
    return {"ms": ms, "bytes": bytes_moved, "tb_per_s": bytes_moved / (ms * 1e-3) / 1e12}


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


def bench_append(fmt: str, tokens: int, guidance: bool, l2: int, variant: str | None = None) -> dict:
    pages = -(-tokens // P)
    caches = (random_pages(fmt, pages), random_pages(fmt, pages))
    sets = 2
    xs = [(torch.randn(tokens, HKV, D, dtype=torch.bfloat16, device="cuda"),
           torch.randn(tokens, HKV, D, dtype=torch.bfloat16, device="cuda"),
           torch.randperm(pages * P, device="cuda")[:tokens].contiguous()) for _ in range(sets)]
    fn = lambda i: kv_append(xs[i][0], xs[i][1], xs[i][2], *caches, guidance=guidance, check_values=False,  # noqa: E731
                             variant=variant)
    ms = time_graph(fn, sets)
    rows = 2 * tokens * HKV
    written = rows * token_head_bytes(fmt) + (rows * (4 + D // 16 + D // 8) if guidance else 0)
    bytes_moved = rows * D * 2 + written + tokens * 8
    return {"format": fmt, "guidance": guidance, "variant": variant or "default", "tokens": tokens, "ms": ms,
            "bytes": bytes_moved,
            "tb_per_s": bytes_moved / (ms * 1e-3) / 1e12}


def bench_extend(batch: int, context: int, new: int) -> dict:
    """Prefill of `new` tokens at the end of `context`: extend_attention over NVFP4 pages vs SDPA over a
    contiguous BF16 cache with the same mask (both timed eagerly, as a caller runs them)."""
    g = torch.Generator().manual_seed(1)
    s = make_set("nvfp4", batch, context, g)
    q = torch.randn(batch, new, HQ, D, dtype=torch.bfloat16, device="cuda")
    ext = lambda i: attention.extend_attention(q, s["k"], s["v"], s["table"], s["lengths"],  # noqa: E731
                                               check_values=False)
    ms_ext = time_eager(ext, 1, replays=10)  # eager: the reference gather builds small tensors on the host
    k = torch.randn(batch, HKV, context, D, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    qt = q.transpose(1, 2).contiguous()
    pos = torch.arange(context, device="cuda")
    mask = (pos[None, :] <= (context - new + torch.arange(new, device="cuda"))[:, None])[None, None]
    sdpa = lambda i: F.scaled_dot_product_attention(qt, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
    ms_sdpa = time_eager(sdpa, 1, replays=10)
    return {"batch": batch, "context": context, "new_tokens": new, "extend_nvfp4_ms": ms_ext,
            "sdpa_bf16_contiguous_masked_ms": ms_sdpa, "ratio": ms_ext / ms_sdpa}


def max_batch(length: int) -> dict:
    out = {}
    for fmt in ("nvfp4", "bf16"):
        per_layer = 2 * length * HKV * token_head_bytes(fmt)
        out[fmt] = {"bytes_per_seq_per_layer": per_layer,
                    "max_batch_one_layer": int(CARD_BYTES // per_layer),
                    f"max_batch_{LAYERS_30B}_layers_cache_only": int(CARD_BYTES // (per_layer * LAYERS_30B))}
    out["ratio"] = out["nvfp4"]["max_batch_one_layer"] / out["bf16"]["max_batch_one_layer"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="profiling/results/attention_h200.json")
    parser.add_argument("--fill-gb", type=float, default=40.0, help="NVFP4 cache size of the memory-filling case")
    parser.add_argument("--quick", action="store_true", help="first two cases only")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    copies = copy_bandwidth(l2)
    copy_bw = copies["roofline"]
    print(f"{props.name}: copy {copy_bw / 1e12:.2f} TB/s (read + write; "
          + ", ".join(f"{k} {v / 1e12:.2f}" for k, v in copies.items()) + ")", flush=True)

    fill_batch = int(args.fill_gb * GB // (2 * 131072 * HKV * token_head_bytes("nvfp4")))
    cases = list(CASES[:2] if args.quick else CASES) + [(fill_batch, 131072)]
    rows = []
    for batch, length in cases:
        row = {"batch": batch, "length": length}
        sets = 2 if batch == fill_batch else 4
        for name, fn in (("nvfp4", lambda: bench_paged("nvfp4", batch, length, l2, sets)),
                         ("nvfp4_mma", lambda: bench_paged("nvfp4", batch, length, l2, sets, "mma")),
                         ("nvfp4_mma2", lambda: bench_paged("nvfp4", batch, length, l2, sets, "mma2")),
                         ("bf16", lambda: bench_paged("bf16", batch, length, l2)),
                         ("bf16_mma", lambda: bench_paged("bf16", batch, length, l2, 4, "mma")),
                         ("sdpa_bf16", lambda: bench_sdpa(batch, length, l2))):
            if batch == fill_batch and not name.startswith("nvfp4"):
                # the BF16 cache of this batch would need 3.4x the memory; time BF16 at the same bytes instead
                continue
            try:
                r = fn()
            except torch.cuda.OutOfMemoryError as error:
                r = {"error": f"out of memory: {str(error)[:120]}"}
                torch.cuda.empty_cache()
            if "ms" in r:
                r["roofline_ms"] = r["bytes"] / copy_bw * 1e3
                r["fraction_of_copy"] = r["roofline_ms"] / r["ms"]
            row[name] = r
        if "ms" in row.get("sdpa_bf16", {}):
            for name in ("nvfp4", "nvfp4_mma", "nvfp4_mma2", "bf16", "bf16_mma"):
                if "ms" in row.get(name, {}):
                    row[name]["speedup_vs_sdpa"] = row["sdpa_bf16"]["ms"] / row[name]["ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)

    append = [bench_append("nvfp4", 262144, g, l2) for g in (False, True)] + [bench_append("bf16", 262144, False, l2)]
    append += [bench_append("nvfp4", 262144, g, l2, "b2") for g in (False, True)]  # A/B: two blocks per thread
    for r in append:
        r["fraction_of_copy"] = r["tb_per_s"] * 1e12 / copy_bw
    extend = bench_extend(4, 8192, 1024)
    result = {"gpu": props.name, "date": utc_now(),
              "commit": git_commit(), "torch": torch.__version__,
              "command": "python profiling/bench_attention.py " + " ".join(
                  f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool) else (f"--{k}" if v else "")
                  for k, v in vars(args).items()).strip(),
              "shape": {"hq": HQ, "hkv": HKV, "d": D, "page": P}, "copy_tb_per_s": copy_bw / 1e12,
              "copy_variants_tb_per_s": {k: v / 1e12 for k, v in copies.items()},
              "decode": rows, "kv_append": append, "extend": extend, "max_batch_128k": max_batch(131072)}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)

    print(f"\n{'B':>5} {'L':>7} | {'NVFP4 simt ms':>13} {'TB/s':>5} {'%copy':>6} {'xSDPA':>6} | {'NVFP4 mma ms':>12} "
          f"{'TB/s':>5} {'%copy':>6} {'xSDPA':>6} | {'BF16 ms':>8} {'TB/s':>5} {'xSDPA':>6} | {'BF16 mma':>8} {'TB/s':>5} {'xSDPA':>6} | "
          f"{'SDPA ms':>8} {'TB/s':>5}")
    for row in rows:
        n, m, b, bm, s = (row.get(k, {}) for k in ("nvfp4", "nvfp4_mma", "bf16", "bf16_mma", "sdpa_bf16"))
        f = lambda r, k, fmt: format(r[k], fmt) if k in r else "-"  # noqa: E731
        print(f"{row['batch']:>5} {row['length']:>7} | {f(n, 'ms', '13.3f')} {f(n, 'tb_per_s', '5.2f')} "
              f"{f(n, 'fraction_of_copy', '6.1%')} {f(n, 'speedup_vs_sdpa', '6.2f')} | {f(m, 'ms', '12.3f')} "
              f"{f(m, 'tb_per_s', '5.2f')} {f(m, 'fraction_of_copy', '6.1%')} {f(m, 'speedup_vs_sdpa', '6.2f')} | "
              f"{f(b, 'ms', '8.3f')} {f(b, 'tb_per_s', '5.2f')} {f(b, 'speedup_vs_sdpa', '6.2f')} | "
              f"{f(bm, 'ms', '8.3f')} {f(bm, 'tb_per_s', '5.2f')} {f(bm, 'speedup_vs_sdpa', '6.2f')} | "
              f"{f(s, 'ms', '8.3f')} {f(s, 'tb_per_s', '5.2f')}")
    for row in rows:  # the tokens-as-rows NVFP4 kernel (A/B against nvfp4_mma above)
        m2 = row.get("nvfp4_mma2", {})
        if "ms" in m2:
            print(f"{row['batch']:>5} {row['length']:>7} | NVFP4 mma2 {m2['ms']:.3f} ms {m2['tb_per_s']:.2f} TB/s "
                  f"{m2['fraction_of_copy']:.1%} of copy, {m2.get('speedup_vs_sdpa', float('nan')):.2f}x SDPA")
    for r in append:
        print(f"kv_append {r['format']:>5} {r['variant']:>7} guidance={r['guidance']!s:5}: {r['ms']:.3f} ms {r['tb_per_s']:.2f} TB/s "
              f"({r['fraction_of_copy']:.0%} of copy)")
    print(f"extend 4 x 1024 new @ 8K: NVFP4 pages {extend['extend_nvfp4_ms']:.2f} ms vs SDPA BF16 "
          f"{extend['sdpa_bf16_contiguous_masked_ms']:.2f} ms ({extend['ratio']:.2f}x)")
    mb = result["max_batch_128k"]
    print(f"max batch @128K on 141 GB, one layer: NVFP4 {mb['nvfp4']['max_batch_one_layer']} vs BF16 "
          f"{mb['bf16']['max_batch_one_layer']} ({mb['ratio']:.2f}x); {LAYERS_30B} layers, cache only: "
          f"{mb['nvfp4'][f'max_batch_{LAYERS_30B}_layers_cache_only']} vs {mb['bf16'][f'max_batch_{LAYERS_30B}_layers_cache_only']}")


if __name__ == "__main__":
    main()
