"""Every ```python block of the user docs runs, in order, in one namespace per file."""

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[2] / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
FILES = sorted(p for p in DOCS.glob("*.md") if BLOCK.search(p.read_text()))


@pytest.mark.parametrize("doc", FILES, ids=[p.name for p in FILES])
def test_doc_snippets_run(doc, capsys):
    namespace: dict = {}
    for i, block in enumerate(BLOCK.findall(doc.read_text())):
        code = compile(block, f"{doc.name}[block {i}]", "exec")
        exec(code, namespace)  # noqa: S102 - our own documentation
