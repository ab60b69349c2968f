"""Render KernelSpecs with Jinja and write generated sources only when their content changed."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import jinja2

from trace_kernels import paths
from trace_kernels.codegen.spec import KernelSpec


@functools.lru_cache(maxsize=4)
def _environment(templates: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        undefined=jinja2.StrictUndefined,  # a missing parameter is an error, not an empty string
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render_spec(spec: KernelSpec) -> str:
    template = _environment(str(paths.templates_dir())).get_template(spec.template)
    return template.render(kernel_name=spec.name, **spec.params)


def write_if_different(path: Path, text: str) -> bool:
    """Write text to path atomically unless it already holds exactly that; True if written.

    Leaving unchanged files untouched keeps their mtime, so make/CMake rebuild nothing.
    """
    path = Path(path)
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
