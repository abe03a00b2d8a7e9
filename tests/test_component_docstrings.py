"""Every built-in topology, model, dataset and partition documents itself where it is registered, as the algorithms
do (tests/test_algorithm_docstrings.py): a summary line of its own (what `dfl list` shows), and a Google-style
`Args:` entry for every option it takes, with the option's default ("Defaults to X.") or "Required."."""

from __future__ import annotations

import inspect
import logging

import griffe
import pytest

from dfl import signatures
from dfl.data import DATASETS, PARTITIONS, dataset_options, partition_options
from dfl.data.partitioners import FROM_DATASET  # inputs a partition takes from the dataset (natural's split)
from dfl.graphs import TOPOLOGIES, topology_options
from dfl.models import MODELS
from dfl.models.registry import model_options
from dfl.workflows import catalog

logging.getLogger("griffe").setLevel(logging.ERROR)  # "no type annotation" notes: the options are typed in code

REGISTRIES = {  # category -> (registry, the options each name takes, as validation reads them)
    "topologies": (TOPOLOGIES, topology_options),
    "models": (MODELS, model_options),
    "datasets": (DATASETS, dataset_options),
    "partitions": (PARTITIONS, partition_options),
}


def built_ins(registry) -> list[tuple[str, object]]:
    return [(name, obj) for name, obj in registry.items() if getattr(obj, "__module__", "").startswith("dfl.")]


def args_section(doc: str) -> dict[str, str]:
    """name -> description of the docstring's `Args:` entries, as mkdocstrings' Google parser reads them."""
    sections = griffe.Docstring(doc).parse("google")
    return {p.name: p.description for s in sections if s.kind is griffe.DocstringSectionKind.parameters
            for p in s.value}


def default_text(value) -> str:
    """How an Args entry states a default: "Required." or "Defaults to X" (strings in double quotes)."""
    if value == signatures.REQUIRED:
        return "Required."
    return f'Defaults to "{value}"' if isinstance(value, str) else f"Defaults to {value!r}"


CASES = [(category, name) for category, (registry, _) in REGISTRIES.items() for name, _ in built_ins(registry)]


def test_every_category_has_its_built_ins():
    assert {category for category, _ in CASES} == set(REGISTRIES)
    assert len(CASES) >= 15 + 7 + 7 + 6


@pytest.mark.parametrize("category", REGISTRIES)
def test_summary_lines_are_present_and_unique(category):
    registry, _ = REGISTRIES[category]
    summaries: dict[str, list[str]] = {}
    for name, obj in built_ins(registry):
        doc = inspect.getdoc(obj)
        assert doc, f"{category} {name!r} has no docstring"
        summaries.setdefault(doc.splitlines()[0], []).append(name)
    shared = {line: names for line, names in summaries.items() if len(names) > 1}
    assert not shared, f"{category} share a summary line: {shared}"


@pytest.mark.parametrize(("category", "name"), CASES)
def test_every_option_is_documented_with_its_default(category, name):
    registry, options_of = REGISTRIES[category]
    doc = inspect.getdoc(registry.get(name)) or ""
    documented = args_section(doc)
    missing = [option for option in options_of(name) if option not in documented]
    assert not missing, f"{category} {name!r}: no Args entry for {', '.join(missing)}"
    wrong = [f"{option} ({default_text(default)!r})" for option, default in options_of(name).items()
             if default_text(default) not in " ".join(documented[option].split())]
    assert not wrong, f"{category} {name!r}: the Args entries do not state the defaults {', '.join(wrong)}"
    inputs = signatures_positional(registry.get(name)) + (list(FROM_DATASET) if category == "partitions" else [])
    unknown = set(documented) - set(options_of(name)) - set(inputs)
    assert not unknown, f"{category} {name!r} documents options it does not take: {sorted(unknown)}"


def signatures_positional(obj) -> list[str]:
    """The positional parameters of a factory (input_shape, labels, root, ...), documented but not options.

    Like them, a partition's inputs that the dataset supplies (`FROM_DATASET`) are documented but are no options.
    """
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def test_the_topology_docstrings_are_one_class_each_in_build_order():
    import topologies
    from dfl.graphs import BUILTINS

    assert tuple(cls.name for cls in BUILTINS) == topologies.NAMES
    assert all(cls.__doc__ and "__doc__" in cls.__dict__ for cls in BUILTINS)


@pytest.mark.parametrize("category", [*REGISTRIES, "algorithms"])
def test_dfl_list_shows_each_summary_line(category):
    """`dfl list`'s description is the summary line of the registered object's docstring, read as it is."""
    for entry in catalog.entries(category):
        registry = REGISTRIES[category][0] if category in REGISTRIES else None
        if registry is None:
            from dfl.algorithms import ALGORITHMS as registry
        obj = registry.get(entry["name"])
        if getattr(obj, "__module__", "").startswith("dfl."):
            assert entry["description"] == inspect.getdoc(obj).splitlines()[0], entry["name"]


def test_the_api_reference_has_every_built_in_component():
    """docs/reference/api-components.md (generated: tests/test_docs.py keeps it current) has a section per built-in
    algorithm, topology, model, dataset and partition, opening with its docstring's summary line."""
    from pathlib import Path

    from dfl.algorithms import ALGORITHMS

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "api-components.md").read_text()
    sections = {part.split("\n", 1)[0]: part for part in page.split("\n### ")[1:]}
    for registry in (ALGORITHMS, *(registry for registry, _ in REGISTRIES.values())):
        for name, obj in built_ins(registry):
            assert name in sections, f"{registry.kind} {name!r} is not on the API reference"
            doc = obj.__dict__["__doc__"] if isinstance(obj, type) else inspect.getdoc(obj)
            summary = inspect.cleandoc(doc).splitlines()[0].replace("*", "\\*")
            assert summary in sections[name], f"{name}: the section does not show the summary line"
