"""The kernel parameter structs Python packs with ctypes have the layout of their C++ twins.

A struct passed by value is copied byte for byte into the kernel's parameter space, so a field added,
reordered or resized on one side only would hand the kernel wrong pointers without any error. nvcc
checks every offset and size here at compile time (static_assert), no GPU needed."""

from __future__ import annotations

import ctypes
import re

import pytest

from trace_kernels import attention, kv_append, kv_cache, moe_gemm, paths
from trace_kernels.ops import moe_pack
from trace_kernels.testing.host_program import compile_host_program

# (ctypes class, C++ type, header that defines it)
NAMED_FIELDS = [
    (attention._DecodeParams, "trace_kernels::DecodeParams", "trace_kernels/attention_decode_params.cuh"),
    (kv_append._GuidancePtrs, "trace_kernels::GuidancePtrs", "trace_kernels/kv_append.cuh"),
    (kv_cache._Nvfp4PagePtrs, "trace_kernels::Nvfp4PagePtrs", "trace_kernels/kv_pages.cuh"),
    (moe_pack._Columns, "trace_kernels::moe_pack::EncodeColumns", "trace_kernels/moe_pack.cuh"),
]
MOE_GEMM_HEADER = "trace_kernels/moe_gemm.cuh"


def _member_names(header: str, struct: str) -> list[str]:
    """Data members of `struct NAME { ... };` in declaration order (one `type name;` per line)."""
    text = (paths.include_dir() / header).read_text()
    body = re.search(r"struct " + struct + r" \{(.*?)\n\};", text, re.S)
    assert body, f"struct {struct} not found in {header}"
    return re.findall(r"^\s+[\w:<>\s\*]+?[\s\*](\w+)(?:\[\d+\])?;", body.group(1), re.M)


def _checks(cls: type[ctypes.Structure], cpp: str) -> list[str]:
    lines = [f"static_assert(sizeof({cpp}) == {ctypes.sizeof(cls)}, \"sizeof {cpp}\");",
             f"static_assert(alignof({cpp}) == {ctypes.alignment(cls)}, \"alignof {cpp}\");"]
    for name, *_ in cls._fields_:
        offset = getattr(cls, name).offset
        lines.append(f"static_assert(offsetof({cpp}, {name}) == {offset}, \"{cpp}::{name} at {offset}\");")
    return lines


def test_moe_gemm_members_are_read_from_the_header():
    names = _member_names(MOE_GEMM_HEADER, "MoEGemmParams")
    assert names[:3] == ["a", "row_index", "row_scale"] and names[-1] == "row_amax"
    assert len(names) == len(moe_gemm._Params._fields_)


@pytest.mark.nvcc
def test_ctypes_structs_match_the_kernels_structs(tmp_path):
    lines = ["#include <cstddef>"]
    headers = sorted({h for *_, h in NAMED_FIELDS} | {MOE_GEMM_HEADER})
    lines += [f'#include "{h}"' for h in headers]
    for cls, cpp, _ in NAMED_FIELDS:
        lines += _checks(cls, cpp)
    # MoEGemmParams: the host packs it as 24 uint64 (moe_gemm._Params), so member i must sit at 8 i
    members = _member_names(MOE_GEMM_HEADER, "MoEGemmParams")
    cpp = "trace_kernels::moe::MoEGemmParams"
    lines.append(f"static_assert(sizeof({cpp}) == {ctypes.sizeof(moe_gemm._Params)}, \"sizeof {cpp}\");")
    lines += [f"static_assert(offsetof({cpp}, {m}) == {8 * i}, \"{cpp}::{m} at {8 * i}\");"
              for i, m in enumerate(members)]
    compile_host_program("\n".join(lines) + "\n", tmp_path, "layouts", object_only=True,
                         extra_includes=tuple(paths.cutlass_include_dirs()))


def test_a_layout_mismatch_would_fail_to_compile():
    """The check itself: a struct one field short yields a different size and offsets."""
    class Short(ctypes.Structure):
        _fields_ = attention._DecodeParams._fields_[:-1]
    assert ctypes.sizeof(Short) != ctypes.sizeof(attention._DecodeParams)
    assert _checks(Short, "X")[0] != _checks(attention._DecodeParams, "X")[0]


def test_the_down_launch_packs_each_buffer_at_its_member(monkeypatch):
    """moe_gemm._launch_gemm's values, in MoEGemmParams' member order: each buffer of a down launch at its own
    member (forty-seventh session: a host-side name clash once handed the kernel a null per-slot rows pointer, which
    only a GPU run showed). No GPU: the kernel is a fake that keeps what it was given."""
    from types import SimpleNamespace

    import torch

    from trace_kernels.codegen.ops.moe_gemm import TILE_TABLE
    from trace_kernels.moe_layout import empty_weights
    from trace_kernels.moe_slot_rows import empty_slot_rows

    launched = {}

    class FakeKernel:
        def allow_dynamic_smem(self, device_index, smem):
            pass

        def launch(self, device_index, grid, block, args, smem, pdl):
            launched["values"] = args[0][1]

    spec = SimpleNamespace(name="fake", launch={"block_rows": 64, "persistent": False, "row_amax": False,
                                                "combine_top_k": 0, "threads": 128, "smem_bytes": 0, "cluster": 0})
    monkeypatch.setattr(moe_gemm, "_plan", lambda *args: (spec, FakeKernel()))
    m, hidden, inter, experts = 6, 128, 64, 4
    weights = empty_weights(experts, hidden, inter, "cpu")
    a = SimpleNamespace(device=SimpleNamespace(index=0), data_ptr=lambda: 0x1000)  # (a CUDA tensor's two uses)
    offsets = torch.tensor([0, 2, 2, 5, 6], dtype=torch.int32)
    row_scale, row_weight = torch.ones(m), torch.rand(m)
    rows = empty_slot_rows(m, hidden, "cpu")
    moe_gemm._launch_gemm("down_routed", a, weights, offsets, None, row_scale, m=m, tile=TILE_TABLE[0][1],
                          slot_out=rows, row_weight=row_weight)
    values = launched["values"]
    members = _member_names(MOE_GEMM_HEADER, "MoEGemmParams")
    assert len(values) == len(members)
    expect = {"a": 0x1000, "row_index": 0, "row_scale": row_scale.data_ptr(), "w_codes": weights.codes.data_ptr(),
              "w_scales": weights.block_scales.data_ptr(), "w_scale": weights.scale.data_ptr(),
              "offsets": offsets.data_ptr(), "num_rows": m, "out": 0, "slot_values": rows.values.data_ptr(),
              "slot_exponents": rows.exponents.data_ptr(), "row_weight": row_weight.data_ptr()}
    assert {name: values[members.index(name)] for name in expect} == expect
    assert all(values[i] == 0 for i, name in enumerate(members) if name not in expect)  # no fused-epilogue buffer
