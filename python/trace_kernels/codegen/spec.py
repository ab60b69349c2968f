"""KernelSpec: one generated kernel = an op, a readable name, a template and its parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

ARCH = "sm90a"  # the only target today; part of every kernel name
GENCODE = "-gencode=arch=compute_90a,code=sm_90a"

# Short dtype names used in kernel names and the C++ type each maps to. Codegen takes these
# names or torch dtypes, and never imports torch itself (the AOT build runs without it).
CUDA_TYPES = {"bf16": "__nv_bfloat16", "f16": "__half", "f32": "float"}
_TORCH_NAMES = {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}


def dtype_name(dtype) -> str:
    """'bf16' / 'f16' / 'f32' for a torch dtype or one of those names."""
    name = dtype if isinstance(dtype, str) and dtype in CUDA_TYPES else _TORCH_NAMES.get(str(dtype))
    if name is None:
        raise TypeError(f"no kernel dtype for {dtype}; supported: bfloat16, float16, float32")
    return name


def kernel_name(op: str, *parts: str, dims: Mapping[str, int] = (), arch: str = ARCH) -> str:
    """Systematic, readable name: op, dtype/variant parts, dims in the given order, arch.

    kernel_name("nvfp4_quantize", "bf16", dims={"d": 2048}) == "nvfp4_quantize_bf16_d2048_sm90a"
    """
    dim_parts = [f"{key}{value}" for key, value in dict(dims).items()]
    name = "_".join([op, *parts, *dim_parts, arch])
    if not name.replace("_", "").isalnum():
        raise ValueError(f"kernel name {name!r} must be letters, digits and underscores")
    return name


def resolve_variant(op: str, variants: tuple[str, ...], default: str, variant: str | None) -> str:
    """The variant to build: `default` when None; one outside `variants` raises."""
    variant = default if variant is None else variant
    if variant not in variants:
        raise ValueError(f"{op}: variant {variant!r} is not one of {variants}")
    return variant


def variant_parts(short: str, variant: str) -> tuple[str, ...]:
    """Kernel-name parts for a dtype and variant: v1 keeps its original (measured) name."""
    return (short,) if variant == "v1" else (short, variant)


@dataclass(frozen=True)
class KernelSpec:
    """Everything needed to render, build and find one kernel.

    params go to the template verbatim (constexprs, type names); launch holds host-side facts the
    launcher needs (threads per block, rows per block ...), derived by the op module from the same
    numbers so template and launcher cannot disagree.
    """

    op: str  # registry name of the op module that made it
    name: str  # the extern "C" symbol and the file stem
    template: str  # file name under the templates folder
    params: Mapping[str, Any]
    launch: Mapping[str, Any] = field(default_factory=dict)
    headers: tuple[str, ...] = ()  # trace_kernels/*.cuh the template includes (documentation + checks)
    needs_cutlass: bool = False  # add the nvidia-cutlass include dirs when compiling

    def __hash__(self):
        return hash(self.name)

    def render(self) -> str:
        from trace_kernels.codegen.render import render_spec
        return render_spec(self)
