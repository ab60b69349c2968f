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
    # MoEGemmParams: the host packs it as 23 uint64 (moe_gemm._Params), so member i must sit at 8 i
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
