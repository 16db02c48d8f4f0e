"""The user's guide (README.md) holds each of its sections once: an edit that wrote the file again after its own
text (as one did) doubles every section, and nothing else would notice."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _headings(text: str) -> list[str]:
    """The Markdown headings of `text` outside fenced code blocks (a shell comment in one is no heading)."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.append(line)
    return out


def test_every_section_of_the_readme_is_there_once() -> None:
    headings = _headings(README.read_text(encoding="utf-8"))
    assert headings and headings[0] == "# ddpslurm"
    twice = [h for h, n in Counter(headings).items() if n > 1]
    assert not twice, f"sections written twice: {twice}"

