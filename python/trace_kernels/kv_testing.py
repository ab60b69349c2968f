"""Random paged-KV test cases (shared by the CPU and GPU tests and the attention benchmark).

A case has shuffled, non-contiguous pages per sequence, unused block-table entries set to a page
that does not exist (so reading one is an error), and K/V with per-token magnitudes spread over
a few orders so row scales differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_kernels import kv_cache, kv_codes

UNUSED_PAGE = 2**30  # block-table filler beyond a sequence's pages: never a valid page


@dataclass
class PagedCase:
    q: torch.Tensor  # bf16 [B, Hq, D]
    k: list[torch.Tensor]  # per sequence bf16 [len, Hkv, D]
    v: list[torch.Tensor]
    k_cache: object
    v_cache: object
    block_table: torch.Tensor  # int32 [B, max_pages]
    lengths: torch.Tensor  # int32 [B]
    slot_mapping: torch.Tensor  # int64 [sum(len)]: the slots of cat(k) in sequence order

    @property
    def k_all(self) -> torch.Tensor:
        return torch.cat(self.k)  # [sum(len), Hkv, D]

    @property
    def v_all(self) -> torch.Tensor:
        return torch.cat(self.v)


def random_rows(n: int, heads: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """bf16 [n, heads, D]: normal values times a per-row magnitude in [e^-2, e^2]."""
    x = torch.randn(n, heads, d, generator=generator)
    magnitude = torch.exp(torch.rand(n, heads, 1, generator=generator) * 4 - 2)
    return (x * magnitude).to(torch.bfloat16)


def make_case(lengths: list[int], q_heads: int, kv_heads: int, head_dim: int, page_size: int, cache_format: str,
              *, seed: int = 0, spare_pages: int = 3, extra_table_pages: int = 1, fill: bool = True) -> PagedCase:
    """A CPU case; call .to(device) parts yourself. fill=False leaves the pages zero (append tests)."""
    g = torch.Generator().manual_seed(seed)
    pages_per_seq = [-(-n // page_size) for n in lengths]
    num_pages = sum(pages_per_seq) + spare_pages
    order = torch.randperm(num_pages, generator=g)  # shuffled: pages of a sequence are scattered
    max_pages = max(pages_per_seq) + extra_table_pages
    table = torch.full((len(lengths), max_pages), UNUSED_PAGE, dtype=torch.int32)
    slots = []
    used = 0
    for b, (n, count) in enumerate(zip(lengths, pages_per_seq)):
        pages = order[used:used + count]
        used += count
        table[b, :count] = pages.to(torch.int32)
        pos = torch.arange(n)
        slots.append(pages[pos // page_size].long() * page_size + pos % page_size)
    alloc = kv_cache.allocate_nvfp4_pages if cache_format == "nvfp4" else kv_cache.allocate_bf16_pages
    k_cache = alloc(num_pages, page_size, kv_heads, head_dim)
    v_cache = alloc(num_pages, page_size, kv_heads, head_dim)
    k = [random_rows(n, kv_heads, head_dim, g) for n in lengths]
    v = [random_rows(n, kv_heads, head_dim, g) for n in lengths]
    q = (torch.randn(len(lengths), q_heads, head_dim, generator=g) * 1.5).to(torch.bfloat16)
    case = PagedCase(q, k, v, k_cache, v_cache, table, torch.tensor(lengths, dtype=torch.int32),
                     torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64))
    if fill:
        from trace_kernels.kv_append import kv_append_reference
        kv_append_reference(case.k_all, case.v_all, case.slot_mapping, k_cache, v_cache)
    return case


def pages_to(pages, device):
    """A copy of NVFP4Pages / BF16Pages on device."""
    if kv_cache.is_nvfp4(pages):
        return kv_cache.NVFP4Pages(pages.codes.to(device), pages.block_scales.to(device), pages.scale.to(device))
    return kv_cache.BF16Pages(pages.data.to(device))


def naive_attention_fp64(case: PagedCase, softmax_scale: float | None = None) -> torch.Tensor:
    """Per-sequence FP64 attention written independently of trace_kernels.attention: f64 [B, Hq, D].

    Dequantizes each used slot with its own E2M1 table and E4M3 decode, in float64.
    """
    from trace_kernels import nvfp4
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
    b_count, hq, d = case.q.shape
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(b_count, hq, d, dtype=torch.float64)
    for b in range(b_count):
        n = int(case.lengths[b])
        pos = torch.arange(n)
        page_size = (case.k_cache.codes if kv_cache.is_nvfp4(case.k_cache) else case.k_cache.data).shape[1]
        slots = case.block_table[b].long()[pos // page_size] * page_size + pos % page_size

        def read(pages):
            if not kv_cache.is_nvfp4(pages):
                return pages.data.flatten(0, 1)[slots].double()  # [n, Hkv, D]
            codes = nvfp4.unpack_codes(kv_codes.decode_codes(pages.codes.flatten(0, 1)[slots]))  # [n, Hkv, D]
            values = e2m1[codes.long()]
            block = pages.block_scales.flatten(0, 1)[slots].to(torch.float64)  # [n, Hkv, D/16]
            row = pages.scale.flatten(0, 1)[slots].double()  # [n, Hkv]
            return values * block.repeat_interleave(16, dim=-1) * row[..., None]

        keys, values = read(case.k_cache), read(case.v_cache)
        group = hq // keys.shape[1]
        for h in range(hq):
            s = keys[:, h // group, :] @ case.q[b, h].double() * scale  # [n]
            p = torch.exp(s - s.max())
            out[b, h] = (p / p.sum()) @ values[:, h // group, :]
    return out


# Kernel shapes the GPU tests and bench_attention.py launch: (Hq, Hkv, D, P)
TEST_SHAPES = ((8, 8, 64, 16), (16, 4, 128, 16), (32, 4, 128, 64), (8, 1, 64, 64), (64, 4, 128, 16),
               (32, 4, 128, 16), (10, 2, 128, 16), (24, 2, 64, 64))
APPEND_SHAPES = ((2, 64), (4, 128), (8, 128), (2, 256))  # (Hkv, D); 2 x 256: Qwen3-Next's heads (append and
# gather take head_dim 256, the decode kernels do not)
APPEND_VARIANTS = ("b2", "b4", "b2_cta128", "b2_cta128_mb12")  # NVFP4 variants the GPU tests launch (+ b1)


GATHER_SHAPES = APPEND_SHAPES  # (Hkv, D) of the kv_gather GPU tests (4, 128: the benchmark's)


def kernel_specs() -> list:
    """Every KV kernel the GPU tests and the attention benchmark launch (to build them in parallel)."""
    from trace_kernels.codegen.ops import decode_attention, kv_append as kv_codegen, kv_gather as gather_codegen
    specs = []
    for hq, hkv, d, p in TEST_SHAPES:
        specs += [decode_attention.spec("nvfp4", hq, hkv, d, p, "mma2_w2s2"),
                  decode_attention.spec("nvfp4", hq, hkv, d, p, "mma4l"),
                  decode_attention.spec("bf16", hq, hkv, d, p, "mma")]
    specs += [decode_attention.spec("nvfp4", *shape, v) for shape in decode_attention.CONFIG_TEST_SHAPES
              for v in decode_attention.CONFIG_TEST_VARIANTS]
    specs += [decode_attention.spec("nvfp4", *shape, v) for shape in decode_attention.WIDE_TEST_SHAPES
              for v in (*decode_attention.WIDE_TEST_VARIANTS, "mma4l")]  # mma4l: what the wide tests compare with
    specs += [decode_attention.combine_spec(d) for d in (64, 128)]
    specs += [kv_codegen.spec(f, hkv, d) for f in ("nvfp4", "bf16") for hkv, d in APPEND_SHAPES]
    specs += [kv_codegen.spec("nvfp4", hkv, d, v) for hkv, d in APPEND_SHAPES for v in APPEND_VARIANTS
              if (d // 16) % kv_codegen.VARIANTS[v.split("_")[0]] == 0]  # whole blocks per thread
    specs += [gather_codegen.spec(t, hkv, d, items) for hkv, d in GATHER_SHAPES for t in gather_codegen.OUT_DTYPES
              for items in gather_codegen.ITEM_CHOICES]
    return list({s.name: s for s in specs}.values())


def build_report(jobs: int = 16) -> list[str]:
    """Build kernel_specs() into the JIT cache; one line per kernel: registers, spills, stack, smem."""
    import re

    from trace_kernels import jit
    from trace_kernels.jit import compiler
    lines = []
    for spec, entry in zip(kernel_specs(), jit.build_all(kernel_specs(), jobs=jobs, keep_going=True)):
        if isinstance(entry, Exception):
            lines.append(f"{spec.name}: BUILD FAILED {entry}")
            continue
        text = (entry.folder / "ptxas.txt").read_text()
        r = compiler.parse_ptxas(text)
        smem = max((int(m) for m in re.findall(r"(\d+) bytes smem", text)), default=0)
        lines.append(f"{spec.name}: {r.registers} registers, {r.spill_stores}/{r.spill_loads} B spill st/ld, "
                     f"{r.stack_frame} B stack, {smem} B smem")
    return lines
