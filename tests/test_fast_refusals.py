"""Every check that needs no data answers before torch is imported. The built-in components are
declared by card (`dfl.registry.Registry.declare`); these tests keep each card equal to what it declares, and
show that `dfl.validate` and the CLI's refusals load no torch. Misspelled names are answered with the right
spelling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dfl
from dfl import algorithms, data, models
from dfl.config import Config
from dfl.errors import ConfigError
from dfl.network import settings
from dfl.registry import Registry, suggest

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ the cards
@pytest.mark.parametrize("name", algorithms.ALGORITHMS.declared())
def test_each_algorithm_class_binds_its_card_and_restates_none_of_it(name):
    from dfl.algorithms.base import DECLARED, Algorithm

    card = algorithms.ALGORITHMS.card(name)
    cls = algorithms.ALGORITHMS.get(name)  # imports the class
    assert cls.card is card  # the one place its facts are written
    for klass in cls.__mro__[:cls.__mro__.index(Algorithm)]:  # nor does a class between it and Algorithm
        assert not set(DECLARED) & set(klass.__dict__), (klass, set(DECLARED) & set(klass.__dict__))
        assert "check_hyperparameters" not in klass.__dict__ and "check_run" not in klass.__dict__
    hp = card.hyperparameters()  # the defaults pass the card's own checks
    if card.check is not None:
        card.check(hp)
    if card.run_check is not None:
        card.run_check(dfl.Config(algorithm=name))


@pytest.mark.parametrize("name", data.DATASETS.declared())
def test_each_dataset_card_equals_its_loader(name):
    card = data.DATASETS.card(name)
    loader = data.DATASETS.get(name)
    assert data.dataset.describe(name, loader) == card  # root and options (check and shape are the card's own)


@pytest.mark.parametrize("name", ["mnist1d", "digits", "synthetic"])
def test_each_embedded_dataset_shape_is_what_it_loads(name):
    options = {"num_samples": 500} if name == "mnist1d" else {"num_clients": 5} if name == "synthetic" else {}
    shape = data.data_shape(name, options)
    ds = data.load_dataset(name, **options)
    assert (shape.train, shape.test) == (len(ds.train_y), len(ds.test_y))
    assert (shape.input_shape, shape.num_classes) == (tuple(ds.input_shape), ds.num_classes)


@pytest.mark.parametrize("name", models.MODELS.declared())
def test_each_model_card_equals_its_factory(name):
    assert models.builtin.describe(name, models.MODELS.get(name)) == models.MODELS.card(name)


@pytest.mark.parametrize("name", settings.COMPRESSORS.declared())
@pytest.mark.parametrize("value", [0.1, 1, 4, 8, 16, 1.5, -1, 0, True, "x", float("nan")])
def test_each_compressor_card_checks_as_its_class(name, value):
    card, cls = settings.COMPRESSORS.card(name), settings.COMPRESSORS.get(name)
    assert cls.card is card  # the class binds its declared card

    def outcome(check):
        try:
            return check(value)
        except ValueError as exc:
            return str(exc)

    assert outcome(card.check) == outcome(cls.check)


def test_a_declared_entry_loads_on_first_get_and_a_registered_one_is_its_own_card():
    reg = Registry("widget")
    reg.declare("json", "json:dumps", card="the card")
    assert reg.names() == ("json",) and reg.card("json") == "the card"
    import json

    assert reg.get("json") is json.dumps and reg.card("json") == "the card"
    reg.register("other", len)
    assert reg.card("other") is len
    reg.register("json", repr, replace=True)  # another object under the name: the declared card is gone
    assert reg.card("json") is repr


# ------------------------------------------------------------------------------------------------ no torch
NO_TORCH = """
import sys, dfl
from dfl.engine.validation import validate
from dfl.errors import ConfigError
for changes in {changes!r}:
    try:
        validate(dfl.Config(**changes))
    except ConfigError:
        pass
print(sorted(m for m in ('torch', 'dfl.engine.runner', 'dfl.algorithms.base') if m in sys.modules))
"""


def test_validate_imports_no_torch_for_any_built_in():
    changes = [{"algorithm": name} for name in algorithms.ALGORITHMS.names()]
    changes += [{"dataset": name, "clients": 4} for name in data.DATASETS.names()]
    changes += [{"model": name} for name in models.MODELS.names()]
    changes += [{"topology": name, "clients": 8} for name in dfl.graphs.TOPOLOGIES.names()]
    changes += [{"compressor": name, "algorithm": "dfedavg"} for name in settings.COMPRESSORS.names()]
    changes += [{"mode": "async", "algorithm": "dfedavg"}, {"clients": 0}, {"algorithm": "DFedSAM"},
                {"loggers": ["tensorboard"]}, {"partition": "shards"}, {"dataset_options": {"num_samples": 10**9}}]
    proc = subprocess.run([sys.executable, "-c", NO_TORCH.format(changes=changes)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


REFUSE = """
import sys
from dfl.cli import main
status = main({argv!r})
print(status, 'torch' in sys.modules)
"""


@pytest.mark.parametrize("argv", [
    ["run", "--clients", "0"], ["run", "--algorithm", "dfedsm"], ["run", "missing.toml"],
    ["run", "--clients", "100000000000000000000"], ["run", "--dataset-options", "num_samples=1000000000"],
    ["run", "--topology", "grid", "--clients", "17"], ["topology", "ring", "--clients", "1000000000"],
    ["spectral-study", "--algorithm", "fedavg", "--dry-run"],
    ["run", "--topology", "custom", "--topology-options", "matrix=W.csv", "--clients", "2"],
    ["run", "--topology", "custom", "--topology-options", "matrix=R.csv", "--clients", "2"],
    ["run", "--topology", "custom", "--topology-options", "matrix=R.csv", "--clients", "3"],
])
def test_cli_refusals_answer_before_torch_loads(argv, tmp_path):
    (tmp_path / "W.csv").write_text("i,j\n0,1\n")  # an edge list given as a matrix file
    (tmp_path / "R.csv").write_text("0.5,0.5\n0.25,0.75\n")  # row-stochastic, not doubly
    proc = subprocess.run([sys.executable, "-c", REFUSE.format(argv=argv)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and "error:" in proc.stderr


# ------------------------------------------------------------------------------------------------ spelling
@pytest.mark.parametrize("field,value,meant", [
    ("algorithm", "DFedSAM", "dfedsam"), ("algorithm", "DFEDSAM-MGS", "dfedsam-mgs"), ("topology", "Ring", "ring"),
    ("topology", "random_regular", "random-regular"), ("dataset", "MNIST1D", "mnist1d"), ("model", "CNN1d", "cnn1d"),
    ("partition", "IID", "iid"), ("algorithm", "dfedsm", "dfedsam"), ("lr_schedule", "Cosine", "cosine"),
])
def test_a_misspelled_name_gets_the_right_spelling(field, value, meant):
    with pytest.raises(ConfigError, match=rf"did you mean '{meant}'\?"):
        dfl.validate(Config(**{field: value}))


def test_suggest_prefers_the_same_name_in_other_case():
    assert suggest("FULL", ["full", "fill"]) == "full"
    assert suggest("zzz", ["ring"]) is None
