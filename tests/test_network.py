"""Unreliable networks (dfl.network.faults): link failures, offline clients and stragglers are seeded pure functions of
(seed, step / round); realised matrices stay symmetric and doubly stochastic; gossip over them is exact; runs with
faults are reproducible, resumable and world-size invariant; bad combinations fail before training."""

from __future__ import annotations

import math
from functools import partial

import networkx as nx
import numpy as np
import pytest
import torch

import dfl
import topologies
from dfl.config import ConfigError
from dfl.engine.validation import validate
from dfl.network import gossip as gossip_module
from dfl.network import run_network
from dfl.network.comm import LocalCommunicator
from dfl.network.faults import LinkFaults, RealisedTopology, Stragglers, realised_gap
from dfl.network.gossip import Gossip
from dfl.network.run_network import Network
from dfl.training.local import LocalTrainer
from tests.helpers import assert_same_history, assert_world_size_invariant, blob_data, interrupted, tiny_config
from topologies.weights import drop_links

pytestmark = pytest.mark.timeout(300)  # hang guard only (spawned process groups)

CLIENTS = 6
make_data = partial(blob_data, sizes=(6, 7, 8, 6, 7, 8), shift=1.0)  # sizes 6..8: batch 4 gives 2 steps per epoch
make_config = partial(tiny_config, local_steps=3, algorithm="dfedsam-mgs", gossip_steps=2, topology="ring")


def realised(name: str, n: int, p: float = 0.3, q: float = 0.2, seed: int = 0, weights: str | None = None,
             **options) -> RealisedTopology:
    topology = topologies.build(name, n, weights=weights, **options)
    scheme = weights or "metropolis"
    return RealisedTopology(topology, LinkFaults(seed, p, q), scheme, options.get("base") if scheme == "lazy" else None)


FAULTY = dict(link_failure=0.3, offline=0.2, stragglers=0.4, straggler_slowdown=2.0, round_deadline=2.0)
BURSTY = dict(FAULTY, link_failure_burst=3.0, offline_burst=2.0)


# ---------------------------------------------------------------------------------------- realised matrices
@pytest.mark.parametrize("name,weights,options", [
    ("ring", None, {}), ("grid", "max-degree", {}), ("random-regular", "lazy", {"degree": 4}),
    ("exponential", None, {"symmetric": True}), ("random-k", None, {"k": 2}), ("full", None, {}),
    ("star", "lazy", {"base": "max-degree"}),
])
def test_realised_matrices_are_symmetric_doubly_stochastic_on_the_surviving_links(name, weights, options):
    net = realised(name, 12, p=0.35, q=0.25, weights=weights, **options)
    for step in range(20):
        W = net.sparse(step).toarray()
        base = net.topology.matrix(step)
        assert np.all(W >= 0) and np.array_equal(W, W.T)
        np.testing.assert_allclose(W.sum(axis=0), 1, atol=1e-12)
        np.testing.assert_allclose(W.sum(axis=1), 1, atol=1e-12)
        on = net.faults.online(step, np.arange(12))
        off_diag = ~np.eye(12, dtype=bool)
        assert not np.any((W != 0) & off_diag & (base == 0)), "a link that the topology does not have"
        for i in np.flatnonzero(~on):  # offline: no send, no receive
            assert W[i, i] == 1 and np.count_nonzero(W[i]) == 1 and np.count_nonzero(W[:, i]) == 1
        # an independent dense reference: the scheme of the surviving networkx graph
        G = nx.Graph()
        G.add_nodes_from(range(12))
        for i, j in zip(*np.nonzero(np.triu(base, 1))):
            if on[i] and on[j] and net.faults.link_up(step, np.array([i]), np.array([j]))[0]:
                G.add_edge(int(i), int(j))
        scheme = weights or "metropolis"
        reference = topologies.weights.weight_matrix(G, scheme, options.get("base"))
        np.testing.assert_allclose(W, reference, atol=1e-15)


def test_link_failures_and_offline_clients_happen_at_their_rates():
    # 1000-client ring, 40 steps: 40,000 link-steps and 40,000 client-steps; 5 standard deviations of a
    # binomial, deterministic for this seed
    n, steps, p, q = 1000, 40, 0.3, 0.2
    faults = LinkFaults(seed=7, link_failure=p, offline=q)
    lo = np.arange(n)
    hi = (lo + 1) % n
    down = sum(int((~faults.link_up(s, np.minimum(lo, hi), np.maximum(lo, hi))).sum()) for s in range(steps))
    offline = sum(int((~faults.online(s, np.arange(n))).sum()) for s in range(steps))
    for count, rate in ((down, p), (offline, q)):
        trials = n * steps
        assert abs(count - rate * trials) < 5 * math.sqrt(trials * rate * (1 - rate)), (count, rate)
    # independent across steps: a link down at step s is down at s + 1 with probability p, not more
    first = ~faults.link_up(0, lo, hi)
    again = ~faults.link_up(1, lo, hi)
    both, trials = int((first & again).sum()), int(first.sum())
    assert abs(both - p * trials) < 5 * math.sqrt(trials * p * (1 - p))
    # links_up of a realised ring: the fraction of its links whose link and both ends are up
    net = RealisedTopology(topologies.build("ring", n), faults, "metropolis")
    ups = [net.realise(s).links_up for s in range(steps)]
    assert abs(np.mean(ups) - (1 - p) * (1 - q) ** 2) < 0.01


@pytest.mark.parametrize("p,burst", [(0.3, 5.0), (0.1, 20.0)])
def test_bursty_faults_keep_their_rate_and_come_in_runs_of_the_stated_length(p, burst):
    """Gilbert–Elliott: P(down) = p at every step, down runs geometric with mean B, lag-1 correlation of the down
    indicator 1 − 1/(B (1 − p)); links and offline clients alike. 300 keys × 2000 steps: the run-length mean of
    ~300 · 2000 · (1 − p) p / B runs is within a few percent (deterministic for this seed)."""
    n, steps = 300, 2000
    faults = LinkFaults(seed=11, link_failure=p, offline=p, link_failure_burst=burst, offline_burst=burst)
    lo, hi = np.arange(n), np.arange(n) + n  # any int pairs name links
    for name, draw in (("link", lambda s: ~faults.link_up(s, lo, hi)), ("offline", lambda s: ~faults.online(s, lo))):
        down = np.array([draw(s) for s in range(steps)])
        assert abs(down.mean() - p) < 0.1 * p, name
        x = down.astype(float) - down.mean()
        lag1 = (x[1:] * x[:-1]).mean() / (x * x).mean()
        assert lag1 == pytest.approx(1 - 1 / (burst * (1 - p)), abs=0.03), name
        edges = np.diff(np.vstack([np.zeros(n, bool), down, np.zeros(n, bool)]).astype(np.int8), axis=0)
        starts, ends = np.nonzero(edges.T == 1), np.nonzero(edges.T == -1)
        lengths = ends[1] - starts[1]
        assert lengths.mean() == pytest.approx(burst, rel=0.08), name
    independent = LinkFaults(seed=11, link_failure=p)
    first, again = ~independent.link_up(0, lo, hi), ~independent.link_up(1, lo, hi)
    assert (first & again).sum() < 0.6 * first.sum()  # the default stays independent: P(down twice) = p


def test_bursty_faults_are_a_pure_function_of_seed_and_step():
    """Asked in any order, by a fresh object (a resumed run), the state of step s is the same."""
    def faults():
        return LinkFaults(seed=2, link_failure=0.4, offline=0.2, link_failure_burst=4.0, offline_burst=3.0)
    lo, hi, clients = np.arange(10), np.arange(10) + 1, np.arange(10)
    sequential = faults()
    links = [sequential.link_up(s, lo, hi) for s in range(60)]
    online = [sequential.online(s, clients) for s in range(60)]
    fresh = faults()
    for s in (45, 3, 59, 0, 30):  # out of order: replays where it must
        assert np.array_equal(fresh.link_up(s, lo, hi), links[s])
        assert np.array_equal(fresh.online(s, clients), online[s])
    subset = faults()
    assert np.array_equal(subset.online(20, clients[[7, 2, 7]]), online[20][[7, 2, 7]])  # any subset, repeats
    assert np.array_equal(subset.online(21, clients), online[21])  # keys seen late catch up from step 0
    other = LinkFaults(seed=3, link_failure=0.4, link_failure_burst=4.0)
    assert any(not np.array_equal(other.link_up(s, lo, hi), links[s]) for s in range(60))


def test_the_realised_network_is_a_pure_function_of_seed_and_step():
    a = realised("random-regular", 16, degree=3, seed=5)
    b = realised("random-regular", 16, degree=3, seed=5)
    forward = [a.sparse(s).toarray() for s in range(6)]
    backward = [b.sparse(s).toarray() for s in reversed(range(6))][::-1]  # another order, another object
    for x, y in zip(forward, backward):
        assert np.array_equal(x, y)
    other = realised("random-regular", 16, degree=3, seed=6)
    assert any(not np.array_equal(x, other.sparse(s).toarray()) for s, x in enumerate(forward))
    assert any(not np.array_equal(forward[0], x) for x in forward[1:])  # a new draw every step


def test_zero_probabilities_give_the_topology_itself_bit_for_bit():
    for name, options in (("ring", {}), ("grid", {}), ("random-k", {"k": 2}), ("hypercube", {})):
        net = realised(name, 16, p=0.0, q=0.0, **options)
        for step in range(3):
            W, base = net.sparse(step), net.topology.sparse(step)
            assert np.array_equal(W.indptr, base.indptr) and np.array_equal(W.indices, base.indices)
            assert np.array_equal(W.data, base.data)
    config = make_config(link_failure=0.0, offline=0.0)
    topology = topologies.build("ring", CLIENTS)
    assert Network(config, topology, make_data()).topology is topology  # p = q = 0: the fault-free path


def test_the_realised_path_at_zero_probabilities_reproduces_a_fault_free_run_bit_for_bit(monkeypatch):
    data = make_data()
    reference = dfl.run(make_config(rounds=2), data=data)
    monkeypatch.setattr(run_network, "faults_field", lambda config: "link_failure")  # force RealisedTopology at p = 0
    forced = dfl.run(make_config(rounds=2), data=data)
    torch.testing.assert_close(forced.params, reference.params, atol=0, rtol=0)
    assert forced.history[-1]["links_up"] == 1.0
    assert forced.history[-1]["spectral_gap_realised"] == pytest.approx(1 - reference.summary["lambda"], abs=1e-12)


def test_custom_matrices_give_a_failed_link_weight_back_to_both_ends():
    W = topologies.build("random-regular", 10, degree=4, seed=1).W.copy()
    W = 0.5 * (W + W @ W)  # symmetric doubly stochastic, not a scheme's weights (2-hop links too)
    topology = topologies.build("custom", None, matrix=W, symmetric=True)
    net = RealisedTopology(topology, LinkFaults(3, 0.4, 0.1), None)
    for step in range(10):
        R = net.sparse(step).toarray()
        keep = net.faults.keep(step, topology.sparse())
        K = topology.sparse().copy()
        K.data = keep.astype(float)
        kept = K.toarray() > 0
        np.fill_diagonal(kept, True)
        expected = np.where(kept, W, 0.0)
        np.fill_diagonal(expected, np.diag(W) + np.where(kept, 0.0, W).sum(axis=1))
        np.testing.assert_allclose(R, expected, atol=1e-15)
        assert np.array_equal(R, R.T)
        np.testing.assert_allclose(R.sum(axis=1), 1, atol=1e-12)
    # drop_links with nothing dropped returns the matrix's own values
    A = topologies.build("custom", None, matrix=W, symmetric=True).sparse()
    np.testing.assert_array_equal(drop_links(A, np.ones(A.nnz, dtype=bool)).toarray(), A.toarray())


def test_realised_gap_is_zero_when_disconnected_and_exact_otherwise():
    G = nx.path_graph(5)
    W = topologies.build("custom", None, graph=G).sparse()
    assert realised_gap(W) == pytest.approx(1 - np.sort(np.abs(np.linalg.eigvalsh(W.toarray() - 0.2)))[-1])
    G.remove_edge(1, 2)
    assert realised_gap(topologies.weights.sparse_weights(*topologies.graphs.adjacency_of(G))) == 0.0


# -------------------------------------------------------------------------------------------------- gossip
@pytest.mark.parametrize("path", ["dense", "csr"])
def test_gossip_with_faults_equals_the_float64_product_of_the_realised_matrices(path, monkeypatch, device):
    if path == "csr":
        monkeypatch.setattr(gossip_module, "DENSE_MAX_CLIENTS", 0)
    n, d = 20, 9
    net = realised("random-regular", n, p=0.4, q=0.2, degree=4, seed=2)
    gossip = Gossip(net, LocalCommunicator(n), torch.float32, torch.device(device))
    X = torch.randn(n, d, generator=torch.Generator().manual_seed(0))
    for first, steps in ((0, 1), (3, 4)):
        Y = gossip.mix(X.to(device), first, steps).cpu()
        P = np.eye(n)
        for s in range(first, first + steps):
            P = net.sparse(s).toarray() @ P
        np.testing.assert_allclose(Y.double().numpy(), P @ X.double().numpy(), atol=1e-5, rtol=0)
        sent = gossip.sends(first, steps)
        expected = sum((net.sparse(s).toarray() != 0).sum(axis=0) - 1 for s in range(first, first + steps))
        assert np.array_equal(sent, expected)  # bytes count only the surviving links


def test_offline_clients_keep_their_model_exactly(device):
    n = 30
    net = realised("ring", n, p=0.2, q=0.3, seed=4)
    gossip = Gossip(net, LocalCommunicator(n), torch.float32, torch.device(device))
    X = torch.randn(n, 11, generator=torch.Generator().manual_seed(1)).to(device)
    for step in range(5):
        Y = gossip.mix(X, step, 1)
        offline = ~net.faults.online(step, np.arange(n))
        assert offline.any()
        for i in np.flatnonzero(offline):
            assert torch.equal(Y[i], X[i])
        assert not torch.equal(Y, X)
        X = Y


# ---------------------------------------------------------------------------------------------- stragglers
def test_stragglers_are_slow_at_their_rate_and_stop_at_the_deadline():
    n, rounds, f = 1000, 20, 0.3
    s = Stragglers(seed=3, fraction=f, slowdown=3.0, deadline=7.0, steps=np.full(n, 5))
    slow = sum(int((s.step_seconds(t, np.arange(n)) == 3.0).sum()) for t in range(rounds))
    trials = n * rounds
    assert abs(slow - f * trials) < 5 * math.sqrt(trials * f * (1 - f))
    c = s.step_seconds(4, np.arange(n))
    assert set(np.unique(s.cap(4, np.arange(n)))) == {2, 7}  # floor(7 / 3), floor(7 / 1)
    done, trained, seconds = s.round(4)
    assert np.array_equal(done, np.where(c == 3.0, 2, 5)) and trained.all()
    assert seconds == 7.0  # a slow client needs 15 s for its 5 steps: the deadline ends the round
    no_deadline = Stragglers(seed=3, fraction=f, slowdown=3.0, deadline=0.0, steps=np.full(n, 5))
    assert no_deadline.round(4)[2] == 15.0 and np.array_equal(no_deadline.round(4)[0], np.full(n, 5))
    assert no_deadline.elapsed(2) == 45.0 and no_deadline.elapsed(0) == 15.0  # cumulative, any order


def test_a_straggler_trains_the_first_steps_of_its_schedule(device):
    """A client capped at k steps ends where the same client ends with local_steps = k (a prefix of its batches;
    to float rounding: a step on fewer clients updates its rows out of place)."""
    from dfl.models import build_model
    from dfl.training.clients import ParamLayout, initial_stack
    from dfl.training.local import LocalRule

    data = make_data().to(device)
    torch.manual_seed(0)
    model = build_model("mlp", (5,), 3, hidden=[6]).to(device)
    layout = ParamLayout.of(model)
    X = initial_stack(model, CLIENTS, torch.device(device))
    caps = np.array([1, 5, 2, 5, 3, 0])

    def trainer(steps, cap=None):
        t = LocalTrainer(model, layout, data, list(range(CLIENTS)), make_config(local_steps=steps))
        t.step_cap = cap
        return t

    capped = trainer(5, lambda r, ids: caps[ids])
    schedule = capped.schedule(2)
    assert schedule.steps_per_client.tolist() == [1, 5, 2, 5, 3, 0]
    result = capped.train(X, 2, 0.1, LocalRule())
    assert result.steps.tolist() == [1, 5, 2, 5, 3, 0]
    assert torch.equal(result.Y[5], X[5])  # no step: the model it started from
    for k in (1, 2, 3, 5):
        plain = trainer(k).train(X, 2, 0.1, LocalRule())
        for i in np.flatnonzero(caps == k):
            torch.testing.assert_close(result.Y[i], plain.Y[i], atol=1e-6, rtol=0)


def test_straggler_metrics_of_a_run_in_epoch_mode():
    # sizes 6..8 with batch 4: K_i = 2 steps per epoch; slowdown 2, deadline 2: a slow client takes 1 step
    config = make_config(local_steps=None, local_epochs=2, stragglers=0.5, straggler_slowdown=2.0,
                         round_deadline=2.0)
    result = dfl.run(config, data=make_data(sizes=(3, 7, 8, 5, 12, 8)))
    s = Stragglers(config.seed, 0.5, 2.0, 2.0, np.array([2, 4, 4, 4, 6, 4]))
    total = 0.0
    for t, record in enumerate(result.history):
        done, _, seconds = s.round(t)
        total += seconds
        assert record["steps_done_mean"] == pytest.approx(done.mean())
        assert record["steps_done_min"] == done.min() and record["sim_time"] == pytest.approx(total)
        assert record["sim_time_round"] == 2.0
        assert "links_up" not in record  # no link faults: no link metrics
    assert "steps_done_mean" not in dfl.run(make_config(rounds=1), data=make_data()).history[-1]


# --------------------------------------------------------------------------------------------------- runs
@pytest.mark.parametrize("algorithm,faults", [("dfedsam-mgs", FAULTY), ("dpsgd", FAULTY), ("dfedsam-mgs", BURSTY)])
def test_runs_with_faults_are_reproducible_and_resume_exactly(tmp_path, algorithm, faults):
    data = make_data()
    config = make_config(algorithm=algorithm, rounds=4, **faults)
    if algorithm == "dpsgd":
        config = config.replace(gossip_steps=None, topology="random-k", topology_options={"k": 2})
    full = dfl.run(config, data=data, out=tmp_path / "full")
    resumed = interrupted(config, 2, tmp_path / "part", data)  # a new process would draw the same network
    torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)
    assert_same_history(resumed.history, full.history, algorithm)
    last = full.history[-1]
    assert 0 <= last["links_up"] < 1 and 0 <= last["spectral_gap_realised_worst"] <= last["spectral_gap_realised"]
    assert last["sim_time"] == pytest.approx(sum(h["sim_time_round"] for h in full.history))
    if algorithm == "dfedsam-mgs":  # failed links and offline clients send nothing
        fault_free = dfl.run(make_config(rounds=4), data=data)
        assert full.summary["bytes_sent_total"] < fault_free.summary["bytes_sent_total"]


def test_centralized_algorithms_take_stragglers_over_their_participants():
    config = make_config(algorithm="fedavg", gossip_steps=None, participation=0.5, stragglers=0.5,
                         round_deadline=2.0, straggler_slowdown=2.0)
    result = dfl.run(config, data=make_data())
    from dfl.algorithms.server import sample_participants

    s = Stragglers(config.seed, 0.5, 2.0, 2.0, np.full(CLIENTS, 3))
    for t, record in enumerate(result.history):
        done, _, _ = s.round(t)
        who = sample_participants(config.seed, t, CLIENTS, 0.5, "uniform")
        assert record["steps_done_mean"] == pytest.approx(done[who].mean())


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("changes,message", [
    (dict(link_failure=1.0), "link_failure must be a probability in [0, 1), got 1.0"),
    (dict(link_failure=-0.1), "link_failure must be a probability in [0, 1), got -0.1"),
    (dict(offline=1.5), "offline must be a probability in [0, 1), got 1.5"),
    (dict(offline=float("nan")), "offline must be a probability in [0, 1), got nan"),
    (dict(stragglers=1.2), "stragglers must be a probability in [0, 1], got 1.2"),
    (dict(straggler_slowdown=0.5), "straggler_slowdown must be a finite number >= 1, got 0.5"),
    (dict(round_deadline=-1.0), "round_deadline must be a finite number >= 0, got -1.0"),
    (dict(stragglers=0.2, round_deadline=3.0), "round_deadline = 3 is shorter than one local step of the slowest"),
    (dict(round_deadline=0.5), "use 0 (no deadline) or >= 1"),
    (dict(link_failure=0.2, algorithm="fedavg", gossip_steps=None), "applies to gossip, not to the centralized"),
    (dict(offline=0.2, topology="exponential"), "offline = 0.2 needs an undirected topology, but exponential is"),
    (dict(link_failure=0.2, topology="one-peer-exponential"), "one-peer-exponential is directed"),
    (dict(link_failure=0.2, weights="uniform"), "weights: link_failure = 0.2 reweights the surviving links"),
    (dict(link_failure=0.2, weights="fastest"), "but fastest optimises W for one graph"),
    (dict(link_failure=0.2, weights="lazy", topology_options={"base": "uniform"}), "but uniform is doubly"),
    (dict(link_failure=0.2, topology="full", clients=3000), "at most topologies.limits.FULL_SPARSE_LIMIT = 2048"),
    (dict(link_failure_burst=4.0), "link_failure_burst = 4 sets the mean length of link_failure bursts, but "
                                   "link_failure = 0"),
    (dict(link_failure=0.5, link_failure_burst=1.5), "link_failure_burst must be 0 (independent) or >= 1 / (1 - "
                                                     "link_failure) = 2 gossip steps"),
    (dict(offline=0.2, offline_burst=-1.0), "offline_burst must be 0 (independent offline per gossip step) or a "
                                            "mean outage length"),
    (dict(offline=0.2, offline_burst=float("inf")), "offline_burst must be 0"),
])
def test_bad_network_fields_fail_validation(changes, message):
    with pytest.raises(ConfigError) as info:
        validate(make_config(**changes))
    assert message in str(info.value)


def test_a_directed_custom_topology_is_refused_before_training():
    W = np.roll(np.eye(CLIENTS), 1, axis=1) * 0.5 + np.eye(CLIENTS) * 0.5  # a directed ring, doubly stochastic
    config = make_config(topology="custom", topology_options={"matrix": W.tolist()}, link_failure=0.1)
    with pytest.raises(ConfigError, match="link_failure = 0.1 needs an undirected topology"):
        dfl.run(config, data=make_data())


def test_sweeps_grid_over_the_network_fields():
    from dfl.workflows.sweep import Sweep

    sweep = Sweep.from_dict({"base": {"rounds": 2}, "vary": {"link_failure": [0.0, 0.3], "offline": [0.0, 0.1]}})
    planned = sweep.plan()
    assert [p.config.link_failure for p in planned] == [0.0, 0.0, 0.3, 0.3]
    assert len({p.name for p in planned}) == 4


# ---------------------------------------------------------------------- world size (gloo, 2 and 4 processes)
@pytest.mark.parametrize("world,faults", [(2, FAULTY), (4, BURSTY)])
def test_faults_do_not_depend_on_the_world_size(tmp_path, world, faults):
    assert_world_size_invariant(tmp_path, make_config(**faults), make_data(), world)
