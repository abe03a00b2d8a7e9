"""Every built-in algorithm documents itself where it lives: a unique summary line (what `dfl list algorithms` shows),
the paper, and every hyperparameter it reads with its default, written as "`name` (default)"."""

from __future__ import annotations

import inspect

import pytest

from dfl.algorithms import ALGORITHMS

BUILT_IN = [name for name, cls in ALGORITHMS.items() if cls.__module__.startswith("dfl.algorithms.")]


def own_doc(cls: type) -> str:
    return inspect.cleandoc(cls.__dict__.get("__doc__") or "")


def test_every_built_in_algorithm_has_its_own_unique_summary_line():
    assert len(BUILT_IN) >= 24
    summaries = {}
    for name in BUILT_IN:
        doc = own_doc(ALGORITHMS.get(name))
        assert doc, f"{name} has no docstring of its own"
        summaries.setdefault(doc.splitlines()[0], []).append(name)
    shared = {line: names for line, names in summaries.items() if len(names) > 1}
    assert not shared, f"algorithms share a summary line: {shared}"


def format_default(value) -> str:
    return str(value)


@pytest.mark.parametrize("name", BUILT_IN)
def test_the_docstring_names_the_paper_and_every_hyperparameter_with_its_default(name):
    cls = ALGORITHMS.get(name)
    doc = own_doc(cls)
    assert any(str(year) in doc for year in range(2015, 2027)), f"{name}: no paper (year) in the docstring"
    assert "Hyperparameters:" in doc, f"{name}: no Hyperparameters section"
    section = doc.split("Hyperparameters:", 1)[1]
    missing = [f"`{key}` ({format_default(default)})" for key, default in cls.card.defaults().items()
               if f"`{key}` ({format_default(default)})" not in section]
    assert not missing, f"{name}'s docstring does not document {', '.join(missing)}"
