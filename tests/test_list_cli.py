"""`dfl list [CATEGORY]`: every registry choice with a description and its options."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import topologies
from dfl.algorithms import ALGORITHMS, algorithm_class
from dfl.cli import main
from dfl.cli.listing import CATEGORIES
from dfl.data import DATASETS, PARTITIONS, dataset_options, partition_options
from dfl.loggers import LOGGERS
from dfl.models import MODELS
from dfl.models.registry import model_options
from dfl.network.byzantine_settings import AGGREGATORS, ATTACKS
from dfl.network.settings import COMPRESSORS

REGISTRIES = {
    "algorithms": ALGORITHMS,
    "topologies": topologies.NAMES,
    "models": MODELS,
    "datasets": DATASETS,
    "partitions": PARTITIONS,
    "weights": topologies.SCHEMES,
    "loggers": LOGGERS,
    "attacks": ATTACKS,
    "aggregators": AGGREGATORS,
    "compressors": COMPRESSORS,
}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["list", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, *argv: str) -> dict:
    code, out, _ = _run(capsys, *argv, "--json")
    assert code == 0
    return json.loads(out)


def test_every_category_is_covered():
    assert set(REGISTRIES) == set(CATEGORIES)


@pytest.mark.parametrize("category", CATEGORIES)
def test_every_registry_name_is_listed_with_a_description(capsys, category):
    code, out, err = _run(capsys, category)
    assert code == 0 and err == ""
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and not line.startswith("   ")]
    assert listed == list(REGISTRIES[category])
    entries = _json(capsys, category)[category]
    assert [e["name"] for e in entries] == list(REGISTRIES[category])
    assert all(e["description"].strip() for e in entries), [e["name"] for e in entries if not e["description"]]


def test_listing_everything_names_every_choice(capsys):
    code, out, _ = _run(capsys)
    assert code == 0
    for category, names in REGISTRIES.items():
        assert f"{category} ({len(names)})" in out
        for name in names:
            assert f"  {name} " in out or out.count(f"  {name}\n")
    assert "options:" not in out  # names and descriptions only
    listing = _json(capsys)
    assert list(listing) == list(CATEGORIES)
    assert {c: [e["name"] for e in entries] for c, entries in listing.items()} == {
        c: list(names) for c, names in REGISTRIES.items()}


def test_algorithm_hyperparameters_and_kind_in_json(capsys):
    entries = {e["name"]: e for e in _json(capsys, "algorithms")["algorithms"]}
    for name in ALGORITHMS:
        cls = algorithm_class(name)
        assert entries[name]["options"] == json.loads(json.dumps(cls.card.defaults())), name
        assert entries[name]["centralized"] is cls.card.centralized
    assert entries["dfedsam-mgs"]["options"]["gossip_steps"] == algorithm_class("dfedsam-mgs").card.defaults()[
        "gossip_steps"]


def test_text_shows_hyperparameter_defaults(capsys):
    _, out, _ = _run(capsys, "algorithms")
    block = re.split(r"\n  \S", out.split("\n  dfedsam-mgs ", 1)[1], maxsplit=1)[0]  # up to the next entry
    options = " ".join(block.split())
    for key, value in algorithm_class("dfedsam-mgs").card.defaults().items():
        assert f"{key}={value!r}" in options


def test_model_dataset_partition_options_match_the_registries(capsys):
    models = {e["name"]: e["options"] for e in _json(capsys, "models")["models"]}
    assert models == {n: json.loads(json.dumps(model_options(n))) for n in MODELS}
    datasets = {e["name"]: e["options"] for e in _json(capsys, "datasets")["datasets"]}
    assert datasets == {n: dataset_options(n) for n in DATASETS}
    partitions = {e["name"]: e["options"] for e in _json(capsys, "partitions")["partitions"]}
    assert partitions == {n: partition_options(n) for n in PARTITIONS}
    assert partitions["similarity"] == {"similarity": "required"}


def test_topology_options_and_defaults(capsys):
    entries = {e["name"]: e for e in _json(capsys, "topologies")["topologies"]}
    assert entries["random-regular"]["options"] == {"degree": None, "seed": 0}
    assert entries["grid"]["options"] == {"shape": None, "periodic": False}
    assert entries["random-k"]["kind"] == "time-varying" and entries["ring"]["kind"] == "static"
    assert set(entries["custom"]["options"]) >= {"graph", "path", "matrix"}
    weights = {e["name"]: e for e in _json(capsys, "weights")["weights"]}
    assert weights["lazy"]["options"] == {"base": "metropolis"}


def test_unknown_category_is_a_one_line_error(capsys):
    code, out, err = _run(capsys, "nosuch")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown category 'nosuch'" in err
    assert all(c in err for c in CATEGORIES)
    code, _, err = _run(capsys, "modles")
    assert code == 2 and "did you mean models?" in err


def test_a_unique_prefix_selects_the_category(capsys):
    assert _run(capsys, "algo")[1] == _run(capsys, "algorithms")[1]


def test_parsing_list_imports_nothing_heavy():
    code = ("import sys, dfl.cli as c\n"
            "try:\n    c.main(['list', 'nosuch'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'networkx', 'scipy', 'dfl.algorithms') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_cli_categories_are_the_catalogs():
    from dfl.workflows import catalog

    assert CATEGORIES == catalog.CATEGORIES == tuple(catalog.LISTERS)
