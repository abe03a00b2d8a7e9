"""A pytest plugin: every test runs in its own temporary folder, and nothing a test does may write into the folder
pytest was started from (the README runs `dfl run` and then the tests in the same clone: a test that wrote or read
`runs/...` there would see the user's runs).

- Each test (unit tests, and the examples of README.md and docs/ that pytest-markdown-docs runs) starts with its
  `tmp_path` as the current directory, so a relative path (`runs/...`, `--out x`, a figure) lands there.
- After each test the folder pytest started in, to two levels (e.g. `runs/<a run>`), must hold the same entries as
  before it; a test that added or removed one fails in its teardown, naming them. The whole tree is compared once
  more at the end of the session (every level; the exit status turns to failed when it differs), which also
  catches a write deeper down.

Only entries created or removed count: a file edited in place (a checkout being worked on while the tests run) is
not flagged. Caches that tools keep next to the code (`__pycache__`, `.pytest_cache`, ...) and the version-control
and virtual-environment folders are not looked at. The root conftest.py loads this plugin; it is a module of its
own so that `tests/test_cwd_guard.py` can run it in an inner pytest session and see it catch a writer.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# what tools write next to the code (bytecode, caches of pytest, mypy, ruff, hypothesis), version control, venvs
IGNORED = frozenset({".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
                     ".hypothesis", ".ipynb_checkpoints"})
_skipped: set[str] = set()  # top-level names that pytest itself writes there (`--basetemp`)
PER_TEST_DEPTH = 2  # levels compared after every test (a few milliseconds); the session's end compares them all

_STARTED_IN = pytest.StashKey[Path]()
_SESSION_TREE = pytest.StashKey[frozenset]()
_LAST_SEEN = pytest.StashKey[dict]()


def entries(root: Path, depth: int | None = None) -> frozenset[str]:
    """The relative paths (files, folders, links) under `root`, down to `depth` levels (None: every level).

    Skips `IGNORED` names and `*.egg-info`; links are listed, not followed.
    """
    found: set[str] = set()
    stack = [(str(root), 1)]
    while stack:
        folder, level = stack.pop()
        try:
            listing = list(os.scandir(folder))
        except OSError:  # removed meanwhile, or not readable: nothing of it to compare
            continue
        for entry in listing:
            if entry.name in IGNORED or entry.name.endswith(".egg-info") or (level == 1 and entry.name in _skipped):
                continue
            found.add(os.path.relpath(entry.path, root))
            if (depth is None or level < depth) and entry.is_dir(follow_symlinks=False):
                stack.append((entry.path, level + 1))
    return frozenset(found)


def describe(before: frozenset[str], after: frozenset[str], limit: int = 8) -> str:
    """'added a, b; removed c' for the difference of two `entries` listings."""
    parts = []
    for verb, names in (("added", sorted(after - before)), ("removed", sorted(before - after))):
        if names:
            shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
            parts.append(f"{verb} {shown}")
    return "; ".join(parts)


def pytest_configure(config: pytest.Config) -> None:
    """Remember where pytest started (the folder tests must leave alone) and, on the controller, its whole tree."""
    started = Path(config.invocation_params.dir).resolve()
    config.stash[_STARTED_IN] = started
    basetemp = config.option.basetemp  # `--basetemp DIR` inside the folder: pytest's own, not a test's writing
    if basetemp and Path(basetemp).resolve().is_relative_to(started):
        _skipped.add(Path(basetemp).resolve().relative_to(started).parts[0])
    config.stash[_LAST_SEEN] = {"tree": entries(started, PER_TEST_DEPTH)}
    if not hasattr(config, "workerinput"):  # the controller under xdist, or the only process
        config.stash[_SESSION_TREE] = entries(started)


@pytest.fixture(autouse=True)
def _in_its_own_temporary_folder(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run the test in `tmp_path`; afterwards, fail it if the folder pytest started in gained or lost entries."""
    config = request.config
    started, seen = config.stash[_STARTED_IN], config.stash[_LAST_SEEN]
    monkeypatch.chdir(tmp_path)
    yield
    now = entries(started, PER_TEST_DEPTH)
    before, seen["tree"] = seen["tree"], now  # one offender fails once, not every test after it
    if now != before:
        pytest.fail(f"{request.node.nodeid} changed the folder pytest was started in ({started}): "
                    f"{describe(before, now)}; tests write only under tmp_path (pass --out, out=)", pytrace=False)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """On the controller: the whole tree of the starting folder is as it was; else report it and fail the run."""
    config = session.config
    if hasattr(config, "workerinput") or _SESSION_TREE not in config.stash:
        return
    started = config.stash[_STARTED_IN]
    before, now = config.stash[_SESSION_TREE], entries(started)
    if now == before:
        return
    message = (f"the tests changed the folder pytest was started in ({started}): {describe(before, now)}; tests "
               "write only under tmp_path")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "cwd guard", red=True)
        reporter.write_line(message, red=True)
    else:
        print(message)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
