"""The README is edited by hand and by scripts; a botched edit has duplicated half of it twice. Catch that."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_has_no_repeated_sections_or_paragraph_lines():
    lines, fenced = [], False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:  # commands in code blocks may repeat
            lines.append(line)
    headings = Counter(line for line in lines if line.startswith("#"))
    assert not [h for h, n in headings.items() if n > 1], "a heading appears twice"
    prose = Counter(line for line in lines if len(line) >= 80 and not line.startswith(("|", " ", "#")))
    assert not [line for line, n in prose.items() if n > 1], "a line of prose appears twice"
