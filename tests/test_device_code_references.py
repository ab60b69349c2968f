"""The references of tests/ and profiling/ to the project's modules hold: every `from trace_kernels... import name`
exists, and every `module_alias.attribute` exists and, where it is called or indexed at once, can be. CI skips the GPU
tests and runs few of the profiling scripts, so without this an API that moves leaves them failing only on the next
device call (it happened: `moe_gemm._counters` became a function when the counters moved to `ops._common`)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SOURCES = sorted([*TESTS.rglob("*.py"), *(TESTS.parent / "profiling").glob("*.py")])
PACKAGES = ("trace_kernels", "trace_rl")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def _references(tree: ast.Module) -> tuple[list[tuple[str, str, int]], dict[str, str]]:
    """(module, name, line) of every `from module import name`, and {alias: module} of the imported modules."""
    imported, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name) and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and _ours(node.module):
            for a in node.names:
                if _is_module(f"{node.module}.{a.name}"):
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                else:
                    imported.append((node.module, a.name, node.lineno))
    return imported, aliases


def _attribute_reads(tree: ast.Module, aliases: dict[str, str]) -> list[tuple[str, str, int, str]]:
    """(module, attribute, line, use) of every `alias.attribute` read; use is "call" or "subscript" where the read is
    called or indexed at once, else "read"."""
    uses = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            uses[id(n.func)] = "call"
        elif isinstance(n, ast.Subscript):
            uses[id(n.value)] = "subscript"
    return [(aliases[n.value.id], n.attr, n.lineno, uses.get(id(n), "read")) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name)
            and n.value.id in aliases]


def _problem(module: str, name: str, use: str) -> str | None:
    """What is wrong with using module.name so, or None."""
    owner = importlib.import_module(module)
    if not hasattr(owner, name):
        return "does not exist"
    value = getattr(owner, name)
    if use == "call" and not callable(value):
        return f"is called but is a {type(value).__name__}"
    if use == "subscript" and not (hasattr(type(value), "__getitem__") or isinstance(value, type)):
        return f"is indexed but is a {type(value).__name__}"
    return None


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(TESTS.parent)))
def test_referenced_names_exist(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    imported, aliases = _references(tree)
    uses = [(module, name, line, "read") for module, name, line in imported] + _attribute_reads(tree, aliases)
    problems = [f"line {line}: {module}.{name} {problem}" for module, name, line, use in uses
                if (problem := _problem(module, name, use))]
    assert not problems, f"{path.name}: {problems}"


def test_the_reference_that_slipped_through_is_caught():
    """moe_gemm._counters became a function when the counters moved to ops._common; a GPU test still indexed it."""
    old = ast.parse("from trace_kernels import moe_gemm as ops\nops._counters[(0, 'combine')]\n")
    new = ast.parse("from trace_kernels.ops import _common\n_common._counters[(0, 'combine')]\n")
    for tree, want in ((old, "is indexed but is a function"), (new, None)):
        _, aliases = _references(tree)
        (module, name, _, use), = _attribute_reads(tree, aliases)
        assert use == "subscript" and _problem(module, name, use) == want
    assert _problem("trace_kernels.moe_gemm", "no_such_name", "read") == "does not exist"
    assert _problem("trace_kernels.attention", "DEFAULT_NVFP4_VARIANT", "call") == "is called but is a str"
