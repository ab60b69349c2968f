"""docs/api.md's code blocks run as they are, in order, on the CPU: the one-page API stays true."""

import re
from pathlib import Path

API_DOC = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def test_api_page_runs():
    blocks = python_blocks(API_DOC.read_text())
    assert len(blocks) == 5, "docs/api.md's python blocks"
    namespace: dict = {}
    for index, block in enumerate(blocks):
        exec(compile(block, f"docs/api.md block {index + 1}", "exec"), namespace)  # noqa: S102 (our own doc)
    assert namespace["y"].shape == (16, 256) and namespace["out"].shape == (2, 8, 128)
