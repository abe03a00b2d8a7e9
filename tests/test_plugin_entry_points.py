"""Plug-ins loaded through entry points say what a registration in code says: their checks, options spec and card.

A fake installed distribution is written under tmp_path (a `.dist-info` directory with `entry_points.txt`, put on
sys.path), so `importlib.metadata` finds it exactly as it finds a `pip install`ed package.
"""

from __future__ import annotations

import copy
import sys
import textwrap

import pytest

import dfl
from dfl.algorithms import ALGORITHMS
from dfl.data import DATASETS
from dfl.data.dataset import dataset_specs
from dfl.data.partitioners import PARTITIONS, partition_specs
from dfl.errors import RegistryError
from dfl.graphs import TOPOLOGIES
from dfl.models import MODELS
from dfl.network.byzantine_settings import AGGREGATORS, ATTACKS
from dfl.network.settings import COMPRESSORS

PACKAGE = "dfl_fakeplug"

PLUGIN = '''
from dataclasses import dataclass

import numpy as np

import dfl.models
from dfl.specs import Spec, param


@dataclass(frozen=True)
class WideOptions(Spec):
    """The options of model fp-wide."""

    width: int = param(8, "the hidden layer's width", interval="[1, 64]")


def wide(input_shape, num_classes, *, width=8):
    import torch

    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(input_shape)), width),
                               torch.nn.ReLU(), torch.nn.Linear(width, num_classes))


wide.options = WideOptions  # what an entry point's object declares: its options spec


@dataclass(frozen=True)
class DeepOptions(Spec):
    """The options of model fp-self."""

    depth: int = param(1, "hidden layers", interval="[1, 4]")


def deep(input_shape, num_classes, *, depth=1):
    return wide(input_shape, num_classes, width=4)


# a module that registers itself when imported: its entry point only names the module
dfl.models.register("fp-self", deep, options=DeepOptions)


def mismatched(input_shape, num_classes, *, width=3):
    return wide(input_shape, num_classes, width=width)


mismatched.options = WideOptions  # default 8, signature 3: refused, named when the model is asked for


def not_a_factory(a, b, c, d):
    return None


@dataclass(frozen=True)
class BlobOptions(Spec):
    """The options of dataset fp-blobs."""

    n: int = param(60, "samples", interval="[10, 1000]")


def blobs(*, n=60):
    from dfl.data import Dataset
    import torch

    x = torch.randn(n, 2)
    y = torch.arange(n) % 2
    return Dataset("fp-blobs", x[: n // 2], y[: n // 2], x[n // 2:], y[n // 2:], num_classes=2, input_shape=(2,))


blobs.options = BlobOptions


@dataclass(frozen=True)
class HalvesOptions(Spec):
    """The options of partition fp-halves."""

    shuffle: bool = param(False, "shuffle the indices first", choices=(False, True))


def halves(labels, num_clients, rng, *, shuffle=False):
    order = rng.permutation(len(labels)) if shuffle else np.arange(len(labels))
    return np.array_split(order, num_clients)


halves.options = HalvesOptions


def lazy_ring(n, *, keep=0.5):
    shift = np.roll(np.eye(n), 1, axis=1)
    return keep * np.eye(n) + (1 - keep) / 2 * (shift + shift.T)


def bad_topology(n, m):
    return np.eye(n)


@dataclass(frozen=True)
class LevelsOptions(Spec):
    compression: int = param(3, "the levels kept", interval="[1, 10]")


def levels():  # a class of dfl.network.compression (torch) made on import of this entry point's module
    from dfl.network.compression import Compressor
    from dfl.network.settings import CompressorCard

    class Levels(Compressor):
        card = CompressorCard("fp-levels", LevelsOptions, unbiased=True, omega="1/2", sends="d bytes")

        def __call__(self, D, U=None):
            return D

        def message_bytes(self, d, itemsize):
            return d

        def omega(self, d):
            return 0.5

    return Levels


Levels = levels()
'''

ENTRY_POINTS = f"""
[dfl.models]
fp-wide = {PACKAGE}.plugin:wide
fp-self = {PACKAGE}.plugin
fp-mismatched = {PACKAGE}.plugin:mismatched
fp-not-a-factory = {PACKAGE}.plugin:not_a_factory

[dfl.datasets]
fp-blobs = {PACKAGE}.plugin:blobs

[dfl.partitions]
fp-halves = {PACKAGE}.plugin:halves

[dfl.topologies]
fp-lazy-ring = {PACKAGE}.plugin:lazy_ring
fp-bad-topology = {PACKAGE}.plugin:bad_topology

[dfl.compressors]
fp-levels = {PACKAGE}.plugin:Levels
"""

REGISTRIES = (MODELS, DATASETS, PARTITIONS, TOPOLOGIES, COMPRESSORS)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The fake distribution on sys.path, and each registry set to load its entry points again."""
    site = tmp_path / "site"
    (site / PACKAGE).mkdir(parents=True)
    (site / PACKAGE / "__init__.py").write_text("")
    (site / PACKAGE / "plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = site / f"{PACKAGE}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(site))
    for registry in REGISTRIES:
        monkeypatch.setattr(registry, "_plugins_loaded", False)
    yield site
    for registry in REGISTRIES:
        for name in list(registry._table):
            if name.startswith("fp-"):
                registry.unregister(name)
        for name in list(registry._plugin_errors):
            if name.startswith("fp-"):
                registry._plugin_errors.pop(name)
    sys.modules.pop(f"{PACKAGE}.plugin", None)
    sys.modules.pop(PACKAGE, None)


def test_a_model_entry_point_declares_its_options_spec(installed):
    assert {"fp-wide", "fp-self"} <= set(MODELS.names())
    card = MODELS.card("fp-wide")
    assert card.options == {"width": 8} and card.spec is not None and card.spec.__name__ == "WideOptions"
    assert MODELS.source("fp-wide") == f"{PACKAGE} (entry point {PACKAGE}.plugin:wide)"
    base = dict(dataset="mnist1d", clients=4, rounds=1, progress=False)
    dfl.validate(dfl.Config(**base, model="fp-wide", model_options={"width": 16}))
    with pytest.raises(ValueError, match=r"model_options\.width"):
        dfl.validate(dfl.Config(**base, model="fp-wide", model_options={"width": 100}))


def test_a_module_that_registers_itself_is_loaded_by_its_entry_point(installed):
    assert MODELS.card("fp-self").spec.__name__ == "DeepOptions"
    base = dict(dataset="mnist1d", clients=4, rounds=1, progress=False)
    with pytest.raises(ValueError, match=r"model_options\.depth"):
        dfl.validate(dfl.Config(**base, model="fp-self", model_options={"depth": 9}))


def test_an_entry_point_the_kind_refuses_is_named_when_asked_for(installed):
    assert "fp-mismatched" not in MODELS.names() and "fp-not-a-factory" not in MODELS.names()
    with pytest.raises(RegistryError, match=r"model 'fp-mismatched' from dfl_fakeplug .*could not be loaded: "
                                            r"ModelError: model 'fp-mismatched': .*spec"):
        MODELS.get("fp-mismatched")
    with pytest.raises(RegistryError, match=r"'fp-not-a-factory' .*could not be loaded"):
        MODELS.get("fp-not-a-factory")
    with pytest.raises(RegistryError, match=r"topology 'fp-bad-topology' .*could not be loaded"):
        TOPOLOGIES.get("fp-bad-topology")


def test_dataset_and_partition_entry_points_declare_their_specs(installed):
    assert [p.name for p in dataset_specs("fp-blobs")] == ["n"]
    assert [p.name for p in partition_specs("fp-halves")] == ["shuffle"]
    base = dict(model="logreg", clients=4, rounds=1, progress=False, topology="ring")
    with pytest.raises(ValueError, match=r"dataset_options\.n"):
        dfl.validate(dfl.Config(**base, dataset="fp-blobs", partition="iid", dataset_options={"n": 5}))
    with pytest.raises(ValueError, match=r"partition_options\.shuffle"):
        dfl.validate(dfl.Config(**base, partition="fp-halves", partition_options={"shuffle": "yes"}))


def test_entry_point_plugins_run(installed, tmp_path):
    config = dfl.Config(dataset="fp-blobs", dataset_options={"n": 80}, partition="fp-halves", model="fp-wide",
                        model_options={"width": 4}, topology="fp-lazy-ring", topology_options={"keep": 0.6},
                        algorithm="dfedavg", clients=4, rounds=1, progress=False)
    result = dfl.run(config, out=tmp_path / "run")
    assert result.summary["topology"] == "fp-lazy-ring" and result.history


def test_a_compressor_entry_point_carries_its_card(installed):
    card = COMPRESSORS.card("fp-levels")
    assert card.name == "fp-levels" and card.unbiased
    base = dict(clients=8, algorithm="dfedavg", compressor="fp-levels")
    dfl.validate(dfl.Config(**base, compression=4))
    with pytest.raises(ValueError, match=r"compression must be the levels kept, an integer in \[1, 10\], for "
                                         r"compressor = fp-levels; got 11"):
        dfl.validate(dfl.Config(**base, compression=11))


@pytest.mark.parametrize("registry", [ALGORITHMS, ATTACKS, AGGREGATORS])
def test_class_plugins_carry_their_card(registry, monkeypatch):
    """Algorithms, attacks and aggregators are classes whose `card` attribute is the card: an entry point's class is
    read the same way (the registry's `describe`)."""
    builtin = registry.get(registry.declared()[0])

    class Plugin(builtin):  # type: ignore[misc, valid-type]
        name = "fp-class"
        card = copy.copy(builtin.card)  # its own card (a built-in's very card would name the built-in)

    from importlib import metadata

    class EP:
        name, value, dist = "fp-class", "pkg:Plugin", type("D", (), {"name": "plugin-dist"})()

        def load(self):
            return Plugin

    monkeypatch.setattr(metadata, "entry_points", lambda group: [EP()] if group == registry.group else [])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        assert registry.card("fp-class") is Plugin.card
        assert registry.source("fp-class") == "plugin-dist (entry point pkg:Plugin)"
    finally:
        registry.unregister("fp-class")


@pytest.mark.parametrize("registry, card_class", [(ATTACKS, "AttackCard"), (AGGREGATORS, "AggregatorCard")])
def test_a_class_without_its_card_is_refused_in_one_line(registry, card_class, monkeypatch):
    """An attack or aggregator class that binds no card is refused when registered (in code), and named when asked
    for (entry point): never an AttributeError from validation."""
    class NoCard:
        pass

    with pytest.raises(RegistryError, match=rf"must be a class with `card = {card_class}\(...\)`"):
        registry.register("fp-nocard", NoCard)
    from importlib import metadata

    class EP:
        name, value, dist = "fp-nocard", "pkg:NoCard", type("D", (), {"name": "plugin-dist"})()

        def load(self):
            return NoCard

    monkeypatch.setattr(metadata, "entry_points", lambda group: [EP()] if group == registry.group else [])
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.setattr(registry, "_plugin_errors", {})
    field = registry.kind
    with pytest.raises(ValueError, match=rf"{field} 'fp-nocard' from plugin-dist .*could not be loaded: "
                                         rf"RegistryError: .*{card_class}"):
        dfl.validate(dfl.Config(clients=8, byzantine=1, **{"attack": "sign-flip", field: "fp-nocard"}))
    assert "fp-nocard" not in registry.names()
