"""NVFP4 MoE grouped GEMM ops: launch the generated sm_90a kernels, or the reference on CPU tensors.

    routing = moe_routing.route(topk_ids, E, topk_weights)
    a, s_a = moe_gemm_ref.quantize_activations(x)                      # W4A4 (or s_a=None: W4A16)
    up = moe_gate_up(a, w_gate_up, routing.offsets, row_index=routing.row_index, row_scale=s_a)
    y = moe_down(up.a_next, w_down, routing, row_scale=up.q.scale)    # bf16 [T, H]

Semantics: moe_gemm_ref.py. Every call validates its inputs before launching (offsets and row
indices are read back, a device sync; pass validate=False in a captured hot path once the
routing producer is trusted). Launches sit in NVTX ranges trace_kernels/moe_gemm_<kind> and
trace_kernels/moe_combine.

pdl=True (moe_gate_up, moe_down) makes the GEMM a programmatic dependent launch (pdl.cuh): it may
start while the previous kernel on the stream runs, and reads the offsets and requests its first
weight chunks before it waits for that kernel. Pass it only when that kernel writes neither the
weights nor the offsets, e.g. moe_down right after moe_gate_up (the rollout engine does). The
kernels a call launches after its GEMM (quantize_after's quantize, the combine) use PDL
(FOLLOW_UP_PDL).
"""

from __future__ import annotations

import ctypes
import functools

import torch

from . import moe_gemm_ref, nvfp4, nvtx
from .codegen.ops import moe_gemm as codegen
from .moe_gemm_ref import GateUpOutput, check_gemm_inputs
from .moe_layout import MoEWeights
from .moe_routing import MoERouting, token_tile_bound
from .moe_slot_rows import SlotRows, check_slot_rows, decode_slot_rows, empty_slot_rows

__all__ = ["empty_gate_up_output", "moe_combine", "moe_down", "moe_down_op", "moe_gate_up", "moe_gate_up_op", "moe_gemm",
           "moe_gemm_op", "tile_for_rows"]

tile_for_rows = codegen.tile_for_rows

# The kernels a call launches after its own GEMM (quantize_after's quantize, the combine) wait for it
# in-kernel (programmatic dependent launch); False launches them plainly (benchmark A/B).
FOLLOW_UP_PDL = True


class _Params(ctypes.Structure):
    """MoEGemmParams (moe_gemm.cuh): 24 eight-byte fields, in order."""

    _fields_ = [(f"f{i}", ctypes.c_uint64) for i in range(24)]


def _params(values: tuple) -> _Params:
    return _Params(*values)


def _addr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _counters(device: torch.device, count: int, pool: str, kernel: str) -> torch.Tensor:
    """The fused epilogues' arrival counters, or the row_amax tiles' per-row amaxes (ops._common.counter_pool; the
    kernels leave them zero). Inside a CUDA-graph capture they must exist already: a new buffer's zero fill would only
    be captured, and an eager call or another graph's replay before this graph's first replay would start from
    garbage."""
    from .ops._common import counter_pool
    buf = counter_pool(device, count, pool, allocate=not torch.cuda.is_current_stream_capturing())
    if buf is None:
        raise RuntimeError(f"{kernel}: its {count} zero-initialized {pool!r} entries (arrival counters or row "
                           "amaxes) cannot be allocated inside a CUDA-graph capture; run the same call once outside "
                           "the capture first (a warm-up)")
    return buf


def _status_word(device_index: int) -> torch.Tensor:
    """The project's per-device non-finite status word (ops._common; raise_on_nonfinite reads it)."""
    from .ops._common import status_buffer
    return status_buffer(device_index)


def _after_launch(device_index: int) -> None:
    from .ops._common import after_launch
    after_launch(device_index)


def _kernel(spec):
    from . import runtime
    return runtime.kernel_for(spec)


def _check_device_inputs(tensors: dict) -> None:
    for name, t in tensors.items():
        if t is None:
            continue
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor for the kernel path, got {t.device}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if t.data_ptr() % 16:
            raise ValueError(f"{name} must be 16-byte aligned (data_ptr % 16 == {t.data_ptr() % 16})")
    device = next((t.device for t in tensors.values() if t is not None), None)
    if device is not None and _capability(device.index if device.index is not None else torch.cuda.current_device()) != (9, 0):
        raise RuntimeError("the NVFP4 MoE GEMM kernels are built for sm_90a (Hopper)")


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


_plans: dict[tuple, tuple] = {}


def _plan(kind: str, weights: MoEWeights, tile: codegen.TileConfig, top_k: int = 1):
    """(spec, loaded kernel) for one GEMM variant, memoized: keeps the per-call host cost low. top_k: the
    routing's (a down tile with fused_combine compiles it in)."""
    key = (kind, weights.num_experts, weights.n, weights.k, tile, top_k)
    plan = _plans.get(key)
    if plan is None:
        n, k, e = weights.n, weights.k, weights.num_experts
        gate_up = kind.startswith("gate_up")
        dims = codegen.MoEDims(experts=e, hidden=k if gate_up else n, intermediate=n // 2 if gate_up else k,
                               top_k=top_k)
        spec = codegen.gemm_spec(dims, kind, codegen.fit_chunks(tile, k))  # (a v1 stage of chunks that K lacks)
        kernel = _kernel(spec)
        if spec.launch["persistent"]:
            _check_ws_registers(kernel, spec)
        plan = _plans.setdefault(key, (spec, kernel))
    return plan


def _check_ws_registers(kernel, spec) -> None:
    """A ws kernel whose register pool cannot hold its setmaxnreg split would hang: refuse it."""
    from .runtime import driver
    cu = driver.driver()
    device_index = torch.cuda.current_device()
    attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS
    regs = int(driver.check(cu.cuFuncGetAttribute(attr, kernel.function(device_index)), "cuFuncGetAttribute",
                            kernel.name))
    nwg, min_blocks = spec.launch["warpgroups"], spec.launch["min_blocks"]
    if not codegen.ws_registers_fit(regs, nwg, min_blocks):
        raise RuntimeError(f"{kernel.name}: {regs} registers per thread cannot hold the setmaxnreg split "
                           f"{codegen.ws_register_split(nwg, min_blocks)} (it would hang)")


_max_persistent_ctas: int | None = None  # tests: cap the persistent grid (more items per CTA)
# benchmarks: (m, experts, TN) -> the token tiles the grid holds instead of moe_routing.token_tile_bound; never below
# the routing's real count (moe_routing.token_tiles), or rows go uncomputed
_grid_token_tiles = None


@functools.lru_cache(maxsize=None)
def _resident_ctas(kernel, device_index: int, threads: int, smem: int) -> int:
    per_sm = kernel.max_active_blocks_per_sm(device_index, threads, smem)
    if per_sm < 1:
        raise RuntimeError(f"{kernel.name} cannot be resident ({threads} threads, {smem} B shared memory)")
    return per_sm * torch.cuda.get_device_properties(device_index).multi_processor_count


def _persistent_ctas(kernel, device_index: int, threads: int, smem: int) -> int:
    """CTAs a persistent (ws) kernel launches: every SM times the occupancy the driver reports."""
    ctas = _resident_ctas(kernel, device_index, threads, smem)
    return ctas if _max_persistent_ctas is None else min(ctas, _max_persistent_ctas)


def _launch_gemm(kind: str, a, weights: MoEWeights, offsets, row_index, row_scale, *, m: int,
                 tile: codegen.TileConfig | None, out=None, slot_out: SlotRows | None = None, row_weight=None,
                 quant: tuple | None = None, pdl: bool = False, combine: tuple | None = None) -> None:
    """combine: (row_token, slot_rows, out) of a down GEMM whose spec has the combine in its epilogue."""
    e = weights.num_experts
    tile = tile or codegen.tile_for_rows(m, e, k=weights.k, kind=kind, n=weights.n)
    top_k = combine[1].shape[1] if combine is not None else 1
    spec, kernel = _plan(kind, weights, tile, top_k)
    launch = spec.launch
    device_index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    # an upper bound on sum_e ceil(rows_e / TN): the offsets are on the device (and may be written by the
    # previous kernel); the surplus CTAs find no tile and leave
    token_tiles = (_grid_token_tiles or token_tile_bound)(m, e, tile.tile_tokens)
    x_tiles = weights.n // launch["block_rows"]
    kernel.allow_dynamic_smem(device_index, launch["smem_bytes"])  # before the occupancy query
    if launch["cluster"] > codegen.PORTABLE_CLUSTER_CTAS:  # cluster_quant: 30B's 12 CTAs per token tile
        kernel.allow_nonportable_cluster_size(device_index)
    if launch["persistent"]:  # ws: CTAs walk the (token tile, weight tile) items counted on the device
        grid = (min(_persistent_ctas(kernel, device_index, launch["threads"], launch["smem_bytes"]),
                    token_tiles * x_tiles), 1, 1)
    else:
        if token_tiles > 65535:
            raise ValueError(f"{m} routed rows need {token_tiles} token tiles of {tile.tile_tokens} (grid.y limit "
                             "65535): use a wider tile")
        grid = (x_tiles, token_tiles, 1)
    fused = kind == "gate_up_swiglu"
    # the last-CTA quantization's arrival counters (a cluster_quant kernel has no last CTA)
    counters = _counters(a.device, token_tiles, "gate_up", spec.name) if fused and not launch["cluster"] else None
    # ROW_AMAX kernels: each row's amax as uint32 float bits, folded by every CTA (left zero like the counters)
    row_amax = _counters(a.device, m, "gate_up_row_amax", spec.name) if launch["row_amax"] else None
    status = _status_word(device_index) if fused else None
    q_codes, q_bscales, q_scale, q_dequant, q_bits = quant or (None,) * 5
    row_token, slot_rows, combine_out = combine or (None,) * 3
    if (combine is not None) != bool(spec.launch["combine_top_k"]):
        raise RuntimeError(f"{spec.name}: combine buffers given {combine is not None}, kernel combines "
                           f"{bool(spec.launch['combine_top_k'])}")  # (moe_down decides both)
    combine_counters = None
    if combine is not None:  # one counter per (token, weight tile)
        combine_counters = _counters(a.device, slot_rows.shape[0] * x_tiles, "combine", spec.name)
    slot_values, slot_exponents = slot_out or (None, None)
    values = (_addr(a), _addr(row_index), _addr(row_scale), _addr(weights.codes), _addr(weights.block_scales),
              _addr(weights.scale), _addr(offsets), m, _addr(out), _addr(slot_values), _addr(slot_exponents),
              _addr(row_weight),
              _addr(q_codes), _addr(q_bscales), _addr(q_scale), _addr(q_dequant), _addr(q_bits), _addr(counters),
              _addr(status), _addr(row_token), _addr(slot_rows), _addr(combine_out), _addr(combine_counters),
              _addr(row_amax))
    with nvtx.annotate(f"moe_gemm_{kind}"):
        kernel.launch(device_index, grid, (launch["threads"], 1, 1), [(_params, values)], smem=launch["smem_bytes"],
                      pdl=pdl)


def _prepare(a, weights, offsets, row_index, row_scale, validate: bool) -> int:
    m = check_gemm_inputs(a, weights, offsets, row_index, row_scale, validate_values=validate)
    if m > 0:
        _check_device_inputs({"a": a, "weights.codes": weights.codes, "weights.block_scales": weights.block_scales,
                              "weights.scale": weights.scale, "offsets": offsets, "row_index": row_index,
                              "row_scale": row_scale})
    return m


def _check_out(t: torch.Tensor, shape: tuple, dtype: torch.dtype, name: str) -> torch.Tensor:
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype} {list(shape)}, got {t.dtype} {list(t.shape)}")
    return t


def moe_gemm(a: torch.Tensor, weights: MoEWeights, offsets: torch.Tensor, *, row_index=None, row_scale=None,
             tile: codegen.TileConfig | None = None, validate: bool = True,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """Plain epilogue, gate_up-shaped weights ([E, 2I, H]): bf16 [M, 2I]. CPU tensors use the reference."""
    if not a.is_cuda:
        return moe_gemm_ref.moe_gemm_ref(a, weights, offsets, row_index=row_index, row_scale=row_scale)
    m = _prepare(a, weights, offsets, row_index, row_scale, validate)
    if out is None:
        out = torch.empty(m, weights.n, dtype=torch.bfloat16, device=a.device)  # [M, N]
    _check_out(out, (m, weights.n), torch.bfloat16, "out")
    _check_device_inputs({"out": out})
    if m:
        _launch_gemm("gate_up", a, weights, offsets, row_index, row_scale, m=m, tile=tile, out=out)
    return out


def empty_gate_up_output(m: int, intermediate: int, device) -> GateUpOutput:
    """Uninitialised outputs of moe_gate_up for m rows (pass as out= to reuse buffers)."""
    def empty(*shape, dtype):
        return torch.empty(*shape, dtype=dtype, device=device)
    q = nvfp4.NVFP4Tensor(codes=empty(m, intermediate // 2, dtype=torch.uint8),  # [M, I/2]
                          block_scales=empty(m, intermediate // 16, dtype=torch.float8_e4m3fn),  # [M, I/16]
                          scale=empty(m, dtype=torch.float32))  # [M]
    return GateUpOutput(h=empty(m, intermediate, dtype=torch.bfloat16), q=q,  # h [M, I]
                        a_next=empty(m, intermediate, dtype=torch.bfloat16),  # [M, I]
                        mantissa_bits=empty(m, intermediate // 8, dtype=torch.uint8))  # [M, I/8]


def moe_gate_up(a: torch.Tensor, weights: MoEWeights, offsets: torch.Tensor, *, row_index=None, row_scale=None,
                tile: codegen.TileConfig | None = None, validate: bool = True,
                out: GateUpOutput | None = None, pdl: bool = False) -> GateUpOutput:
    """gate_up GEMM + SwiGLU + NVFP4 row quantization + guidance (interleaved weights [E, 2I, H]).

    The tile decides where the rows of h are quantized: in the GEMM's epilogue (the last CTA of each
    token tile), or, with tile.quantize_after, by the quantize kernel launched right after a GEMM that
    only stores h (a programmatic dependent launch of that GEMM, FOLLOW_UP_PDL). Both give
    nvfp4.quantize's bits of the same h. pdl: see the module docstring."""
    if not a.is_cuda:
        return moe_gemm_ref.moe_gate_up_ref(a, weights, offsets, row_index=row_index, row_scale=row_scale)
    m = _prepare(a, weights, offsets, row_index, row_scale, validate)
    inter = weights.n // 2
    if out is None:
        out = empty_gate_up_output(m, inter, a.device)
    _check_out(out.h, (m, inter), torch.bfloat16, "out.h")
    _check_out(out.q.codes, (m, inter // 2), torch.uint8, "out.q.codes")
    _check_out(out.q.block_scales, (m, inter // 16), torch.float8_e4m3fn, "out.q.block_scales")
    _check_out(out.q.scale, (m,), torch.float32, "out.q.scale")
    _check_out(out.a_next, (m, inter), torch.bfloat16, "out.a_next")
    _check_out(out.mantissa_bits, (m, inter // 8), torch.uint8, "out.mantissa_bits")
    _check_device_inputs({"out.h": out.h, "out.q.codes": out.q.codes, "out.q.block_scales": out.q.block_scales,
                          "out.q.scale": out.q.scale, "out.a_next": out.a_next, "out.mantissa_bits": out.mantissa_bits})
    h, codes, bscales, scale = out.h, out.q.codes, out.q.block_scales.view(torch.uint8), out.q.scale
    a_next, bits = out.a_next, out.mantissa_bits
    if m:
        tile = tile or codegen.tile_for_rows(m, weights.num_experts, k=weights.k, kind="gate_up_swiglu", n=weights.n)
        kind = codegen.launched_kind("gate_up_swiglu", tile)
        if kind == "gate_up_swiglu_h":
            from .ops.quantize import launch_into
            _launch_gemm(kind, a, weights, offsets, row_index, row_scale, m=m, tile=tile, out=h, pdl=pdl)
            # the quantize checks its own status (after_launch)
            launch_into(h, codes, bscales, scale, bits, a_next, pdl=FOLLOW_UP_PDL)
        else:
            _launch_gemm("gate_up_swiglu", a, weights, offsets, row_index, row_scale, m=m, tile=tile, out=h,
                         quant=(codes, bscales, scale, a_next, bits), pdl=pdl)
            _after_launch(a.device.index if a.device.index is not None else torch.cuda.current_device())
    return out


@functools.lru_cache(maxsize=None)
def _combine_plan(hidden: int, top_k: int):
    spec = codegen.combine_spec_for(hidden, top_k)
    return spec, _kernel(spec)


def moe_down(a: torch.Tensor, weights: MoEWeights, routing: MoERouting, *, row_scale=None,
             tile: codegen.TileConfig | None = None, validate: bool = True,
             out: torch.Tensor | None = None, slot_workspace: SlotRows | None = None,
             pdl: bool = False) -> torch.Tensor:
    """down GEMM over sorted rows a [M, I] + router weight + ordered top-k combine -> bf16 [T, H].

    The GEMM writes each routed row as scaled FP16 (moe_slot_rows.SlotRows; slot_workspace, e.g. from
    empty_slot_rows(M, H, device), or a new one). The combine is a programmatic dependent launch of the GEMM
    (FOLLOW_UP_PDL), or with a v1 tile whose fused_combine is set, the GEMM's own epilogue (same bits;
    slot_workspace still holds the per-slot rows); pdl: see the module docstring."""
    if slot_workspace is not None:  # (on CPU too: the reference ignores it, but a wrong one is still a caller's bug)
        check_slot_rows(slot_workspace, a.shape[0], weights.n, "slot_workspace")
    if not a.is_cuda:
        return moe_gemm_ref.moe_down_ref(a, weights, routing, row_scale=row_scale)
    if routing.row_weight is None:
        raise ValueError("the down epilogue needs routing.row_weight (route(..., topk_weights=...))")
    m = _prepare(a, weights, routing.offsets, None, row_scale, validate)
    _check_device_inputs({"routing.row_weight": routing.row_weight, "routing.slot_rows": routing.slot_rows})
    if tuple(routing.row_weight.shape) != (m,) or routing.row_weight.dtype != torch.float32:
        raise ValueError(f"routing.row_weight must be float32 [M]=[{m}]")
    t, top_k = routing.slot_rows.shape
    if t * top_k != m or routing.slot_rows.dtype != torch.int32:
        raise ValueError(f"routing.slot_rows must be int32 [T, k] with T*k == M={m}, got {tuple(routing.slot_rows.shape)}")
    if validate and m and (int(routing.slot_rows.min()) < 0 or int(routing.slot_rows.max()) >= m):
        raise ValueError("routing.slot_rows values must lie in [0, M)")
    hidden = weights.n
    ys = slot_workspace if slot_workspace is not None else empty_slot_rows(m, hidden, a.device)  # (checked above)
    out = out if out is not None else torch.empty(t, hidden, dtype=torch.bfloat16, device=a.device)
    _check_out(out, (t, hidden), torch.bfloat16, "out")  # [T, H]
    _check_device_inputs({"out": out, "slot_workspace.values": ys.values,
                          "slot_workspace.exponents": ys.exponents})
    if m == 0:
        return out.zero_()
    tile = tile or codegen.tile_for_rows(m, weights.num_experts, k=weights.k, kind="down_routed", n=hidden)
    if tile.fused_combine and tile.variant == "v1":
        # the last of a token's CTAs sums its slots: every (token, slot) must name a row of that token, or
        # counters would be left short of top_k (and non-zero for the next launch)
        _check_device_inputs({"routing.row_index": routing.row_index})
        if tuple(routing.row_index.shape) != (m,) or routing.row_index.dtype != torch.int32:
            raise ValueError(f"routing.row_index must be int32 [M]=[{m}]")
        if validate:
            tokens = torch.arange(t, device=a.device, dtype=torch.int32)[:, None]  # [T, 1]
            if not bool((routing.row_index[routing.slot_rows.long()] == tokens).all()):
                raise ValueError("routing.slot_rows and routing.row_index are not inverse maps (use route())")
        _launch_gemm("down_routed", a, weights, routing.offsets, None, row_scale, m=m, tile=tile, slot_out=ys,
                     row_weight=routing.row_weight, pdl=pdl, combine=(routing.row_index, routing.slot_rows, out))
        return out
    _launch_gemm("down_routed", a, weights, routing.offsets, None, row_scale, m=m, tile=tile, slot_out=ys,
                 row_weight=routing.row_weight, pdl=pdl)
    _launch_combine(ys, routing.slot_rows, out, pdl=FOLLOW_UP_PDL)
    return out


def moe_combine(ys: SlotRows, slot_rows: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """The ordered top-k combine alone: per-slot rows ys (values fp16 [M, H], exponents int8 [M, H/2]) and
    slot_rows int32 [T, k] -> bf16 [T, H] (moe_down runs it after its GEMM). CPU tensors use the reference."""
    if not isinstance(ys, SlotRows):
        raise TypeError(f"ys must be a moe_slot_rows.SlotRows, got {type(ys).__name__}")
    if ys.values.dim() != 2:
        raise ValueError(f"ys.values must be float16 [M, H], got shape {list(ys.values.shape)}")
    m, hidden = ys.values.shape
    check_slot_rows(ys, m, hidden, "ys")
    if slot_rows.dim() != 2 or slot_rows.dtype != torch.int32:
        raise ValueError(f"slot_rows must be int32 [T, k], got {slot_rows.dtype} {list(slot_rows.shape)}")
    if validate and slot_rows.numel() and (int(slot_rows.min()) < 0 or int(slot_rows.max()) >= m):
        raise ValueError(f"slot_rows values must lie in [0, M={m})")
    if not ys.values.is_cuda:
        return moe_gemm_ref.combine_slots(decode_slot_rows(ys), slot_rows)
    _check_device_inputs({"ys.values": ys.values, "ys.exponents": ys.exponents, "slot_rows": slot_rows})
    out = torch.empty(slot_rows.shape[0], hidden, dtype=torch.bfloat16, device=ys.values.device)  # [T, H]
    if out.numel():
        _launch_combine(ys, slot_rows, out, pdl=False)
    return out


def _launch_combine(ys: SlotRows, slot_rows: torch.Tensor, out: torch.Tensor, pdl: bool) -> None:
    """The ordered top-k combine: the per-slot rows ys -> bf16 out [T, H] (inputs checked by moe_down or
    moe_combine; profiling/bench_moe_gemm.py also times it alone)."""
    t, top_k = slot_rows.shape
    spec, kernel = _combine_plan(ys.values.shape[1], top_k)
    from .runtime import i64, ptr
    device_index = ys.values.device.index if ys.values.device.index is not None else torch.cuda.current_device()
    with nvtx.annotate("moe_combine"):
        kernel.launch(device_index, (t, 1, 1), (spec.launch["threads"], 1, 1),
                      [ptr(ys.values), ptr(ys.exponents), ptr(slot_rows), ptr(out), i64(t)], pdl=pdl)


# ------------------------------------------------------------------------------------------------
# torch.library custom ops (flat tensor arguments) so torch.compile can trace through the MoE GEMMs.
# tile_tokens = 0 picks the tile from TILE_TABLE; values are validated (a sync) like the eager API.
# ------------------------------------------------------------------------------------------------

def _tile_arg(tile_tokens: int) -> codegen.TileConfig | None:
    if tile_tokens == 0:
        return None
    table = codegen.TILE_TABLES[codegen.DEFAULT_VARIANT]
    for _, tile in table:
        if tile.tile_tokens == tile_tokens:
            return tile
    raise ValueError(f"tile_tokens must be 0 or one of {[t.tile_tokens for _, t in table]}")


@torch.library.custom_op("trace_kernels::moe_gemm", mutates_args=())
def moe_gemm_op(a: torch.Tensor, w_codes: torch.Tensor, w_block_scales: torch.Tensor, w_scale: torch.Tensor,
                offsets: torch.Tensor, row_index: torch.Tensor | None, row_scale: torch.Tensor | None,
                tile_tokens: int) -> torch.Tensor:
    """Plain epilogue: bf16 [M, N] (see moe_gemm)."""
    return moe_gemm(a, MoEWeights(w_codes, w_block_scales, w_scale), offsets, row_index=row_index,
                    row_scale=row_scale, tile=_tile_arg(tile_tokens))


@moe_gemm_op.register_fake
def _(a, w_codes, w_block_scales, w_scale, offsets, row_index, row_scale, tile_tokens):
    m = a.shape[0] if row_index is None else row_index.shape[0]
    return a.new_empty((m, w_codes.shape[1] * 64), dtype=torch.bfloat16)


@torch.library.custom_op("trace_kernels::moe_gate_up", mutates_args=())
def moe_gate_up_op(a: torch.Tensor, w_codes: torch.Tensor, w_block_scales: torch.Tensor, w_scale: torch.Tensor,
                   offsets: torch.Tensor, row_index: torch.Tensor | None, row_scale: torch.Tensor | None,
                   tile_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                              torch.Tensor]:
    """(h, codes, block_scales, scale, a_next, mantissa_bits) of the fused gate_up (see moe_gate_up)."""
    out = moe_gate_up(a, MoEWeights(w_codes, w_block_scales, w_scale), offsets, row_index=row_index,
                      row_scale=row_scale, tile=_tile_arg(tile_tokens))
    return out.h, out.q.codes, out.q.block_scales, out.q.scale, out.a_next, out.mantissa_bits


@moe_gate_up_op.register_fake
def _(a, w_codes, w_block_scales, w_scale, offsets, row_index, row_scale, tile_tokens):
    m = a.shape[0] if row_index is None else row_index.shape[0]
    inter = w_codes.shape[1] * 32
    return (a.new_empty((m, inter), dtype=torch.bfloat16), a.new_empty((m, inter // 2), dtype=torch.uint8),
            a.new_empty((m, inter // 16), dtype=torch.float8_e4m3fn), a.new_empty((m,), dtype=torch.float32),
            a.new_empty((m, inter), dtype=torch.bfloat16), a.new_empty((m, inter // 8), dtype=torch.uint8))


@torch.library.custom_op("trace_kernels::moe_down", mutates_args=())
def moe_down_op(a: torch.Tensor, w_codes: torch.Tensor, w_block_scales: torch.Tensor, w_scale: torch.Tensor,
                offsets: torch.Tensor, row_index: torch.Tensor, slot_rows: torch.Tensor, row_weight: torch.Tensor,
                row_scale: torch.Tensor | None, tile_tokens: int) -> torch.Tensor:
    """down GEMM + router weight + ordered top-k combine: bf16 [T, H] (see moe_down)."""
    routing = MoERouting(row_index=row_index, offsets=offsets, slot_rows=slot_rows, row_weight=row_weight)
    return moe_down(a, MoEWeights(w_codes, w_block_scales, w_scale), routing, row_scale=row_scale,
                    tile=_tile_arg(tile_tokens))


@moe_down_op.register_fake
def _(a, w_codes, w_block_scales, w_scale, offsets, row_index, slot_rows, row_weight, row_scale, tile_tokens):
    return a.new_empty((slot_rows.shape[0], w_codes.shape[1] * 64), dtype=torch.bfloat16)
