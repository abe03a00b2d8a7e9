"""Datasets, partitions and topologies registered in Python: usable in `dfl.run`, listed by `dfl list`, shown by
`dfl topology`, and checked (signatures at registration, results before training) with one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch

import dfl
import dfl.data
import dfl.graphs
import topologies
from dfl.cli import main
from dfl.config import Config, ConfigError
from dfl.data import DATASETS, PARTITIONS, Dataset, load_dataset, partition
from dfl.engine.setup import build_topology
from dfl.engine.validation import validate
from dfl.graphs import TOPOLOGIES
from dfl.registry import RegistryError

PLUGINS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "how-to" / "plugins.md"


def blobs(*, n=120, seed=0):
    """Three Gaussian blobs in 2-D."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    x = torch.randn(n, 2, generator=g) + 3 * torch.stack([y.float().cos(), y.float().sin()], 1)
    cut = 3 * n // 4
    return Dataset("not-its-name", x[:cut], y[:cut], x[cut:], y[cut:], num_classes=3, input_shape=(2,))


def halves(labels, num_clients, rng, *, shuffle=False):
    """Contiguous equal parts of the train set."""
    order = rng.permutation(labels.shape[0]) if shuffle else np.arange(labels.shape[0])
    return np.array_split(order, num_clients)


def lazy_ring(n, *, keep=0.5):
    """Ring keeping `keep` of one's own model."""
    shift = np.roll(np.eye(n), 1, axis=1)
    return keep * np.eye(n) + (1 - keep) / 2 * (shift + shift.T)


@pytest.fixture
def registered():
    """blobs, halves and lazy-ring registered for one test (and nothing left behind)."""
    dfl.data.register("blobs")(blobs)
    dfl.data.register_partition("halves")(halves)
    dfl.graphs.register("lazy-ring")(lazy_ring)
    added = [(DATASETS, "blobs"), (PARTITIONS, "halves"), (TOPOLOGIES, "lazy-ring")]
    yield added
    for registry, name in added:
        registry.unregister(name)


def tiny(**changes) -> Config:
    base = dict(dataset="blobs", partition="halves", topology="lazy-ring", model="logreg", algorithm="dfedavg",
                clients=4, rounds=2, eval_every=1, batch_size=8, client_chunk=0, device="cpu", progress=False)
    return Config(**{**base, **changes})


def test_registered_dataset_partition_and_topology_run(registered, tmp_path):
    result = dfl.run(tiny(topology_options={"keep": 0.6}, partition_options={"shuffle": True}), out=tmp_path / "r")
    assert result.summary["dataset"] == "blobs" and result.summary["topology"] == "lazy-ring"
    W = lazy_ring(4, keep=0.6)
    assert result.summary["lambda"] == pytest.approx(np.sort(np.abs(np.linalg.eigvalsh(W - 0.25)))[-1])
    assert len(result.history) == 2 and np.isfinite(result.history[-1]["test_acc"])
    info = json.loads((tmp_path / "r" / "partition.json").read_text())
    assert info["method"] == "halves" and info["options"]["shuffle"] is True and info["sizes"] == [23, 23, 22, 22]


def test_dfl_list_shows_registered_entries(registered, capsys):
    assert main(["list", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    entries = {c: {e["name"]: e for e in listing[c]} for c in ("datasets", "partitions", "topologies")}
    assert entries["datasets"]["blobs"] == {"name": "blobs", "description": "Three Gaussian blobs in 2-D.",
                                            "source": "embedded", "options": {"n": 120, "seed": 0}}
    assert entries["partitions"]["halves"]["options"] == {"shuffle": False}
    assert entries["topologies"]["lazy-ring"] == {"name": "lazy-ring", "description": lazy_ring.__doc__,
                                                  "kind": "registered", "options": {"keep": 0.5}}
    assert [e["name"] for e in listing["datasets"]][-1] == "blobs"  # after the built-ins
    assert main(["list", "topologies"]) == 0
    assert re.search(r"\n  lazy-ring +registered +Ring keeping `keep` of one's own model\.\n +options: keep=0\.5",
                     capsys.readouterr().out)


def test_a_loader_that_reads_data_root_is_listed_as_local(tmp_path, capsys):
    seen = []

    @dfl.data.register("rooted")
    def rooted(root, *, n=30):
        """Reads its files from root."""
        seen.append(root)
        return blobs(n=n)

    try:
        assert dfl.data.needs_root("rooted") and not dfl.data.needs_root("digits")
        with pytest.raises(ValueError, match="dataset 'rooted' is read from a local directory: pass root"):
            load_dataset("rooted")
        ds = load_dataset("rooted", str(tmp_path), n=40)
        assert seen == [str(tmp_path)] and ds.name == "rooted" and ds.train_x.shape == (30, 2)
        assert main(["list", "datasets", "--json"]) == 0
        entry = {e["name"]: e for e in json.loads(capsys.readouterr().out)["datasets"]}["rooted"]
        assert entry["source"] == "local files (data_root)" and entry["options"] == {"n": 30}
    finally:
        DATASETS.unregister("rooted")


@pytest.mark.parametrize("W, message", [
    (lambda n: np.diag([1.0, 1.0, 0.75, 1.0]),
     r"the matrix of 'bad' is not row-stochastic: row 2 sums to 0\.75 \(off by -0\.25\)"),
    (lambda n: np.tile([[0.5, 0.5, 0.0, 0.0]], (4, 1)), r"the matrix of 'bad' is not column-stochastic: column 0 sums"),
    (lambda n: np.where(np.eye(n) > 0, np.nan, 0.0), r"the matrix of 'bad' has a non-finite entry at \[0, 0\]"),
    (lambda n: np.eye(n) - 0.5 * np.eye(n)[::-1] + 0.5 * np.eye(n), r"not nonnegative: W\[0, 3\] = -0\.5"),
    (lambda n: np.eye(n), r"the matrix of 'bad' is disconnected"),
    (lambda n: np.eye(n + 1), r"the matrix of 'bad' must be \[n, n\] = \[4, 4\], got shape \[5, 5\]"),
    (lambda n: "W.npy", r"'bad' returned str; a topology factory returns a gossip matrix"),
    (lambda n: None, r"'bad' returned NoneType"),
])
def test_a_registered_matrix_is_validated_with_a_located_error(W, message):
    dfl.graphs.register("bad", W)
    try:
        with pytest.raises(ValueError, match=message):
            dfl.graphs.build("bad", 4)
    finally:
        TOPOLOGIES.unregister("bad")


def test_a_non_stochastic_topology_stops_the_run_before_training(registered, tmp_path):
    @dfl.graphs.register("leaky")
    def leaky(n):
        """A ring where client 2 loses a quarter of its mass."""
        W = lazy_ring(n)
        W[2] *= 0.75
        return W

    try:
        with pytest.raises(ConfigError, match=r"^topology: the matrix of 'leaky' is not row-stochastic: row 2 sums "
                                              r"to 0\.75 \(off by -0\.25\)$"):
            dfl.run(tiny(topology="leaky"), out=tmp_path / "r")
        assert not (tmp_path / "r" / "metrics.jsonl").exists()
    finally:
        TOPOLOGIES.unregister("leaky")


def test_a_factory_may_return_a_graph_or_a_topology():
    dfl.graphs.register("path-graph", lambda n: nx.path_graph(n))
    dfl.graphs.register("short-graph", lambda n: nx.path_graph(n - 1))
    dfl.graphs.register("built", lambda n, *, k=1: topologies.build("random-k", n, k=k))
    dfl.graphs.register("too-small", lambda n: topologies.build("ring", n - 1))
    try:
        topo = dfl.graphs.build("path-graph", 5, "max-degree")  # a graph is weighted by the scheme
        expected = topologies.build("custom", 5, "max-degree", graph=nx.path_graph(5))
        assert topo.name == "path-graph" and topo.weights == "max-degree" and np.allclose(topo.W, expected.W)
        assert dfl.graphs.build("path-graph", 5).weights == "metropolis"
        with pytest.raises(ValueError, match="the graph of 'short-graph': n = 5 does not match the 4 nodes"):
            dfl.graphs.build("short-graph", 5)
        rk = dfl.graphs.build("built", 6, k=2)  # a Topology is used as it is
        assert rk.name == "built" and rk.is_time_varying
        with pytest.raises(ValueError, match="'too-small' built a topology on 5 clients for n = 6"):
            dfl.graphs.build("too-small", 6)
        with pytest.raises(ValueError, match="weights = 'uniform' does not apply to 'built': it gives its own"):
            dfl.graphs.build("built", 6, "uniform")
    finally:
        for name in ("path-graph", "short-graph", "built", "too-small"):
            TOPOLOGIES.unregister(name)


def test_a_seed_option_gets_the_run_seed():
    seeds = []

    @dfl.graphs.register("seeded")
    def seeded(n, *, seed=0):
        """Records its seed."""
        seeds.append(seed)
        return np.full((n, n), 1.0 / n)

    try:
        build_topology(tiny(topology="seeded", seed=7), 4)
        build_topology(tiny(topology="seeded", seed=7, topology_options={"seed": 3}), 4)
        assert seeds == [7, 3]
    finally:
        TOPOLOGIES.unregister("seeded")


def test_dfl_topology_show_uses_the_registry(registered, capsys):
    assert main(["topology", "show", "lazy-ring", "--clients", "8", "--options", "keep=0.6", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    W = lazy_ring(8, keep=0.6)
    assert row["topology"] == "lazy-ring" and row["weights"] == "given"
    assert row["lambda"] == pytest.approx(np.sort(np.abs(np.linalg.eigvalsh(W - 1 / 8)))[-1])
    assert main(["topology", "lazy-ring", "--clients", "8", "--options", "bridges=2"]) == 2
    assert "unknown option(s) bridges for topology 'lazy-ring'; allowed options: keep=0.5" in capsys.readouterr().err
    assert main(["topology", "ring", "--clients", "8", "--seed", "1", "--options", "seed=2"]) == 2
    assert "option seed is given twice" in capsys.readouterr().err


@pytest.mark.parametrize("register, fn, message", [
    (dfl.data.register, lambda a, b: None, r"dataset 'x' must be a function f\(\*, option=default, \.\.\.\) -> "
                                           r"Dataset, or f\(root, .*it takes 2 positional parameter\(s\) \(a, b\)"),
    (dfl.data.register, lambda **options: None, r"dataset 'x' .*\*args / \*\*kwargs are not allowed"),
    (dfl.data.register, "mnist1d", r"dataset 'x' must be a function .*; got str 'mnist1d'"),
    (dfl.data.register_partition, lambda labels, num_clients: None,
     r"partition 'x' must be a function f\(labels, num_clients, rng, \*, .*it takes 2 positional"),
    (dfl.graphs.register, lambda n, k=2: None, r"topology 'x' must be a function f\(n, \*, option=default.*"
                                                   r"it takes 2 positional parameter\(s\) \(n, k\); options go after"),
])
def test_a_bad_signature_is_refused_at_registration(register, fn, message):
    with pytest.raises(RegistryError, match=message):
        register("x", fn)
    assert "x" not in DATASETS and "x" not in PARTITIONS and "x" not in TOPOLOGIES


def test_a_name_registered_twice_is_an_error(registered):
    with pytest.raises(RegistryError, match="dataset 'blobs' is registered twice"):
        dfl.data.register("blobs", lambda: None)
    with pytest.raises(RegistryError, match="topology 'ring' is registered twice"):
        dfl.graphs.register("ring", lazy_ring)


@pytest.mark.parametrize("field, value, message", [
    ("dataset", "blob", r"dataset must be one of mnist1d, .*fashion-mnist, blobs; got 'blob' \(did you mean 'blobs'"),
    ("partition", "halfs", r"partition must be one of iid, .*natural, halves; got 'halfs' \(did you mean 'halves'"),
    ("topology", "lazyring", r"topology must be one of ring, .*custom, lazy-ring; got 'lazyring'"),
    ("dataset", 3, r"dataset must be a string, got 3$"),
])
def test_unknown_names_list_the_registered_choices(registered, field, value, message):
    with pytest.raises(ConfigError, match=message):
        validate(tiny(**{field: value}))


def test_unknown_and_missing_options_name_the_allowed_ones(registered):
    with pytest.raises(ValueError, match=r"unknown option\(s\) size for dataset 'blobs'; allowed options: n=120, "
                                         r"seed=0"):
        load_dataset("blobs", size=3)
    with pytest.raises(ValueError, match=r"unknown option\(s\) k for topology 'lazy-ring'; allowed options: "
                                         r"keep=0\.5"):
        dfl.graphs.build("lazy-ring", 4, k=1)
    dfl.data.register_partition("needs-k", lambda labels, num_clients, rng, *, k: None)
    try:
        assert dfl.data.partition_options("needs-k") == {"k": "required"}
        with pytest.raises(ValueError, match="partition 'needs-k' needs option k"):
            partition(np.arange(8) % 2, 2, "needs-k", seed=0)
    finally:
        PARTITIONS.unregister("needs-k")


@pytest.mark.parametrize("returned, message", [
    (lambda labels, m: [np.arange(4)], r"partition 'p' must return a list of 2 index arrays .*got 1 arrays"),
    (lambda labels, m: np.arange(8), r"partition 'p' must return a list of 2 index arrays .*got ndarray"),
    (lambda labels, m: [np.arange(4), np.arange(4, 9)], r"partition 'p' gave client 1 index 8, outside .*\[0, 7\]"),
    (lambda labels, m: [np.arange(4.0), np.arange(4, 8)], r"gave client 0 indices of dtype float64 and shape \[4\]"),
    (lambda labels, m: [np.arange(8), []], r"partition 'p' leaves client\(s\) 1 with 0 samples"),
])
def test_what_a_partition_returns_is_checked(returned, message):
    dfl.data.register_partition("p", lambda labels, num_clients, rng: returned(labels, num_clients))
    try:
        with pytest.raises(ValueError, match=message):
            partition(np.arange(8) % 2, 2, "p", seed=0)
    finally:
        PARTITIONS.unregister("p")


def test_what_a_loader_returns_is_checked(registered):
    assert load_dataset("blobs").name == "blobs"  # the registered name, whatever the loader called it
    dfl.data.register("dict-loader", lambda: {"x": 1})
    try:
        with pytest.raises(ValueError, match=r"dataset 'dict-loader': its loader .* returned dict, not a "
                                             r"dfl\.data\.Dataset"):
            load_dataset("dict-loader")
    finally:
        DATASETS.unregister("dict-loader")


def test_entry_point_plugins_are_checked_when_used(monkeypatch):
    from importlib import metadata

    class EP:
        def __init__(self, name, obj):
            self.name, self.value, self.obj = name, f"pkg:{name}", obj
            self.dist = type("D", (), {"name": "plugin-dist"})()

        def load(self):
            return self.obj

    monkeypatch.setattr(metadata, "entry_points",
                        lambda group: [EP("ep-blobs", blobs), EP("ep-bad", lambda a, b: None)]
                        if group == "dfl.datasets" else [])
    monkeypatch.setattr(DATASETS, "_plugins_loaded", False)
    try:
        validate(tiny(dataset="ep-blobs", partition="iid", topology="ring"))
        assert load_dataset("ep-blobs").name == "ep-blobs"
        with pytest.raises(RegistryError, match=r"dataset 'ep-bad' must be a function .*it takes 2 positional"):
            load_dataset("ep-bad")
    finally:
        DATASETS.unregister("ep-blobs")
        DATASETS.unregister("ep-bad")


def test_the_docs_plugin_example_runs():
    section = PLUGINS_PAGE.read_text()
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    try:
        exec(compile(code, "plugins.md", "exec"), namespace)  # noqa: S102 (the docs' own example)
        assert namespace["result"].summary["topology"] == "lazy-ring"
        assert namespace["result"].history[-1]["test_acc"] > 0.9
    finally:
        DATASETS.unregister("blobs")
        TOPOLOGIES.unregister("lazy-ring")


def test_a_registered_topology_declares_its_options_spec(capsys):
    from dataclasses import dataclass

    from dfl.specs import Spec, param

    @dataclass(frozen=True)
    class KeepOptions(Spec):
        keep: float = param(0.5, "the weight each client keeps", interval="(0, 1)")

    def kept_ring(n, *, keep=0.5):
        """A ring whose clients keep `keep` of their own model."""
        return keep * np.eye(n) + (1 - keep) * (np.roll(np.eye(n), 1, axis=1) + np.roll(np.eye(n), -1, axis=1)) / 2

    dfl.graphs.register("kept-ring", kept_ring, options=KeepOptions)
    try:
        with pytest.raises(ConfigError, match=r"^topology_options.keep must be in \(0, 1\), got 1.5$"):
            dfl.validate(Config(clients=8, topology="kept-ring", topology_options={"keep": 1.5}))
        dfl.validate(Config(clients=8, topology="kept-ring", topology_options={"keep": 0.7}))
        assert main(["list", "topologies", "--json"]) == 0
        (entry,) = [e for e in json.loads(capsys.readouterr().out)["topologies"] if e["name"] == "kept-ring"]
        assert entry["specs"]["keep"]["allowed"] == "in (0, 1)"
    finally:
        TOPOLOGIES.unregister("kept-ring")

    @dataclass(frozen=True)
    class WrongDefault(Spec):
        keep: float = param(0.3, "the weight each client keeps")

    with pytest.raises(ValueError, match=r"topology 'kept-ring': its options spec \{'keep': 0.3\} is not its "
                                         r"signature's \{'keep': 0.5\}"):
        dfl.graphs.register("kept-ring", kept_ring, options=WrongDefault)
    assert "kept-ring" not in TOPOLOGIES
