"""Every reference in the repository resolves inside it: no file tracked by git cites the specification files
that lived outside the repository (or a folder beside it), and every `docs/<page>.md#<anchor>` named in code,
tests, configs or pages names a page that exists and a heading that page has, its anchor computed as MkDocs
computes it (Python-Markdown's toc extension, with the extensions configured in mkdocs.yml)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

# The names of the outside specification files, and the folder beside the repository that held them and the papers.
OUTSIDE = re.compile(r"\b(?:ALGORITHMS|TOPOLOGIES|DESIGN)\.md\b|\.\./shared\b")
# docs/<page>.md, optionally with #anchor and further ", #anchor" on the same page; "../" prefixes (a relative link
# from a file in a subfolder) are allowed, any other path before "docs/" (a URL, another folder) is not ours.
DOCS_REFERENCE = re.compile(r"(?<![\w/.-])(?:\.\./)*docs/((?:[\w-]+/)*[\w.-]+\.md)"
                            r"((?:#[\w-]+)?(?:(?:,\s*|,?\s+and\s+)#[\w-]+)*)")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".cfg", ".txt", ".ini", ""}


def tracked_files() -> list[str]:
    """The text files git tracks (code, tests, docs, configs, scripts), as paths relative to the repository root;
    outside a git checkout (an unpacked sdist), every such file under the root except hidden and build folders."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "runs", "site", "build", "dist", "node_modules"}
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts)]
    return sorted(n for n in names if Path(n).suffix in TEXT_SUFFIXES and (ROOT / n).is_file())


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8", errors="replace")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The ids MkDocs gives the headings of `page`: toc's slugs (duplicates suffixed _1, _2, ...), and explicit
    `{#id}` attributes where attr_list is configured, by rendering the page with mkdocs.yml's extensions."""
    import markdown
    import yaml

    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    extensions, configs = [], {}
    for entry in site.get("markdown_extensions", []):
        name, options = (entry, None) if isinstance(entry, str) else next(iter(entry.items()))
        extensions.append(name)
        if options:
            configs[name] = options
    if "toc" not in extensions:
        extensions.append("toc")
    md = markdown.Markdown(extensions=extensions, extension_configs=configs)
    md.convert(page.read_text(encoding="utf-8"))

    ids: set[str] = set()

    def walk(tokens):
        for token in tokens:
            ids.add(token["id"])
            walk(token["children"])

    walk(md.toc_tokens)
    return frozenset(ids)


def docs_references(text: str) -> list[tuple[int, str, str | None]]:
    """(line, page under docs/, anchor or None) of every docs/<page>.md[#anchor[, #anchor ...]] in `text`."""
    found = []
    for match in DOCS_REFERENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        fragments = re.findall(r"#([\w-]+)", match.group(2))
        for anchor in fragments or [None]:
            found.append((line, match.group(1), anchor))
    return found


def test_the_reference_finder_reads_paths_anchors_and_their_continuations():
    text = ("see docs/reference/update-rules.md#fedavg, #fedsam and #fedavgsm; (../../docs/how-to/data.md)\n"
            "not ours: https://example.org/docs/x.md mydocs/y.md `docs/index.md#top`")
    assert docs_references(text) == [(1, "reference/update-rules.md", "fedavg"),
                                     (1, "reference/update-rules.md", "fedsam"),
                                     (1, "reference/update-rules.md", "fedavgsm"),
                                     (1, "how-to/data.md", None), (2, "index.md", "top")]
    assert OUTSIDE.search("(ALGORITHMS.md §3.2)") and OUTSIDE.search("../shared/papers/x.txt")
    assert not OUTSIDE.search("MY_ALGORITHMS.md_x") and not OUTSIDE.search("docs/reference/update-rules.md")


def test_anchors_are_slugged_as_mkdocs_slugs_them(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Title\n\n## DFedSAM and DFedSAM-MGS\n\n## The `dfl run` command\n\n## A\n\n## A\n")
    assert anchors(page) == {"title", "dfedsam-and-dfedsam-mgs", "the-dfl-run-command", "a", "a_1"}


def outside_references() -> list[str]:
    return [f"{name}:{n}" for name in tracked_files() if name != SELF
            for n, line in enumerate(read(name).splitlines(), 1) if OUTSIDE.search(line)]


# Files other branches were editing when the references in the rest were replaced; the lead
# replaces these after merging (the mapping is in that branch's report), then this marker goes.


def test_no_file_cites_the_specification_outside_the_repository():
    found = outside_references()
    assert not found, ("these cite files outside the repository (use docs/reference/update-rules.md#..., "
                       "docs/concepts/... or docs/architecture.md#...): " + ", ".join(found))


def test_every_docs_page_and_anchor_named_in_the_repository_exists():
    broken = []
    for name in tracked_files():
        if name == SELF:
            continue
        for line, page, anchor in docs_references(read(name)):
            path = ROOT / "docs" / page
            if not path.is_file():
                broken.append(f"{name}:{line}: docs/{page} does not exist")
            elif anchor is not None and anchor not in anchors(path):
                broken.append(f"{name}:{line}: docs/{page} has no heading #{anchor}")
    assert not broken, "\n".join(broken)
