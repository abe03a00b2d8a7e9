"""The documentation works as written: every `dfl ...` command line in README.md and docs/ parses with the real
parser, the generated reference pages are current, the README stays short and its links resolve. (The Python
blocks themselves run as tests through pytest-markdown-docs: pyproject.toml's `testpaths` and `addopts`.)"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from dfl.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}


def command_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, command) of every `dfl ...` (or `... -m dfl.cli ...`) command in the shell blocks of `path`,
    continuation lines joined, comments dropped, `&&` chains split."""
    found = []
    for token in MarkdownIt("commonmark").parse(path.read_text()):
        if token.type != "fence" or token.info.split()[:1] not in [[s] for s in SHELL]:
            continue
        text = token.content.replace("\\\n", " ")
        for offset, line in enumerate(text.splitlines()):
            line = re.sub(r"\$\{?\w+\}?", "1", line)  # a shell variable ($p in a loop): stands for a number
            try:
                words_of_line = shlex.split(line, comments=True)
            except ValueError:  # a line of a multi-line quoted argument (python -c "...")
                continue
            while words_of_line:
                cut = words_of_line.index("&&") if "&&" in words_of_line else len(words_of_line)
                words, words_of_line = words_of_line[:cut], words_of_line[cut + 1:]
                if words[:1] == ["dfl"]:
                    found.append((token.map[0] + 2 + offset, words[1:]))
                elif "dfl.cli" in words and words[words.index("dfl.cli") - 1] == "-m":
                    found.append((token.map[0] + 2 + offset, words[words.index("dfl.cli") + 1:]))
    return found


ALL_COMMANDS = [(f"{path.relative_to(ROOT)}:{line}", argv) for path in PAGES for line, argv in command_lines(path)]


def test_the_collector_finds_commands(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```bash\ndfl run --rounds 2   # two\npip install x && dfl list models\ndfl sweep a.toml \\\n"
                    "  --out d\ntorchrun --nproc_per_node=2 -m dfl.cli run --clients 4\n```\n")
    assert [argv for _, argv in command_lines(page)] == [["run", "--rounds", "2"], ["list", "models"],
                                                         ["sweep", "a.toml", "--out", "d"], ["run", "--clients", "4"]]
    assert len(ALL_COMMANDS) >= 30  # the docs show many commands


@pytest.mark.parametrize("where, argv", ALL_COMMANDS, ids=[w for w, _ in ALL_COMMANDS])
def test_every_documented_command_parses(where, argv):
    command = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(command or "")
    args, extra = parser.parse_known_args(argv or ["run"])
    assert extra == [], f"{where}: unknown arguments {extra}"
    assert getattr(args, "handler", None) is not None, f"{where}: {argv} names no command"


def test_reference_pages_are_current():
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--check"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr


def test_readme_is_short_and_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    assert 'pip install "torch==2.13.0" -e ".[test]" && dfl run' in first_block
    test_command = first_block.split("# run the tests", 1)[1].splitlines()[1]
    assert test_command.startswith("python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"\n{test_command}\n" in ci  # CI runs the README's test command verbatim
    # ... after the README's main job (or its short variant) in the same directory, as a new user does
    lines = ci.splitlines()
    main_job = [i for i, line in enumerate(lines) if re.fullmatch(r"dfl run( --rounds \d+)?", line)]
    tests = lines.index(test_command)
    assert main_job and main_job[0] < tests, "CI must run `dfl run` before the README's test command"
    assert not any(line.startswith(("cd ", "pushd ")) for line in lines[main_job[0]:tests])


def test_links_between_pages_resolve():
    for path in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).resolve().is_file(), f"{path.relative_to(ROOT)} links to {target}"


def test_lists_render_as_lists_on_the_site():
    """Python-Markdown (MkDocs) starts a list only after a blank line; GitHub does not need one, so a list glued
    to its paragraph looks right in the README view and renders as one run-on paragraph on the site."""
    import markdown
    import yaml

    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    extensions = [e if isinstance(e, str) else next(iter(e)) for e in site["markdown_extensions"]]
    for path in PAGES[1:]:  # the site's pages (README.md is read on GitHub)
        html = markdown.markdown(path.read_text(), extensions=extensions)  # as mkdocs renders them
        for paragraph in re.findall(r"<p>(.*?)</p>", html, re.S):
            glued = re.search(r"\n(?:[-*+]|\d+\.) \S.*", paragraph)
            assert glued is None, f"{path.relative_to(ROOT)}: list item glued to a paragraph: {glued.group()[:60]!r}"


def _api_objects() -> list[tuple[str, object]]:
    """(dotted name, object) of everything the API page renders: each `::: path` and its listed members."""
    import importlib
    import inspect

    def resolve(path: str):
        parts = path.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for part in parts[i:]:
                obj = getattr(obj, part)
            return obj
        raise ImportError(path)

    found = []
    page = (ROOT / "docs" / "reference" / "api.md").read_text()
    for path, options in re.findall(r"^::: ([\w.]+)\n((?:    .*\n|\s*\n)*)", page, re.M):
        obj = resolve(path)
        found.append((path, obj))
        members = re.search(r"members: \[([^\]]*)\]", options)
        for name in (m.strip() for m in (members.group(1).split(",") if members else [])):
            member = getattr(obj, name)
            if inspect.isroutine(member) or inspect.isclass(member):  # constants (registries) carry no docstring
                found.append((f"{path}.{name}", member))
    return found


def test_the_api_page_renders_a_docstring_for_everything_it_lists():
    """mkdocstrings renders the docstrings as Google style (mkdocs.yml): a summary line, then sections such as
    `Args:` / `Returns:` / `Raises:`; NumPy-style underlined sections would render as plain text."""
    objects = _api_objects()
    assert len(objects) > 30
    for name, obj in objects:
        doc = obj.__doc__ or ""
        assert doc.strip(), f"{name} has no docstring"
        assert not re.search(r"^\s*-{3,}\s*$", doc, re.M), f"{name}: NumPy-style section underline"
