"""Every link inside the README (`](#anchor)`) points at one of its headings, with GitHub's anchor rule."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def heading_anchors(text: str) -> set[str]:
    """GitHub's slugs: lower case, punctuation dropped, spaces to '-', '-1', '-2' ... for repeats."""
    anchors, seen, in_code = set(), {}, False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code  # a '# comment' in a code block is not a heading
            continue
        match = None if in_code else re.match(r"#{1,6} (.+)", line)
        if match:
            slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_heading_anchors_follow_github():
    text = "# A: `dfl run`\n```\n# not a heading\n```\n## Local optimizer: Adam/AdamW\n## A: dfl run\n"
    assert heading_anchors(text) == {"a-dfl-run", "local-optimizer-adamadamw", "a-dfl-run-1"}


def test_every_readme_link_resolves():
    text = README.read_text()
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert len(links) >= 20  # the table of contents alone has more
    assert not [link for link in links if link not in heading_anchors(text)]
