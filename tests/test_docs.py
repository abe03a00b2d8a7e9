"""The documentation works as written: every shell command of README.md and docs/ runs (the rules are above
`shell_steps`), every `dfl ...` command line parses with the real parser, the generated reference pages are current,
the README stays short and its links resolve. (The Python blocks run as tests through pytest-markdown-docs:
pyproject.toml's `testpaths` and `addopts`.)"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from pytest_markdown_docs.plugin import parse_superfences_block_info

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


def test_lists_and_formulas_render_on_the_site():
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
        # a $$ formula the math extension did not take (e.g. indented by 2 inside a list item: Python-Markdown wants
        # 4) is shown as raw LaTeX
        prose = re.sub(r"<(pre|code)\b.*?</\1>", "", html, flags=re.S)
        raw = re.search(r"\$\$.{0,60}", prose, re.S)
        assert raw is None, f"{path.relative_to(ROOT)}: a formula shows as raw LaTeX: {raw.group()!r}"


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


# ---------------------------------------------------------------------------------------------------------------
# The pages' shell commands run as written (test_the_shell_commands_of_a_page_run). Which ones, and how:
#   - every command of a ```bash, ```sh or ```console block runs, in the order of the page, in one fresh temporary
#     directory per page (an earlier command makes the files a later one reads; `cd` carries over), with this
#     interpreter's `dfl`, `python` and `torchrun` first on PATH; the shipped folders a command names (benchmarks/,
#     launch/, examples/) are copied there first, as on a fresh clone;
#   - a console block's `$ command` lines run, and the output the page shows under one must be what it prints on
#     stdout and stderr (compared word by word, line by line; `...` stands for words left out, and then lines may be
#     left out too; a refusal shown on purpose may exit non-zero, and a later `$ echo $?` sees its status): the
#     numbers on a page are what the command gives;
#   - not run: a block fenced {.bash notest} (its text says why: a GPU, a cluster, a server that keeps running, an
#     install); a command whose comment (trailing, or the comment lines just above it) states a time in minutes or
#     of LONG_SECONDS or more (long: test_long_commands_come_after_a_short_one wants a shorter command of the same
#     program before it on the page, which runs); `pip install` lines (they change the environment) and the test
#     command itself;
#   - a command an earlier page runs word for word is not run again (unless a later command of its page reads its
#     --out): README.md's commands run there, not again on the page that explains them;
#   - a page that runs more than quick commands (`dfl topology`, `dfl list`, `--help`, `--dry-run`, files made with
#     cat/echo/mkdir/python -c) is marked slow.
LONG = re.compile(r"\b(?:minutes?|min|hours?)\b")
SECONDS = re.compile(r"(\d+(?:\.\d+)?)\s*(?:-\s*\d+(?:\.\d+)?\s*)?s\b")
LONG_SECONDS = 20  # a command whose comment states this many seconds or more is long
QUICK = re.compile(r"^(?:cat|echo|printf|mkdir|cd|ls|dfl topology|dfl list|dfl [\w-]+ .*--(?:help|dry-run)\b|"
                   r"python3? -c \"\s*import numpy)")
SHIPPED = ("benchmarks", "launch", "examples")
# commands that another test (or CI) runs as written, but for --out and --parallel: not run twice
RUN_ELSEWHERE = {
    "python benchmarks/byzantine_study.py --quick": "tests/test_byzantine_study.py",
    "python benchmarks/heterogeneity_study.py --quick": "tests/test_heterogeneity_study.py",
    "python benchmarks/reproduce_dfedsam.py --quick": ".ci/run",
}


@dataclass(frozen=True)
class Step:
    """One shell command of a page: where it starts, its text, its comments and, in a console block, the output the
    page shows (None: not shown). `skip` says why it does not run ("" when it runs)."""

    page: Path
    line: int
    text: str
    comment: str
    expected: str | None
    skip: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def program(self) -> str:
        """The command's program, as the long-after-short rule compares them: "dfl sweep", "python benchmarks/x.py"."""
        words = [w for w in _code_and_comment(self.text.split("\n", 1)[0])[0].split() if "=" not in w.split("/")[0]]
        if words[:1] == ["torchrun"]:
            return "torchrun"
        return " ".join(words[:2]).replace("python3 ", "python ")


def _essential(text: str) -> str:
    """A one-line command without its --out and --parallel values (the part RUN_ELSEWHERE compares)."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return text
    kept = [w for i, w in enumerate(words) if w not in ("--out", "--parallel")
            and (i == 0 or words[i - 1] not in ("--out", "--parallel"))]
    return " ".join(kept).replace("python3 ", "python ")


def _code_and_comment(line: str) -> tuple[str, str]:
    """A shell line cut at its comment: a `#` outside quotes at the start or after a space."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line, ""


def _balanced(code: str) -> bool:
    """Whether `code` is whole: its quotes closed and its loops and conditionals ended."""
    try:
        words = [w.rstrip(";") for w in shlex.split(code)]
    except ValueError:
        return False
    return words.count("do") + words.count("then") == words.count("done") + words.count("fi")


def _commands(content: str) -> list[tuple[int, str, str]]:
    """(line offset, text, comments) of each command of a shell block: continuation lines, heredocs, multi-line
    quotes and loops kept whole; the comment lines just above a command are part of its comments."""
    lines, found, above, i = content.splitlines(), [], [], 0
    while i < len(lines):
        if not lines[i].strip():
            above, i = [], i + 1
            continue
        if lines[i].lstrip().startswith("#"):
            above, i = [*above, lines[i].strip().lstrip("#").strip()], i + 1
            continue
        start, text, code, comments = i, [], "", list(above)
        while i < len(lines):
            part, comment = _code_and_comment(lines[i])
            text.append(lines[i])
            code, i = code + part.rstrip("\\") + "\n", i + 1
            comments += [comment] if comment else []
            for word in re.findall(r"<<-?\s*['\"]?(\w+)", part):  # a heredoc's body, up to its end word, as it is
                while i < len(lines) and lines[i].strip() != word:
                    text.append(lines[i])
                    i += 1
                text.append(lines[i] if i < len(lines) else "")
                i += 1
            if not part.endswith("\\") and _balanced(code):
                break
        found.append((start, "\n".join(text), " ".join(comments)))
        above = []
    return found


def shell_steps(path: Path) -> list[Step]:
    """Every shell command of the page at `path`, in order, with whether it runs (the rules above)."""
    steps = []
    for token in MarkdownIt("commonmark").parse(path.read_text()):
        info = parse_superfences_block_info(token.info) if token.type == "fence" else []
        if not info or info[0] not in SHELL:
            continue
        fenced_off = "fenced notest" if "notest" in info else ""
        first = token.map[0] + 2  # the page's line of the block's first line
        if info[0] == "console":  # `$ command` lines, each followed by the output it shows
            chunks = re.split(r"^\$ ", token.content, flags=re.M)
            offset = chunks[0].count("\n")
            for chunk in chunks[1:]:
                (_, text, comment), *_ = _commands(chunk)
                output = chunk[len(text):].strip("\n")
                skip = _skip(text, comment, fenced_off)
                steps.append(Step(path, first + offset, text, comment, output or None, skip))
                offset += chunk.count("\n")
            continue
        for offset, text, comment in _commands(token.content):
            steps.append(Step(path, first + offset, text, comment, None, _skip(text, comment, fenced_off)))
    return steps


def _skip(text: str, comment: str, fenced_off: str) -> str:
    """Why a command does not run ("" when it does): the rules above."""
    if fenced_off:
        return fenced_off
    if re.search(r"\bpip install\b", text):
        return "installs packages"
    if re.search(r"\bpytest\b", text):
        return "the test command"
    if _essential(text) in RUN_ELSEWHERE:
        return f"run by {RUN_ELSEWHERE[_essential(text)]}"
    if LONG.search(comment) or any(float(m) >= LONG_SECONDS for m in SECONDS.findall(comment)):
        return "states a long time"
    return ""


def _code(text: str) -> str:
    return "\n".join(_code_and_comment(line)[0].rstrip() for line in text.splitlines()).strip()


def once_across_pages(pages: dict[Path, list[Step]]) -> dict[Path, list[Step]]:
    """The steps of `pages` with a command an earlier page already runs, word for word, not run again.

    Unless a later command of its page reads what it writes (its --out path): then the page needs its own run; quick
    commands and shell variables (which set what later commands read) always run.
    """
    seen: dict[str, Path] = {}
    result = {}
    for page, steps in pages.items():
        kept = []
        for i, step in enumerate(steps):
            out = re.search(r"--out\s+(\S+)", _code(step.text))
            # the --out path as a whole path (or a folder of one), not the start of a longer name (runs/x-2)
            read_later = out is not None and any(re.search(rf"(?<![\w.-]){re.escape(out.group(1))}(?![\w.-])",
                                                           later.text) for later in steps[i + 1:])
            cheap = QUICK.match(step.text) or re.fullmatch(r"\w+=\S*", _code(step.text))  # sets state: runs
            if not step.skip and not cheap and _code(step.text) in seen and not read_later:
                step = dataclasses.replace(step, skip=f"run on {seen[_code(step.text)].relative_to(ROOT)}")
            elif not step.skip:
                seen.setdefault(_code(step.text), page)
            kept.append(step)
        result[page] = kept
    return result


STEPS = once_across_pages({path: shell_steps(path) for path in PAGES})
RUN_PAGES = [path for path, steps in STEPS.items() if any(not s.skip for s in steps)]


def _page_param(path: Path):
    quick = all(QUICK.match(s.text) for s in STEPS[path] if not s.skip)
    return pytest.param(path, id=str(path.relative_to(ROOT)), marks=() if quick else pytest.mark.slow)


def test_the_step_collector_reads_blocks_as_the_shell_does(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("text\n\n```bash\n# a comment above\ndfl run --rounds 2 \\\n    --out a   # two rounds\n"
                    "cat > x.toml <<'TOML'\nrounds = 1  # not a comment of the shell\nTOML\nfor p in 1 2; do\n"
                    "  echo $p\ndone\npython -c \"\nprint(1)\"\n"
                    "dfl sweep s.toml   # ~3 minutes\ndfl run   # 25 s\ndfl run   # 2-3 s\npip install tensorboard\n"
                    "```\n\n```{.bash notest}\ndfl run\n```\n"
                    "\n```console\n$ dfl topology ring --clients 4\nring  4\n$ dfl list models\n```\n")
    steps = shell_steps(page)
    assert [(s.line, s.skip) for s in steps] == [
        (5, ""), (7, ""), (10, ""), (13, ""), (15, "states a long time"), (16, "states a long time"), (17, ""),
        (18, "installs packages"), (22, "fenced notest"), (26, ""), (28, "")]
    assert steps[0].comment == "a comment above two rounds" and steps[0].text.endswith("--out a   # two rounds")
    assert steps[1].text.endswith("TOML") and steps[2].text.endswith("done") and steps[3].program == "python -c"
    assert (steps[9].expected, steps[10].expected, steps[4].program) == ("ring  4", None, "dfl sweep")


def test_a_command_an_earlier_page_runs_is_not_run_again_unless_its_page_reads_its_out(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)  # the pages' names are relative to ROOT
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    first.write_text("```bash\ndfl run --rounds 9 --out runs/x\ndfl run --rounds 8 --out runs/y\n```\n")
    second.write_text("```bash\ndfl run --rounds 9 --out runs/x\ndfl run --rounds 8 --out runs/y\n"
                      "dfl run --rounds 7 --out runs/x-2\ndfl report runs/y/metrics.jsonl\n```\n")
    steps = once_across_pages({first: shell_steps(first), second: shell_steps(second)})
    assert [s.skip for s in steps[first]] == ["", ""]
    # runs/x-2 is another folder than runs/x; runs/y/metrics.jsonl is in runs/y: that run is needed on this page
    assert [s.skip for s in steps[second]] == ["run on a.md", "", "", ""]


def test_long_commands_come_after_a_short_one():
    """A command left out for its time has a shorter command of the same program before it on its page, which runs:
    a reader tries the small one first, and the test keeps the small one working."""
    alone = [f"{step.where}: {step.program}" for steps in STEPS.values() for i, step in enumerate(steps)
             if step.skip == "states a long time"
             and not any((not s.skip or s.skip.startswith("run ")) and s.program == step.program for s in steps[:i])]
    assert alone == [], f"long commands without a short variant before them on their page: {alone}"


def test_the_commands_run_elsewhere_are_run_there():
    for command, where in RUN_ELSEWHERE.items():
        text = (ROOT / where).read_text()
        script, flags = command.split()[1].split("/")[-1], command.split()[2:]
        assert script in text and all(flag in text for flag in flags), f"{where} does not run {command}"


SETUP_LINE = re.compile(r"^\r?dfl: .*(?: \.\.\. \d+ s|: done in [\d.]+ s)\s*$")


def _words(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip("\n").splitlines() if line.strip()]


def shows(output: str, expected: str) -> bool:
    """Whether `output` is what a console block shows as `expected`: the same lines, word for word.

    A page may abbreviate: `...` stands for words it leaves out of a line, and then whole lines may be left out too
    (every line shown must still be there, in order). The lines of a set-up step that took long (`dfl: making the
    data ... 2 s`, `dfl.engine.hooks.announced`) depend on the machine's load and are not compared.
    """
    output = "\n".join(line for line in output.splitlines() if not SETUP_LINE.match(line))
    if "..." not in expected:
        return _words(output) == _words(expected)
    lines = iter(_words(output))
    for shown in _words(expected):
        pattern = re.compile(r"\s+".join(".*?" if word == "..." else re.escape(word) for word in shown) + "$")
        if not any(pattern.match(" ".join(line)) for line in lines):
            return False
    return True


# The pages' `dfl` commands go to one Python process per test worker (tests/doc_worker.py), which runs each with the
# console script's `dfl.cli.main`: as written, without paying Python's, torch's and the data's start-up per command.
DFL_FUNCTION = r"""
DFL_N=0
dfl() {
  DFL_N=$((DFL_N + 1))
  { printf '%s\0' "$DFL_LOG" "$PWD" "$DFL_N" "$@"; printf '\n'; } > "$DFL_REQUEST"
  local status
  read -r status < "$DFL_REPLY"
  cat "$DFL_LOG/$DFL_N.out"
  cat "$DFL_LOG/$DFL_N.err" >&2
  return "$status"
}
"""


class DflWorker:
    """The process that runs the pages' `dfl` commands (tests/doc_worker.py), fed through two fifos in `folder`."""

    def __init__(self, folder: Path):
        self.request, self.reply = folder / "request", folder / "reply"
        os.mkfifo(self.request)
        os.mkfifo(self.reply)
        self.log = open(folder / "worker.log", "w")  # noqa: SIM115 (open while the process lives)
        self.process = subprocess.Popen([sys.executable, str(ROOT / "tests" / "doc_worker.py"), str(self.request),
                                         str(self.reply)], cwd=folder, env=PAGE_ENV, stdin=subprocess.DEVNULL,
                                        stdout=self.log, stderr=subprocess.STDOUT)

    def close(self) -> None:
        """Stop the process (an empty request; killed if it does not end)."""
        if self.process.poll() is None:
            with open(self.request, "w") as fifo:
                fifo.write("\n")
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


PAGE_ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "MPLBACKEND": "Agg"}


def run_page(page: Path, folder: Path, worker: DflWorker) -> list[tuple[Step, int | None, str, str, float]]:
    """Run the commands of `page` that run (the rules above) in `folder`, as one bash script, in order.

    One script, so that what a command leaves (a file, the working directory, a shell variable) is there for the
    next; `set -e` stops it at the first failure; its `dfl` commands go to `worker`. Returns (step, exit status or
    None when not reached, stdout, stderr, seconds) per step.
    """
    steps = [s for s in STEPS[page] if not s.skip]
    for shipped in SHIPPED:
        if any(re.search(rf"(?<![\w/.]){shipped}/", s.text) for s in steps):
            shutil.copytree(ROOT / shipped, folder / shipped, ignore=shutil.ignore_patterns("__pycache__", "results"))
    log = folder.parent / f"{folder.name}-log"
    (log / "dfl").mkdir(parents=True)
    script = ["set -eo pipefail", "DFL_STATUS=0", DFL_FUNCTION]
    for i, step in enumerate(steps):
        run = f"{{\n{step.text}\n}} > {log}/{i}.out 2> {log}/{i}.err"
        if step.expected is not None:  # a console command shows what it prints, a refusal too (`echo $?`: its status)
            run = f"set +e\n(exit $DFL_STATUS)\n{run}\nDFL_STATUS=$?\necho $DFL_STATUS > {log}/{i}.status\nset -e"
        script += [f"echo $EPOCHREALTIME > {log}/{i}.start", run, f"echo $EPOCHREALTIME > {log}/{i}.end"]
    env = {**PAGE_ENV, "DFL_REQUEST": str(worker.request), "DFL_REPLY": str(worker.reply), "DFL_LOG": str(log / "dfl")}
    proc = subprocess.run(["bash", "-c", "\n".join(script)], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True)
    results = []
    for i, step in enumerate(steps):
        if not (log / f"{i}.start").exists():
            results.append((step, None, "", "", 0.0))
            continue
        ended = (log / f"{i}.end").exists()
        seconds = (float((log / f"{i}.end").read_text()) if ended else 0.0) - float((log / f"{i}.start").read_text())
        status = 0 if ended else proc.returncode
        if (log / f"{i}.status").exists():  # a console command: its own status
            status = int((log / f"{i}.status").read_text())
        out, err = ((log / f"{i}.{kind}").read_text(errors="replace") for kind in ("out", "err"))
        results.append((step, status, out, err + (proc.stderr if not ended else ""), max(seconds, 0.0)))
    return results


@pytest.fixture(scope="session")
def dfl_worker(tmp_path_factory):
    """One `DflWorker` for every page this test process runs."""
    worker = DflWorker(tmp_path_factory.mktemp("dfl-worker"))
    yield worker
    worker.close()


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", [_page_param(p) for p in RUN_PAGES])
def test_the_shell_commands_of_a_page_run(page, tmp_path, dfl_worker):
    """Each command the page runs (the rules above) succeeds, in order, in one fresh folder; console output matches."""
    folder = tmp_path / "page"
    folder.mkdir()
    for step, status, out, err, _ in run_page(page, folder, dfl_worker):
        if step.expected is None:
            assert status == 0, f"{step.where}: `{step.text}` exited with {status}:\n{(out + err)[-3000:]}"
        else:  # what the terminal shows: its output and its errors (a refusal shown on purpose), whatever its status
            assert status is not None and shows(out + err, step.expected), (
                f"{step.where}: `{step.text}` printed\n{out + err}\nbut the page shows\n{step.expected}")


def test_console_output_is_compared_word_by_word_and_may_abbreviate():
    output = "Q = 4 steps\ntopology  n  lambda  gap\nring  16  0.9493  0.05075\nfull  16  0  1\n"
    assert shows(output, "Q = 4 steps\ntopology n lambda gap\nring 16 0.9493 0.05075\nfull 16 0 1")
    assert not shows(output, "topology n lambda gap\nring 16 0.9493 0.05075\nfull 16 0 1")  # a line left out
    assert shows(output, "topology ... gap\nring 16 ... 0.05075\nfull ... 1")  # abbreviated
    assert not shows(output, "topology ... gap\nring 16 ... 0.05\nfull ... 1")  # a number that differs
    assert not shows(output, "full ... 1\nring 16 ... 0.05075")  # out of order
    slow = "dfl: making the data (mnist1d) ... 2 s\ndfl: making the data (mnist1d): done in 2.7 s\n" + output
    assert shows(slow, output)  # a set-up step's progress lines depend on the load
