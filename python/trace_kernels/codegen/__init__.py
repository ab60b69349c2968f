"""Code generation: shape table -> KernelSpecs -> CUDA sources rendered from codegen/templates.

    from trace_kernels import codegen, shapes
    specs = codegen.specs_for_shape(shapes.preset("qwen3-30b-a3b"))
    codegen.generate(specs, "build/generated")  # writes <name>.cu only where the content changed

Ops plug in as modules of trace_kernels.codegen.ops (see docs/toolchain.md, "Adding an op").
"""

from __future__ import annotations

import json
from pathlib import Path

from trace_kernels.codegen.registry import OpCodegen, UnsupportedShape, all_ops, shape_kernels, specs_for_shape
from trace_kernels.codegen.render import render_spec, write_if_different
from trace_kernels.codegen.spec import ARCH, KernelSpec, dtype_name, kernel_name

__all__ = ["ARCH", "KernelSpec", "OpCodegen", "UnsupportedShape", "dtype_name", "all_ops", "generate", "kernel_name",
           "render_spec", "shape_kernels", "specs_for_shape", "write_if_different"]


def manifest_entry(spec: KernelSpec, source: str) -> dict:
    """What a build system needs to compile spec exactly as the JIT would (CMakeLists.txt reads it)."""
    from trace_kernels.jit import _extra_key, cache, compiler
    try:
        includes = [flag[2:] for flag in compiler.include_flags(spec)]
    except compiler.CompileError:
        includes = []  # e.g. CUTLASS not installed: the build of this kernel will fail and say so
    return {"op": spec.op, "source": f"{spec.name}.cu", "cubin": f"{spec.name}.cubin", "template": spec.template,
            "params": dict(spec.params), "nvcc_flags": compiler.flags(spec), "include_dirs": includes,
            "source_key": cache.source_key(source + _extra_key(spec), cache.header_digest(source=source))}


def generate(specs: list[KernelSpec], out_dir: str | Path) -> list[Path]:
    """Render every spec to out_dir/<name>.cu plus out_dir/manifest.json; returns the files written."""
    out = Path(out_dir)
    written = []
    manifest = {}
    for spec in specs:
        path = out / f"{spec.name}.cu"
        source = spec.render()
        if write_if_different(path, source):
            written.append(path)
        manifest[spec.name] = manifest_entry(spec, source)
    manifest_path = out / "manifest.json"
    if write_if_different(manifest_path, json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n"):
        written.append(manifest_path)
    return written
