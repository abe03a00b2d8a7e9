"""The `>>>` examples in dfl's docstrings run: every module that holds one is listed here and executed by doctest, so
an example that stops matching what the code does fails the suite (the API reference renders these examples)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MODULES = ["dfl", "dfl.config", "dfl.registry", "dfl.graphs", "dfl.algorithms.base"]


def modules_with_examples() -> set[str]:
    """Every module of dfl/ and topologies/ whose source holds a `>>>` prompt."""
    found = set()
    for package in ("dfl", "topologies"):
        for path in (ROOT / package).rglob("*.py"):
            if ">>> " in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT).with_suffix("").parts
                found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def test_every_module_with_an_example_is_run():
    assert modules_with_examples() == set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_examples(name):
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder().find(module, name)
    assert sum(len(t.examples) for t in tests) > 0, f"{name} has no example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (output above)"
