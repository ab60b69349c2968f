"""`trace-kernels`: generate, build and list the project's CUDA kernels.

    trace-kernels list [--env]
    trace-kernels generate (--preset NAME | --shape E=..,H=.. | --config config.json) --out DIR [--op OP]
    trace-kernels build    (--preset NAME | --shape ... | --config ...) [--op OP] [--jobs N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from trace_kernels import codegen, env, shapes


def _add_shape_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--preset", action="append", choices=sorted(shapes.PRESETS),
                       help="a preset shape (repeatable)")
    group.add_argument("--shape", help="custom shape, e.g. E=128,H=2048,I=768,k=8,hq=32,hkv=4,hd=128")
    group.add_argument("--config", help="a Hugging Face config.json of an MoE model")
    parser.add_argument("--op", action="append", help="only these ops (repeatable; default: all)")


def _shapes(args) -> list[shapes.ModelShape]:
    if args.preset:
        return [shapes.preset(name) for name in args.preset]
    if args.shape:
        return [shapes.parse_custom(args.shape)]
    shape = shapes.from_hf_config(args.config)
    shared = shapes.shared_experts(args.config)
    if shared:
        print(f"trace-kernels: {shape.name}: shared experts ({shared}) are dense MLPs; the MoE kernels cover the "
              f"routed experts only", file=sys.stderr)
    return [shape]


def _specs(args) -> list[codegen.KernelSpec]:
    """The kernels of the chosen shapes and ops; ops that cannot take a shape are named on stderr and left out
    (an op asked for by --op raises instead)."""
    specs: dict[str, codegen.KernelSpec] = {}
    for shape in _shapes(args):
        shape_specs, unsupported = codegen.shape_kernels(shape, args.op)
        for why in unsupported.values():
            print(f"trace-kernels: {shape.name}: skipped {why}", file=sys.stderr)
        for spec in shape_specs:
            specs.setdefault(spec.name, spec)
    return [specs[k] for k in sorted(specs)]


def cmd_generate(args) -> int:
    specs = _specs(args)
    written = codegen.generate(specs, args.out)
    print(f"{len(specs)} kernels in {args.out} ({len(written)} files written, the rest unchanged)")
    for spec in specs:
        print(f"  {spec.name}")
    return 0


def cmd_build(args) -> int:
    from trace_kernels import jit
    from trace_kernels.jit import cache
    specs = _specs(args)
    start = time.time()
    entries = jit.build_all(specs, jobs=args.jobs, keep_going=args.keep_going)
    failed = [(spec, e) for spec, e in zip(specs, entries) if isinstance(e, Exception)]
    for spec, error in failed:
        print(f"FAILED {spec.name}: {str(error).splitlines()[0]}", file=sys.stderr)
    built = [(spec, e) for spec, e in zip(specs, entries) if not isinstance(e, Exception)]
    print(f"built {len(built)} kernels into {cache.cache_root()} in {time.time() - start:.1f} s"
          + (f"; {len(failed)} failed" if failed else ""))
    if args.out:  # an AOT folder: cubins + manifest with the compiler-independent source key
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        manifest = {}
        for spec, entry in built:
            shutil.copyfile(entry.cubin, out / f"{spec.name}.cubin")
            manifest[spec.name] = codegen.manifest_entry(spec, spec.render())
        codegen.write_if_different(out / "manifest.json", json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        print(f"AOT set: {len(manifest)} cubins + manifest.json in {out}")
    return 1 if failed else 0


def cmd_list(args) -> int:
    if args.env:
        for knob in env.KNOBS.values():
            print(f"{knob.env_name}={env.get(knob.name)!r}  # {knob.help}")
        return 0
    print("presets:")
    for shape in shapes.PRESETS.values():
        print(f"  {shape.describe()}")
    print("ops:")
    for op in codegen.all_ops().values():
        print(f"  {op.name}: {op.description}")
    from trace_kernels import moe_tables
    tuned = moe_tables.registered()
    print(f"tuned MoE tile tables ({env.PREFIX}MOE_TABLES): {len(tuned) or 'none'}")
    for (kind, experts, n, k), source, table in tuned:
        print(f"  {kind} E={experts} N={n} K={k}: {len(table)} bands, from {source}")
    shipped = moe_tables.builtin()
    print(f"built-in tuned MoE tile tables ({env.PREFIX}MOE_BUILTIN_TABLES): {len(shipped) or 'none'}")
    for (kind, experts, n, k), source, table, replaced in shipped:
        note = " (replaced by a registered table)" if replaced else ""
        print(f"  {kind} E={experts} N={n} K={k}: {len(table)} bands, from {Path(source).name}{note}")
    print("kernels per preset:")
    for shape in shapes.PRESETS.values():
        names = [s.name for s in codegen.specs_for_shape(shape)]
        print(f"  {shape.name} ({len(names)}): {' '.join(names)}")
    from trace_kernels.jit import cache
    entries = cache.list_entries()
    print(f"cached kernels in {cache.cache_root()} ({len(entries)}):")
    for meta in entries:
        state = "CORRUPT" if meta.get("corrupt") else meta.get("created", "")
        print(f"  {meta.get('name')}  {state}  {meta['folder']}")
    from trace_kernels import paths
    aot = paths.aot_dir() / "manifest.json"
    if aot.is_file():
        print(f"AOT kernels in {aot.parent}: {len(json.loads(aot.read_text()))}")
    else:
        print(f"AOT kernels: none ({aot.parent} has no manifest.json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trace-kernels", description="Generate, build and list trace-kernels CUDA kernels.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="render the kernels of a shape into a folder (.cu + manifest.json)")
    _add_shape_args(gen)
    gen.add_argument("--out", required=True, help="output folder")
    gen.set_defaults(func=cmd_generate)
    build = sub.add_parser("build", help="compile the kernels of a shape into the JIT cache (needs nvcc)")
    _add_shape_args(build)
    build.add_argument("--jobs", type=int, default=0, help="parallel nvcc processes (default: CPU count)")
    build.add_argument("--out", help="also copy the cubins + manifest.json here (an AOT folder)")
    build.add_argument("--keep-going", action="store_true", help="build the rest when a kernel fails (exit 1)")
    build.set_defaults(func=cmd_build)
    lst = sub.add_parser("list", help="presets, ops, kernels per preset, cached and AOT kernels")
    lst.add_argument("--env", action="store_true", help="list the TRACE_KERNELS_* knobs and their values")
    lst.set_defaults(func=cmd_list)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as error:
        print(f"trace-kernels: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
