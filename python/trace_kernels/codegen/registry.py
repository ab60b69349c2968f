"""Op registry: every module in trace_kernels.codegen.ops that defines `OP = OpCodegen(...)`.

Adding an op means adding one module there (plus its template and header); nothing here changes.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from trace_kernels.codegen.spec import KernelSpec
from trace_kernels.shapes import ModelShape


class UnsupportedShape(ValueError):
    """An op has no kernels for a model shape, e.g. decode attention at head_dim 256; the message says why."""


@dataclass(frozen=True)
class OpCodegen:
    """One op's generator: the kernels a model shape needs (its AOT set for that shape)."""

    name: str
    specs_for_shape: Callable[[ModelShape], list[KernelSpec]]
    description: str = ""


@functools.lru_cache(maxsize=None)
def all_ops() -> dict[str, OpCodegen]:
    """All op generators, by name, discovered once per process."""
    ops_package = importlib.import_module("trace_kernels.codegen.ops")

    found: dict[str, OpCodegen] = {}
    for module_info in sorted(pkgutil.iter_modules(ops_package.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{ops_package.__name__}.{module_info.name}")
        op = getattr(module, "OP", None)
        if op is None:
            continue
        if not isinstance(op, OpCodegen):
            raise TypeError(f"{module.__name__}.OP must be an OpCodegen, got {type(op).__name__}")
        if op.name in found:
            raise ValueError(f"two codegen modules register the op name {op.name!r}")
        found[op.name] = op
    return found


def shape_kernels(shape: ModelShape, op_names: list[str] | None = None) -> tuple[list[KernelSpec], dict[str, str]]:
    """(every kernel the chosen ops need for one shape, deduplicated and sorted by name; {op: why} for the ops that
    have no kernels for it). Without op_names every op is asked and those that cannot take the shape are left out;
    an op named in op_names that cannot take it raises its UnsupportedShape."""
    registry = all_ops()
    unknown = sorted(set(op_names or ()) - set(registry))
    if unknown:
        raise ValueError(f"unknown op(s) {', '.join(unknown)}; known: {', '.join(registry)}")
    specs: dict[str, KernelSpec] = {}
    unsupported: dict[str, str] = {}
    for name in op_names or list(registry):
        try:
            op_specs = registry[name].specs_for_shape(shape)
        except UnsupportedShape as why:
            if op_names:
                raise
            unsupported[name] = str(why)
            continue
        for spec in op_specs:
            specs.setdefault(spec.name, spec)
    return [specs[name] for name in sorted(specs)], unsupported


def specs_for_shape(shape: ModelShape, op_names: list[str] | None = None) -> list[KernelSpec]:
    """Every kernel (deduplicated by name, sorted) the chosen ops need for one shape (shape_kernels)."""
    return shape_kernels(shape, op_names)[0]
