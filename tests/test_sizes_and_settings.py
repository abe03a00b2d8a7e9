"""Every size a user can make large is checked before anything is allocated (naming the
option and the memory it would need against what is free), and every setting is given in one place (a value
given twice is refused naming both; one that does nothing for the chosen component is warned about)."""

from __future__ import annotations

import pytest
import torch

import dfl
import topologies
from dfl.cli import main
from dfl.config import Config
from dfl.errors import ConfigError, SweepError
from dfl.training import memory
from dfl.workflows.presets import compare_topologies_sweep, spectral_study_sweep
from topologies import TopologyError, limits


@pytest.fixture
def one_gib(monkeypatch):
    """This machine has 1 GiB free, as far as the size checks know."""
    monkeypatch.setattr(limits, "available_memory", lambda: 2**30)


# ------------------------------------------------------------------------------------------------ sizes
@pytest.mark.parametrize("name,n,options", [("ring", 10**12, {}), ("grid", 10**10, {}), ("exponential", 2**40, {}),
                                            ("erdos-renyi", 10**7, {"p": 0.5}), ("random-k", 10**10, {"k": 3}),
                                            ("full", 10**12, {}), ("random-regular", 10**9, {"degree": 4})])
def test_a_topology_too_large_is_refused_before_it_is_built(name, n, options):
    with pytest.raises(TopologyError, match=rf"{name} on n = [\d,]+ clients needs ~[\d.,]+ [GT]iB of memory to "
                                            r"build \([\d,]+ edges\), more than the .* available; use fewer clients"):
        topologies.build(name, n, **options)


def test_topology_size_follows_the_memory_free(one_gib):
    topologies.check("ring", 1000)
    with pytest.raises(TopologyError, match="more than the 1.0 GiB available"):
        topologies.check("ring", 10**7)


def test_a_topology_check_needs_no_construction():
    with pytest.raises(TopologyError, match="is prime"):
        topologies.check("grid", 17)
    with pytest.raises(TopologyError, match="needs option degree"):
        topologies.check("random-regular", 16)
    with pytest.raises(TopologyError, match="k must be an integer with 1 <= k <= n-1"):
        topologies.check("random-k", 8, k=8)
    with pytest.raises(TopologyError, match="fits in 64 bits"):
        topologies.check("ring", 10**20)
    assert isinstance(TopologyError("x"), ValueError)


@pytest.mark.parametrize("name,n,options,message", [
    ("exponential", 8, {"exponent_base": 1}, "exponent_base must be an integer >= 2, got 1"),
    ("star", 8, {"centre": 8}, r"centre must be a client index in 0..7, got 8"),
    ("random-pull", 8, {"k": 8}, "k must be an integer with 1 <= k <= n-1 = 7"),
    ("random-pull", 8, {"k": 2, "weights": "metropolis"}, "random-pull .* supports weights row-stochastic"),
    ("one-peer", 8, {"graph": "random-k"}, "one-peer option graph must be a static topology"),
    ("one-peer", 8, {"graph": "star", "graph_options": {"centre": 9}}, r"one-peer base graph \(star on 8 clients\): "
                                                                       "centre must be"),
    ("hierarchical", 12, {}, "hierarchical needs option groups"),
    ("hierarchical", 12, {"groups": 5}, "groups must be an integer that divides n = 12 .*one of 1, 2, 3, 4, 6, 12; "
                                        "got 5"),
    ("hierarchical", 12, {"groups": 4, "inner": "random-regular"}, r"hierarchical inner graph \(random-regular on 3 "
                                                                   r"clients\): random-regular needs option degree"),
    ("hierarchical", 12, {"groups": 4, "outer_options": 5}, "outer_options must be a table"),
    ("hierarchical", 10**9, {"groups": 7}, "divides n = 1000000000 .*one of 1, 2, 4, 5, 8, .*, ...; got 7"),
    ("hierarchical", 10**15 + 1, {"groups": 2}, r"a divisor of n; got 2"),  # too large to list (no n-step loop)
    ("hierarchical", 10**9, {"groups": 10}, r"hierarchical inner graph \(full on 100000000 clients\): full on n = "
                                            "100,000,000 clients needs"),
    ("one-peer", 10**12, {}, r"one-peer base graph \(exponential on 1,000,000,000,000 clients\): .* needs"),
    ("random-pull", 10**9, {"k": 1000}, "random-pull on n = 1,000,000,000 clients needs"),
    ("full", 10**6, {"weights": "row-stochastic"}, r"full on n = 1,000,000 clients needs .*1,000,000,000,000 edges"),
])
def test_the_newer_topologies_are_checked_before_they_are_built(one_gib, name, n, options, message):
    with pytest.raises(TopologyError, match=message):
        topologies.check(name, n, **options)
    with pytest.raises(TopologyError, match=message):  # build runs the same checks first
        topologies.build(name, n, **options)


@pytest.mark.parametrize("changes,message", [
    ({"clients": 10**9}, "ring on n = 1,000,000,000 clients needs"),
    ({"gossip_steps": 10**8}, "gossip_steps = 100,000,000: a round keeps a record of each gossip step it mixes, "
                              "~3.0 GiB, more than the 1.0 GiB available"),
    ({"clients": 5000}, "clients = 5,000 exceeds the 3,200 training samples of mnist1d .num_samples = 4,000.: every "
                        "client needs at least one; use at most 3,200 clients or raise num_samples"),
    ({"dataset_options": {"num_samples": 10**7}}, r"dataset_options: mnist1d \(num_samples = 10,000,000\) needs "
                                                  r"~3.1 GiB of memory to load .* more than the 1.0 GiB available; "
                                                  "lower num_samples"),
    ({"dataset": "synthetic", "dataset_options": {"size_log_sigma": 1000}}, "size_log_sigma = 1000 draw a client "
                                                                           "of inf samples"),
    ({"dataset": "synthetic", "dataset_options": {"num_clients": 10**8}}, r"synthetic \(num_clients = 100,000,000, "
                                                                         "min_samples = 50.* needs ~"),
    ({"dataset": "synthetic", "dataset_options": {"size_log_mean": 30.0}}, "draw a client of"),
])
def test_sizes_are_refused_naming_the_option_and_the_memory(one_gib, changes, message):
    with pytest.raises(ConfigError, match=message):
        dfl.validate(Config(**changes))


def test_the_client_stacks_are_checked_before_they_are_allocated(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**20)
    with pytest.raises(ConfigError, match=r"clients = 1,000: the run keeps 5 \[m, d\] stacks of 1,000 clients x "
                                          r"1,000 parameters, ~19.1 MiB, more than its budget of 0.5 MiB"):
        memory.check_stacks(1000, 1000, torch.device("cpu"))
    memory.check_stacks(10, 1000, torch.device("cpu"))


def test_spectral_study_dry_run_checks_the_sizes(tmp_path, capsys):
    status = main(["spectral-study", "--clients", "1000000000", "--dry-run", "--out", str(tmp_path / "s")])
    assert status == 2
    assert "1,000,000,000 clients needs" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------------------------ one place
@pytest.mark.parametrize("changes,message", [
    ({"alpha": 0.5, "partition_options": {"alpha": 0.1}}, r"partition_options.alpha = 0.1: alpha is a Config "
                                                          r"field; set it once, as alpha \(--alpha\)"),
    ({"partition_options": {"alpha": 0.1}}, "alpha is a Config field"),
    ({"partition_options": {"seed": 3}}, "seed is a Config field"),
    ({"data_root": "data", "dataset_options": {"root": "/elsewhere"}}, "dataset_options.root = '/elsewhere': a "
                                                                       "dataset's directory is the field data_root"),
    ({"partition": "iid", "alpha": 0.5}, "alpha applies only to the dirichlet partitions"),
    ({"dataset": "cifar10"}, "is read from a local directory: pass root"),
    ({"dataset": "cifar10", "data_root": "/no/such/dir"}, "data_root = '/no/such/dir' does not exist"),
    ({"partition": "similarity"}, "partition 'similarity' needs option similarity=s with s in"),
    ({"partition_options": {"sigmaa": 1}}, "unknown option.s. sigmaa for partition 'dirichlet'"),
    ({"model": "mlp", "model_options": {"width": 3}}, "model_options: unknown option.s. width for model 'mlp'"),
    ({"dataset_options": {"num_sample": 10}}, "unknown option.s. num_sample for dataset 'mnist1d'"),
])
def test_a_setting_given_twice_or_in_the_wrong_place_is_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        dfl.validate(Config(**changes))


def test_data_root_with_an_embedded_dataset_is_refused():
    config = Config(data_root="data", clients=2, rounds=1, model="logreg", dataset_options={"num_samples": 200})
    with pytest.raises(ConfigError, match="^data_root = 'data' is not read by dataset 'mnist1d' .*: cifar10, "):
        dfl.validate(config)


def test_topology_studies_refuse_centralized_algorithms():
    with pytest.raises(SweepError, match="--algorithms: fedavg is centralized .* use decentralized algorithms: dpsgd"):
        compare_topologies_sweep(algorithms=["dfedsam", "fedavg"])
    with pytest.raises(SweepError, match="--algorithm: scaffold is centralized"):
        spectral_study_sweep(algorithm="scaffold")
    with pytest.raises(SweepError, match="did you mean 'dfedsam'"):
        spectral_study_sweep(algorithm="DFedSAM")
