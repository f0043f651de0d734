"""Run the Python examples of the documentation.

Every fenced ``python`` block in ``docs/*.md`` and ``README.md`` is executed. The blocks
of one page run in order in one shared namespace, so a later block may use names an
earlier one defined; a page fails if any of its blocks raises. A block whose preceding
non-blank line is ``<!-- skip-test -->`` is not run.

Tracebacks name the Markdown file and its real line numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SKIP_MARKER = "<!-- skip-test -->"
_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: where its code starts (1-based line) and the code."""

    first_line: int
    code: str


def _kind(info: str) -> str:
    """Classify a fence by its info string: ``python``, ``directive`` or ``literal``."""
    info = info.strip()
    if info.startswith("{"):
        return "directive"  # a MyST directive: its body is Markdown and may hold fences
    words = info.split()
    return "python" if words and words[0].lower() == "python" else "literal"


def python_blocks(text: str) -> list[Block]:
    """Return the fenced ``python`` blocks of a Markdown text that are not marked to skip.

    A MyST directive (```` ```{note} ````) may hold code blocks, which are found too, so
    open fences are kept on a stack. A fence closes the innermost open one when it uses
    the same character, is at least as long, and has no info string. Inside a code block
    (python or any other language) every other line is code.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    # Open fences as (character, length, index of the opening line, kind).
    stack: list[tuple[str, int, int, str]] = []
    for i, line in enumerate(lines):
        match = _FENCE.match(line)
        if match is None:
            continue
        fence, info = match["fence"], match["info"]
        if stack:
            char, length, start, kind = stack[-1]
            if fence[0] == char and len(fence) >= length and not info.strip():
                stack.pop()
                if kind == "python" and not _skip_marked(lines, start):
                    blocks.append(Block(start + 2, "\n".join(lines[start + 1 : i])))
                continue
            if kind != "directive":
                continue  # a fence-like line inside a code block is code
        stack.append((fence[0], len(fence), i, _kind(info)))
    if stack:
        msg = f"unclosed code fence opened on line {stack[-1][2] + 1}"
        raise ValueError(msg)
    return blocks


def _skip_marked(lines: list[str], fence_index: int) -> bool:
    """Tell whether the last non-blank line before a fence is the skip marker."""
    for line in reversed(lines[:fence_index]):
        if line.strip():
            return line.strip() == SKIP_MARKER
    return False


def _pages() -> list[Path]:
    pages = sorted((ROOT / "docs").glob("*.md"))
    readme = ROOT / "README.md"
    if readme.exists():
        pages.append(readme)
    return pages


PAGES = [page for page in _pages() if python_blocks(page.read_text(encoding="utf-8"))]


def _page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def test_pages_with_examples_are_found() -> None:
    found = {_page_id(page) for page in PAGES}
    expected = {"docs/quickstart.md", "docs/cache.md", "docs/errors.md", "docs/testing.md"}
    assert expected | {"docs/wire.md"} <= found


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_page_examples_run(page: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_example_{page.stem}"}
    for block in python_blocks(page.read_text(encoding="utf-8")):
        # Pad with blank lines so that tracebacks show the line numbers of the .md file.
        source = "\n" * (block.first_line - 1) + block.code + "\n"
        exec(compile(source, str(page), "exec"), namespace)


def test_parser_nesting_and_skip() -> None:
    text = "\n".join(
        [
            "````{note}",
            "```python",
            "z = 0",
            "```",
            "````",
            "",
            "```python",
            "x = 1",
            "```",
            "<!-- skip-test -->",
            "",
            "```python",
            "raise AssertionError('skipped')",
            "```",
            "~~~Python title",
            "y = '```'",
            "```",
            "~~~",
            "```text",
            "```python",
            "```",
        ]
    )
    blocks = python_blocks(text)
    assert [b.code for b in blocks] == ["z = 0", "x = 1", "y = '```'\n```"]
    assert [b.first_line for b in blocks] == [3, 8, 16]
