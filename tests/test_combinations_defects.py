"""Combinations of features that were refused, crashed or reported wrong numbers (issue 45), each pinned here.

Gradient trackers with compressed gossip (refused, torch-free); a caller's own data judged by the config's dataset;
random-k with one-sided weights; hierarchical with sample-count weights; a resumed run's network metrics with a robust
aggregator; the momentum summary.json records with Adam; `dfl list`'s required options; the server's fields on a
decentralized algorithm; BRIDGE-T's trimmed mean (the neighbours' values only, the receiver's own kept) against numpy.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import dfl
import topologies
from dfl import algorithms
from dfl.config import Config
from dfl.data import FederatedData, partition_options
from dfl.errors import ConfigError
from dfl.network import robust
from dfl.network import settings as network_settings
from tests.helpers import (
    ROOT,
    assert_same_history,
    assert_world_of_two_gives_the_single_process_result,
    interrupted,
    tiny_config,
)

CPU = torch.device("cpu")
TRACKERS = ("dsgt", "dsgt-sam", "kgt", "kgt-sam")
RUN = dict(dataset="digits", model="logreg", local_steps=2, batch_size=16, progress=False, threads=1)


def own_data(clients: int, per_client: int = 2, features: int = 5, classes: int = 3, seed: int = 0) -> FederatedData:
    """The caller's own data: `clients` clients of `per_client` Gaussian rows, random labels (numpy arrays)."""
    rng = np.random.default_rng(seed)
    train = [(rng.normal(size=(per_client, features)).astype("float32"), rng.integers(0, classes, per_client))
             for _ in range(clients)]
    test = (rng.normal(size=(10, features)).astype("float32"), rng.integers(0, classes, 10))
    return FederatedData.from_arrays(train, test, num_classes=classes)


# ------------------------------------------------------------------------------- gradient trackers and CHOCO
@pytest.mark.parametrize("compressor", network_settings.COMPRESSORS.names())
@pytest.mark.parametrize("algorithm", TRACKERS)
def test_a_gradient_tracker_refuses_compressed_gossip_naming_both(algorithm, compressor):
    with pytest.raises(ConfigError, match=rf"compressor = {compressor} does not apply to {algorithm}: it gossips a "
                                          r"tracker.*"
                                          r"BEER.*use compressor = none, or one of dpsgd, dfedavg"):
        dfl.validate(Config(algorithm=algorithm, compressor=compressor))


def test_the_compressible_algorithms_are_read_from_the_cards():
    assert algorithms.able("compression") == ["dpsgd", "dfedavg", "dfedavgm", "dfedsam", "dfedsam-mgs"]
    assert not any(name in algorithms.able("compression") for name in (*TRACKERS, "fedavg"))
    dfl.validate(Config(algorithm="dfedavg", compressor="top-k"))  # a model-only gossip still takes one


NO_TORCH = """
import sys, dfl
from dfl.errors import ConfigError
for algorithm in {trackers!r}:
    try:
        dfl.validate(dfl.Config(algorithm=algorithm, compressor="qsgd"))
    except ConfigError:
        pass
    else:
        raise SystemExit("accepted " + algorithm)
print('torch' in sys.modules)
"""


def test_the_tracker_refusal_comes_before_torch_loads():
    proc = subprocess.run([sys.executable, "-c", NO_TORCH.format(trackers=TRACKERS)], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


# ------------------------------------------------------------------------------------- the caller's own data
@pytest.mark.parametrize("changes, clients", [
    (dict(topology="ring"), 5000),  # more clients than mnist1d's 3,200 training samples
    (dict(dataset_options={"num_samples": 100}), 100),  # mnist1d with 100 samples has 80 for training
    (dict(partition="natural"), 4),  # mnist1d has no natural split
    (dict(dataset="cifar10"), 4),  # read from a directory: data_root unset
])
def test_own_data_is_judged_on_itself_not_on_the_configs_dataset(changes, clients):
    config = Config(clients=clients, rounds=1, algorithm="dfedavg", model="logreg", local_steps=1, progress=False,
                    threads=1, **changes)
    with pytest.raises(ConfigError):  # the config alone loads its own dataset, which cannot serve it
        dfl.validate(config)
    data = own_data(clients)
    assert dfl.validate(config, data) is config
    result = dfl.run(config, data=data)
    assert result.summary["status"] == "completed" and result.summary["dataset"] == "arrays"
    assert np.isfinite(result.history[-1]["test_loss"])


def test_an_own_model_replaces_the_configs_model_unchecked():
    config = Config(clients=4, rounds=1, model="no_such_package.models:factory", progress=False, threads=1)
    with pytest.raises(ConfigError, match="no_such_package"):  # the config alone would import it
        dfl.validate(config)
    result = dfl.run(config, data=own_data(4), model=torch.nn.Linear(5, 3))
    assert result.summary["status"] == "completed" and "Linear (instance)" in result.summary["model"]


def test_own_data_still_needs_the_configs_client_count():
    with pytest.raises(ConfigError, match="clients = 5 but the given data has 4 clients"):
        dfl.run(Config(clients=5, rounds=1, model="logreg", progress=False), data=own_data(4))


# ---------------------------------------------------------------------------------- random-k, one-sided weights
def _steps_product(topo, steps: int) -> np.ndarray:
    P = np.eye(topo.n)
    for s in range(steps):
        P = topo.matrix(s) @ P
    return P


def test_random_k_row_stochastic_steps_reach_consensus_on_a_weighted_average():
    topo = topologies.build("random-k", 10, "row-stochastic", k=1, seed=3)
    assert topo.stochastic == "row" and not topo.symmetric
    for s in range(5):  # each undirected step graph, a client averaging what it receives and its own
        W = topo.matrix(s)
        np.testing.assert_allclose(W.sum(axis=1), 1.0)
        assert (np.diag(W) > 0).all() and (W >= 0).all()
    P = _steps_product(topo, 80)
    np.testing.assert_allclose(P, np.tile(P[0], (10, 1)), atol=1e-8)  # rank one: every client holds pi^T x
    np.testing.assert_allclose(P[0].sum(), 1.0)


def test_random_k_column_stochastic_steps_average_exactly_by_push_sum():
    topo = topologies.build("random-k", 10, "column-stochastic", k=1, seed=3)
    assert topo.stochastic == "column"
    x = np.random.default_rng(0).normal(size=10)
    P = _steps_product(topo, 80)
    np.testing.assert_allclose(P.sum(axis=0), 1.0)  # the sum is kept at every step ...
    np.testing.assert_allclose((P @ x) / (P @ np.ones(10)), x.mean(), atol=1e-8)  # ... so x/w is the average


@pytest.mark.parametrize("weights, algorithm", [("row-stochastic", "dfedavg"), ("sample-count", "dfedavg"),
                                                ("column-stochastic", "dfedavg"), ("column-stochastic", "dfedsam-mgs")])
def test_random_k_runs_with_one_sided_weights(weights, algorithm):
    config = tiny_config(topology="random-k", topology_options={"k": 2}, weights=weights, algorithm=algorithm,
                         rounds=2)
    result = dfl.run(config, data=own_data(6, per_client=6))
    assert result.summary["status"] == "completed" and result.summary["weights"] == weights
    assert np.isfinite(result.history[-1]["consensus_distance"])


def test_random_k_column_stochastic_still_needs_push_sum():
    with pytest.raises(ConfigError, match="column-stochastic.*'dsgt' does not mix by push-sum"):
        dfl.validate(Config(topology="random-k", topology_options={"k": 2}, weights="column-stochastic",
                            algorithm="dsgt"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_one_sided_random_k_and_hierarchical_sample_count_give_the_single_process_result_in_a_world_of_two(tmp_path):
    random_k = {"topology": "random-k", "topology_options": {"k": 2}}
    assert_world_of_two_gives_the_single_process_result(tmp_path, {
        "row": dict(algorithm="dfedavg", weights="row-stochastic", **random_k),
        "push-sum": dict(algorithm="dfedsam-mgs", weights="column-stochastic", **random_k),
        "hierarchical": dict(algorithm="dfedavg", weights="sample-count", topology="hierarchical",
                             topology_options={"groups": 2})})


# ------------------------------------------------------------------------------- hierarchical, sample counts
def test_hierarchical_sample_count_weighs_the_hierarchys_graph():
    sizes = np.arange(1.0, 9.0)
    topo = topologies.build("hierarchical", 8, "sample-count", groups=2, inner="ring", sizes=sizes)
    metropolis = topologies.build("hierarchical", 8, groups=2, inner="ring")
    W, support = topo.matrix(0), metropolis.matrix(0) > 0
    np.testing.assert_array_equal(W > 0, support)  # the same graph: W_out ⊗ W_in's support
    expected = np.where(support, sizes[None, :], 0.0)
    np.testing.assert_allclose(W, expected / expected.sum(axis=1, keepdims=True))  # w_ij = s_j / Σ_{l ∈ N̄_i} s_l
    assert topo.stochastic == "row" and list(topo.groups) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_hierarchical_sample_count_runs_on_the_partitions_sizes():
    config = Config(**RUN, clients=8, rounds=1, topology="hierarchical", topology_options={"groups": 4},
                    weights="sample-count", algorithm="dfedavg")
    result = dfl.run(config)
    assert result.summary["status"] == "completed" and result.summary["weights"] == "sample-count"


def test_hierarchical_sizes_without_sample_count_name_the_option():
    with pytest.raises(ValueError, match="option sizes .* applies to weights='sample-count' only, not to 'metropolis'"):
        topologies.build("hierarchical", 8, "metropolis", groups=2, sizes=[1] * 8)


# ----------------------------------------------------------------------------- resume with a robust aggregator
@pytest.mark.parametrize("faults", [dict(offline=0.2), dict(link_failure=0.3, topology="exponential",
                                                            topology_options={"symmetric": True})])
def test_a_resumed_robust_run_reports_the_network_metrics_of_its_own_rounds(tmp_path, faults):
    config = Config(**{**RUN, "clients": 8, "rounds": 3, "eval_every": 1, "aggregator": "trimmed-mean",
                       "algorithm": "dfedavg", "topology": "ring", **faults})
    straight = dfl.run(config, out=tmp_path / "straight").history
    assert "links_up" in straight[-1] and "spectral_gap_realised" in straight[-1]
    assert_same_history(interrupted(config, 1, tmp_path / "resumed", None).history, straight)


# ------------------------------------------------------------------------------------ momentum with Adam
@pytest.mark.parametrize("optimizer, momentum", [("adam", 0.0), ("adamw", 0.0), ("sgd", 0.9)])
def test_summary_records_the_momentum_that_applies(optimizer, momentum):
    result = dfl.run(Config(**RUN, clients=4, rounds=1, algorithm="dfedsam", local_optimizer=optimizer))
    assert result.summary["hyperparameters"]["momentum"] == momentum


# ---------------------------------------------------------------------------------------------- dfl list
def _listing(capsys, category: str) -> dict[str, dict]:
    from dfl.cli import main

    assert main(["list", category, "--json"]) == 0
    return {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)[category]}


def test_dfl_list_requires_only_what_a_run_needs_from_the_user(capsys):
    weights = _listing(capsys, "weights")
    assert weights["sample-count"]["options"] == {"sizes": None}  # a run passes its partition's sample counts
    assert "partition" in weights["sample-count"]["specs"]["sizes"]["help"]  # its spec says who fills it in
    assert weights["lazy"]["options"] == {"base": "metropolis"}
    partitions = _listing(capsys, "partitions")
    assert partitions["natural"]["options"] == {} == partition_options("natural")  # the dataset gives the split
    assert partitions["similarity"]["options"] == {"similarity": "required"}
    assert not any("required" in str(entry["options"]) for entry in weights.values())
    dfl.run(Config(**RUN, clients=4, rounds=1, algorithm="dfedavg", weights="sample-count"))  # nothing required
    with pytest.raises(ConfigError, match="partition 'natural' takes the split from the dataset"):
        dfl.validate(Config(dataset="synthetic", partition="natural", partition_options={"split": [[0]]}))
    with pytest.raises(ConfigError, match="unknown option"):
        dfl.validate(Config(dataset="synthetic", partition="natural", partition_options={"typo": 1}))


# ---------------------------------------------------------------------- the server's fields, decentralized
@pytest.mark.parametrize("field, value, default", [("participation", 0.5, "1.0"), ("aggregation", "size", "uniform"),
                                                   ("participation_mode", "bernoulli", "uniform")])
def test_server_fields_on_a_decentralized_algorithm_are_refused_alike(field, value, default):
    registry = algorithms.ALGORITHMS
    takers = [name for name in registry.names() if registry.card(name).reads(field)]
    assert {"fedavg", "fedsam", "scaffold"} <= set(takers) and "dfedavg" not in takers
    with pytest.raises(ConfigError, match=rf"^{field} = {value} applies only to the centralized algorithms that take "
                                          rf"it \({re.escape(', '.join(takers))}\); the decentralized 'dfedavg' .*use "
                                          rf"{default} or unset"):
        dfl.validate(Config(algorithm="dfedavg", **{field: value}))
    dfl.validate(Config(algorithm="fedavg", **{field: value}))


# ------------------------------------------------------------------------------------------------ BRIDGE-T
def reference_bridge(M: np.ndarray, W: np.ndarray, b: int) -> np.ndarray:
    """BRIDGE-T per receiver in float64 numpy: trim b of each end of the neighbours' values, average with its own."""
    out = np.empty_like(M, dtype=np.float64)
    for i in range(len(W)):
        neighbours = [j for j in range(len(W)) if j != i and W[i, j] > 0]
        values = np.sort(M[neighbours].astype(np.float64), axis=0)
        n = len(neighbours)
        bi = min(b, n // 2)
        kept = values[bi:n - bi]
        out[i] = (M[i] + kept.sum(axis=0)) / (len(kept) + 1)
    return out


IRREGULAR = [("grid", 12, {}), ("star", 7, {}), ("erdos-renyi", 10, {"p": 0.4, "seed": 1}),
             ("random-regular", 10, {"degree": 4, "seed": 2}), ("ring", 9, {})]


@pytest.mark.parametrize("name, n, options", IRREGULAR)
@pytest.mark.parametrize("b", [0, 1, 2, 3])
def test_bridge_trimmed_mean_matches_numpy(name, n, options, b):
    W = topologies.build(name, n, **options).matrix(0)
    M = torch.randn(n, 6, generator=torch.Generator().manual_seed(b), dtype=torch.float64)
    hood = robust.Neighbourhoods.of(W, torch.float64, CPU)
    for rows in (1, 4, n):  # row blocks change nothing
        out = robust.robust_step(M, hood, "bridge-trimmed-mean", b, rows)
        np.testing.assert_allclose(out.numpy(), reference_bridge(M.numpy(), W, b), rtol=1e-12, atol=1e-12)


def test_bridge_keeps_the_receivers_own_value_where_the_closed_trim_drops_it():
    W = topologies.build("full", 5).matrix(0)  # every receiver: itself and 4 neighbours
    M = torch.tensor([[10.0], [1.0], [2.0], [3.0], [4.0]], dtype=torch.float64)
    hood = robust.Neighbourhoods.of(W, torch.float64, CPU)
    bridge = robust.robust_step(M, hood, "bridge-trimmed-mean", 1, 5)
    closed = robust.robust_step(M, hood, "trimmed-mean", 1, 5)
    assert bridge[0, 0] == pytest.approx((10 + 2 + 3) / 3)  # neighbours 1..4 trimmed to 2, 3; its own 10 kept
    assert closed[0, 0] == pytest.approx((2 + 3 + 4) / 3)  # over {10, 1, 2, 3, 4}: its own 10 trimmed away
    isolated = robust.Neighbourhoods.of(np.eye(3), torch.float64, CPU)
    assert torch.equal(robust.robust_step(M[:3], isolated, "bridge-trimmed-mean", 1, 3), M[:3])


def test_bridge_trimmed_mean_defends_a_run_and_keeps_the_rules_refusals():
    base = dict(RUN, topology="full", clients=12, rounds=4, eval_every=4, algorithm="dfedavg")
    clean = dfl.run(Config(**base)).history[-1]["test_acc"]
    attacked = dict(base, byzantine=2, attack="ipm", attack_scale=10.0)
    broken = dfl.run(Config(**attacked)).history[-1]["test_acc"]
    defended = dfl.run(Config(**attacked, aggregator="bridge-trimmed-mean")).history[-1]["test_acc"]
    assert defended > broken + 0.2 and defended > clean - 0.15
    with pytest.raises(ConfigError, match="aggregator = bridge-trimmed-mean is not a rule of the centralized"):
        dfl.validate(Config(algorithm="fedavg", aggregator="bridge-trimmed-mean"))
    with pytest.raises(ConfigError, match="trim = 1 applies to aggregator = clipped-gossip, trimmed-mean, "
                       "bridge-trimmed-mean or krum"):
        dfl.validate(Config(algorithm="dfedavg", aggregator="median", trim=1))
    with pytest.raises(ConfigError, match="compressor = top-k is not modelled with aggregator = bridge-trimmed-mean"):
        dfl.validate(Config(algorithm="dfedavg", aggregator="bridge-trimmed-mean", compressor="top-k"))
    dfl.validate(Config(algorithm="dfedavg", aggregator="bridge-trimmed-mean", trim=1))
