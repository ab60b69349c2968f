"""Codegen for the NVFP4 MoE grouped GEMMs (gate_up with fused SwiGLU-quantize, down with combine).

Per model shape and per token-tile width TN (the wgmma N dimension; tokens are the narrow side of
the swap-AB GEMM) this renders templates/moe_gemm.cu.jinja, plus one combine kernel. Which TN a
call uses comes from TILE_TABLE, by the average number of routed rows per expert.
"""

from __future__ import annotations

from dataclasses import dataclass

from trace_kernels.codegen.registry import OpCodegen
from trace_kernels.codegen.spec import KernelSpec, kernel_name
from trace_kernels.shapes import ModelShape

HEADERS = ("trace_kernels/moe_gemm.cuh", "trace_kernels/moe_nvfp4_row.cuh")
CHUNK_K = 64  # K per pipeline stage (must match detail::kChunkK)


@dataclass(frozen=True)
class TileConfig:
    tile_tokens: int  # wgmma N: routed rows (token slots) per CTA
    stages: int  # cp.async ring depth over K chunks of 64
    min_blocks: int = 2  # __launch_bounds__ min CTAs per SM (2 caps registers at 128: overlap dequant and MMA)
    warpgroups: int = 0  # consumer warpgroups (64 weight rows each) per CTA; 0: 2 when N % 128 == 0, else 1
    proxy_fence: bool = True  # fence.proxy.async per stage (moe_gemm.cuh); False is an untested experiment
    overlap: bool = False  # wgmma of chunk c in flight while chunk c+1 is dequantized (untested experiment)


# (largest average rows per expert, tile). Decode wants narrow N and a deep ring (the bytes are the
# weights); prefill wants wide N so each weight byte feeds more FLOPs. Boundaries from the tile
# sweep in profiling/results/moe_gemm_h200.json (qwen3-30b-a3b, fused gate_up): TN=8 is fastest up to
# 4 rows/expert (T=64: 0.212 vs 0.243 ms for TN=32), TN=32 from 8 to 16 (T=128: 0.247 vs 0.273;
# T=256: 0.263 vs 0.457 for TN=8, 0.377 for TN=128), TN=128 from 64 (T=1024: 0.518 vs 0.703).
TILE_TABLE: tuple[tuple[float, TileConfig], ...] = (
    (6.0, TileConfig(tile_tokens=8, stages=8)),
    (32.0, TileConfig(tile_tokens=32, stages=6)),
    (float("inf"), TileConfig(tile_tokens=128, stages=4)),
)

# Off-table tilings the GPU tests check and profiling/sweep_moe_gemm_tiles.py compares: one warpgroup
# per CTA, a wider TN, no proxy fence, and the overlapped main loop (decode and prefill widths).
EXTRA_TILES: tuple[TileConfig, ...] = (
    TileConfig(8, 4, 4, 1),
    TileConfig(64, 4, 2, 2),
    TileConfig(8, 8, 2, 0, proxy_fence=False),
    TileConfig(8, 8, 2, 0, overlap=True),
    TileConfig(128, 4, 1, 0, overlap=True),
)

# kind -> (epilogue enum, description). N/K come from the shape: gate_up is [2I, H], down is [H, I].
KINDS = {
    "gate_up_swiglu": ("SwigluQuant", "gate_up GEMM + SwiGLU + NVFP4 row quantization + guidance"),
    "gate_up": ("Plain", "gate_up GEMM, plain bf16 store (W4A16 trainer path, epilogue-cost baseline)"),
    "down_routed": ("RouterWeight", "down GEMM, fp32 rows times the router weight (then moe_combine)"),
}


def tile_for_rows(num_rows: int, num_experts: int) -> TileConfig:
    """The tile for a call with num_rows routed rows over num_experts experts."""
    average = num_rows / max(num_experts, 1)
    for limit, tile in TILE_TABLE:
        if average <= limit:
            return tile
    return TILE_TABLE[-1][1]


@dataclass(frozen=True)
class MoEDims:
    """What the MoE kernels depend on: a ModelShape, or dims read off the weights of a call."""

    experts: int
    hidden: int
    intermediate: int
    top_k: int = 1

    @classmethod
    def of(cls, shape: "ModelShape | MoEDims") -> "MoEDims":
        if isinstance(shape, MoEDims):
            return shape
        return cls(shape.experts, shape.hidden, shape.intermediate, shape.top_k)


def gemm_dims(shape: "ModelShape | MoEDims", kind: str) -> tuple[int, int]:
    """(N, K) of one expert's weight for a GEMM kind."""
    if kind.startswith("gate_up"):
        return 2 * shape.intermediate, shape.hidden
    if kind == "down_routed":
        return shape.hidden, shape.intermediate
    raise ValueError(f"unknown MoE GEMM kind {kind!r}; known: {', '.join(KINDS)}")


def warpgroups_for(n: int, tile: TileConfig | None = None) -> int:
    if tile is not None and tile.warpgroups:
        if n % (64 * tile.warpgroups):
            raise ValueError(f"N={n} is not a multiple of 64 * warpgroups={tile.warpgroups}")
        return tile.warpgroups
    return 2 if n % 128 == 0 else 1


def smem_bytes(tile: TileConfig, warpgroups: int, experts: int) -> int:
    """Mirror of MoESmem<TN, NWG, STAGES>::bytes(E) (the kernel static_asserts it fits)."""
    per_stage = tile.tile_tokens * CHUNK_K * 2 + warpgroups * (2048 + 256)
    return tile.stages * per_stage + 2 * 256 * 4 + tile.tile_tokens * 12 + (experts + 1) * 4 + 16 + 1024


def gemm_spec(shape: "ModelShape | MoEDims", kind: str, tile: TileConfig) -> KernelSpec:
    shape = MoEDims.of(shape)
    n, k = gemm_dims(shape, kind)
    if n % 64 or k % CHUNK_K:
        raise ValueError(f"{shape}: MoE GEMM {kind} needs N % 64 == 0 and K % {CHUNK_K} == 0, got N={n} K={k}")
    if kind == "gate_up_swiglu" and n % 32:
        raise ValueError(f"{shape}: fused SwiGLU needs I % 16 == 0, got I={shape.intermediate}")
    epilogue, description = KINDS[kind]
    nwg = warpgroups_for(n, tile)
    smem = smem_bytes(tile, nwg, shape.experts)
    # the table's tiles keep short names; other tilings (sweeps) spell out every knob
    table_tile = any(tile == t for _, t in TILE_TABLE) and not tile.warpgroups
    extra = {} if table_tile else {"st": tile.stages, "mb": tile.min_blocks, "wg": nwg, "pf": int(tile.proxy_fence),
                                     "ov": int(tile.overlap)}
    name = kernel_name("moe_gemm", kind, "nvfp4",
                       dims={"e": shape.experts, "h": shape.hidden, "i": shape.intermediate, "tn": tile.tile_tokens,
                             **extra})
    params = {"experts": shape.experts, "n": n, "k": k, "tile_tokens": tile.tile_tokens, "warpgroups": nwg,
              "stages": tile.stages, "min_blocks": tile.min_blocks, "epilogue": epilogue,
              "proxy_fence": "true" if tile.proxy_fence else "false", "overlap": "true" if tile.overlap else "false", "smem_bytes": smem, "threads": 128 * nwg,
              "description": description}
    launch = {"threads": 128 * nwg, "smem_bytes": smem, "tile_tokens": tile.tile_tokens,
              "block_rows": 64 * nwg, "n": n, "k": k, "experts": shape.experts, "kind": kind}
    return KernelSpec(op="moe_gemm", name=name, template="moe_gemm.cu.jinja", params=params, launch=launch,
                      headers=HEADERS, needs_cutlass=True)


def combine_spec(shape: "ModelShape | MoEDims") -> KernelSpec:
    shape = MoEDims.of(shape)
    name = kernel_name("moe_combine", "f32", "bf16", dims={"h": shape.hidden, "k": shape.top_k})
    threads = 256
    params = {"hidden": shape.hidden, "top_k": shape.top_k, "threads": threads}
    return KernelSpec(op="moe_gemm", name=name, template="moe_combine.cu.jinja", params=params,
                      launch={"threads": threads, "hidden": shape.hidden, "top_k": shape.top_k},
                      headers=HEADERS, needs_cutlass=True)


def specs_for_shape(shape: ModelShape) -> list[KernelSpec]:
    specs = [gemm_spec(shape, kind, tile) for kind in KINDS for _, tile in TILE_TABLE]
    return specs + [combine_spec(shape)]


OP = OpCodegen(name="moe_gemm", specs_for_shape=specs_for_shape,
               description="NVFP4 MoE grouped GEMMs (swap-AB wgmma, fused SwiGLU-quantize, routed combine)")
