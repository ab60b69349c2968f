"""One module per op. Each defines `OP = OpCodegen(name, specs_for_shape)` and a spec builder.

Modules here are discovered by trace_kernels.codegen.registry; add a file, edit nothing else.
"""
