"""Asynchronous gossip in simulated time (dfl.engine.asynchronous, dfl.network.async_events): hand-computed clocks; an
independent numpy simulation of the events and of the updates on a quadratic; the staleness bound, read off the
mixes themselves; the synchronous schedule as the special case; reproducibility, resume and world-size
invariance of whole runs; bad inputs."""

from __future__ import annotations

import copy
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.distributed as dist

import dfl
import topologies
from dfl.config import ConfigError
from dfl.engine.asynchronous import AsyncEngine
from dfl.engine.validation import validate
from dfl.network.async_events import ComputeTimes, EventSchedule, Local, Mix
from dfl.network.comm import LocalCommunicator
from dfl.network.faults import Stragglers
from tests.helpers import (
    assert_histories_close,
    assert_same_history,
    blob_data,
    init_gloo,
    interrupted,
    row_coded_data,
    spawn,
    tiny_config,
)

pytestmark = pytest.mark.timeout(300)  # hang guard only (spawned process groups)

CLIENTS = 6
make_data = partial(blob_data, sizes=(6, 7, 8, 6, 7, 8), shift=1.0)
make_config = partial(tiny_config, local_steps=3, algorithm="dfedavg", topology="ring", mode="async")
NO_COST = dict(link_latency=0.0, link_bandwidth=0.0)


ASYNC = dict(stragglers=0.4, straggler_slowdown=3.0, link_latency=0.3, link_bandwidth=2e4, max_staleness=1)


# ------------------------------------------------------------------------------------------------- clocks
def ring3_schedule(staleness: int) -> EventSchedule:
    W = topologies.build("ring", 3).sparse(0)  # every client mixes with both others
    return EventSchedule(W, ComputeTimes(0, 0.0, 1.0, np.full(3, 2.0), 1), transmit=0.5, latency=0.25,
                         max_staleness=staleness)


def test_clocks_of_a_three_client_ring_by_hand():
    # 2 s of local steps; the uplink sends to client i+1 first (arrives 0.5 + 0.25 s after the send), then to
    # i+2 (1.0 + 0.25 s); the next update starts when the uplink is free, 2 · 0.5 s after the send
    events = ring3_schedule(-1).advance(3)
    assert [(type(e).__name__, e.client, e.version, e.time) for e in events] == [
        ("Local", 0, 0, 2.0), ("Local", 1, 0, 2.0), ("Local", 2, 0, 2.0),
        ("Mix", 0, 0, 2.0), ("Mix", 1, 0, 2.0), ("Mix", 2, 0, 2.0)]
    assert all(e.versions.tolist() == [-1, -1] for e in events if isinstance(e, Mix))  # nothing arrived yet: x⁰
    schedule = ring3_schedule(-1)
    schedule.advance(3)
    events = schedule.advance(3)  # update 1 ends at 3 + 2 = 5; version 0 arrived at 2.75 and 3.25
    assert [(e.time, e.versions.tolist()) for e in events if isinstance(e, Mix)] == [(5.0, [0, 0])] * 3
    # max_staleness = 0: each update waits for the neighbours' same version, the last at 2 + 1.25 s
    schedule = ring3_schedule(0)
    mixes = [e for e in schedule.advance(9) if isinstance(e, Mix)]
    assert [e.time for e in mixes] == [3.25] * 3 + [6.5] * 3 + [9.75] * 3
    assert all(e.versions.tolist() == [e.version] * 2 for e in mixes)


def reference_events(W: np.ndarray, compute, transmit: float, latency: float, staleness: int, mixes: int):
    """The clock model of dfl.network.async_events written the slow way: at every event, scan every client for its next
    send or mix and take the earliest (ties: sends first, then by client id)."""
    m = len(W)
    in_nb = [[j for j in range(m) if j != i and W[i, j] != 0] for i in range(m)]
    out_nb = [sorted((i for i in range(m) if i != j and W[i, j] != 0), key=lambda i: (i - j) % m) for j in range(m)]
    delay = {(j, i): (r + 1) * transmit + latency for j in range(m) for r, i in enumerate(out_nb[j])}
    sent = [[] for _ in range(m)]
    version, start, ended = [0] * m, [0.0] * m, [False] * m
    events = []
    while sum(isinstance(e, Mix) for e in events) < mixes:
        candidates = []
        for i in range(m):
            k = version[i]
            if not ended[i]:
                candidates.append((start[i] + compute(i, k), 0, i))
                continue
            t, need = sent[i][k], k - staleness
            if staleness >= 0 and need >= 0:
                if any(len(sent[j]) <= need for j in in_nb[i]):
                    continue
                t = max([t] + [sent[j][need] + delay[(j, i)] for j in in_nb[i]])
            candidates.append((t, 1, i))
        t, kind, i = min(candidates)
        k = version[i]
        if kind == 0:
            sent[i].append(t)
            ended[i] = True
            events.append(Local(i, k, t))
        else:
            got = [max([-1] + [v for v, e in enumerate(sent[j]) if e + delay[(j, i)] <= t]) for j in in_nb[i]]
            events.append(Mix(i, k, t, np.array(got)))
            version[i], ended[i] = k + 1, False
            start[i] = max(t, sent[i][k] + len(out_nb[i]) * transmit)
    return events


def reference_updates(W, events, X0, A, b, lr, K, kind):
    """The updates of those events on f_i(x) = ½‖A_i x − b_i‖², one event at a time (numpy, float64)."""
    m = len(W)
    X, messages = X0.copy(), {(j, -1): X0[j] for j in range(m)}
    in_nb = [[j for j in range(m) if j != i and W[i, j] != 0] for i in range(m)]

    def grad(i, x):
        return A[i].T @ (A[i] @ x - b[i])

    for e in events:
        if isinstance(e, Local):
            y = X[e.client].copy()
            if kind == "local":
                for _ in range(K):
                    y = y - lr * grad(e.client, y)
            messages[(e.client, e.version)] = y
        else:
            i = e.client
            mixed = W[i, i] * messages[(i, e.version)] + sum(
                W[i, j] * messages[(j, v)] for j, v in zip(in_nb[i], e.versions.tolist()))
            X[i] = mixed - (lr * grad(i, X[i]) if kind == "step" else 0)
    return X


def quadratic_engine(W, schedule, X0, A, b, lr, K, kind, updates):
    A_, b_ = torch.tensor(A), torch.tensor(b)

    def grad(rows, Y):
        ids = rows
        return torch.einsum("nij,ni->nj", A_[ids], torch.einsum("nij,nj->ni", A_[ids], Y) - b_[ids])

    engine = None

    def local(rows, ids, versions, r):
        Y = engine.X[rows].clone()
        if kind == "local":
            for _ in range(K):
                Y = Y - lr * grad(rows, Y)
        return Y, torch.zeros(len(rows), dtype=Y.dtype)

    def step(rows, ids, versions, r):
        return lr * grad(rows, engine.X[rows]), torch.zeros(len(rows), dtype=engine.X.dtype)

    engine = AsyncEngine(sp.csr_array(W), schedule, torch.tensor(X0), LocalCommunicator(len(W)), local,
                         step if kind == "step" else None, updates)
    return engine


@pytest.mark.parametrize("topology,options", [("ring", {}), ("exponential", {}), ("random-regular", {"degree": 4})])
@pytest.mark.parametrize("staleness", [-1, 0, 2])
@pytest.mark.parametrize("kind", ["local", "step"])
def test_events_and_updates_equal_an_independent_numpy_simulation(topology, options, staleness, kind):
    m, d, K, lr, rounds = 7, 3, 2, 0.1, 4
    W = topologies.build(topology, m, **options).matrix(0)  # exponential: directed
    straggle = Stragglers(5, 0.4, 2.5, 0.0, np.full(m, K))  # the synchronous mode's draws, as the reference
    steps = np.full(m, K if kind == "local" else 1)
    per_round = 1 if kind == "local" else K

    def compute(i, k):
        return float(steps[i] * straggle.step_seconds(k // per_round, np.arange(m))[i])

    transmit, latency = 0.3, 0.2
    updates = m if kind == "local" else m * K
    expected = reference_events(W, compute, transmit, latency, staleness, rounds * updates)
    schedule = EventSchedule(sp.csr_array(W), ComputeTimes(5, 0.4, 2.5, steps, per_round), transmit, latency,
                             staleness)
    rng = np.random.default_rng(0)
    A, b, X0 = rng.normal(size=(m, 4, d)) / 2, rng.normal(size=(m, 4)), np.tile(rng.normal(size=d), (m, 1))
    engine = quadratic_engine(W, schedule, X0, A, b, lr, K, kind, updates)
    engine.trace, waves = [], 0
    for r in range(rounds):
        waves += len(engine._waves(copy.deepcopy(schedule).advance(updates)))
        engine.round(r)
    got = [(e.client, e.version, e.time, e.versions.tolist()) for e in engine.trace]
    want = [(e.client, e.version, pytest.approx(e.time, abs=1e-12), e.versions.tolist())
            for e in expected if isinstance(e, Mix)]
    assert got == want
    X = reference_updates(W, expected, X0, A, b, lr, K, kind)
    np.testing.assert_allclose(engine.X.numpy(), X, rtol=0, atol=1e-12)
    assert waves < rounds * updates / 2  # the events ran in batches, not one at a time


def test_the_staleness_bound_holds_in_the_mixes_themselves():
    m, K = 8, 2
    W = topologies.build("ring", m).matrix(0)
    rng = np.random.default_rng(1)
    A, b, X0 = rng.normal(size=(m, 3, 2)), rng.normal(size=(m, 3)), np.zeros((m, 2))
    seen = {}
    for staleness in (-1, 0, 1, 3):
        schedule = EventSchedule(sp.csr_array(W), ComputeTimes(2, 0.5, 4.0, np.full(m, K), 1), 0.1, 0.5, staleness)
        engine = quadratic_engine(W, schedule, X0, A, b, 0.05, K, "local", m)
        used = []  # (update, version) of every message a mix actually combines

        def recorded(ev, terms=engine._terms, used=used):
            out = terms(ev)
            used.extend((ev.version, version) for (_, version), _ in out)
            return out

        engine._terms = recorded
        for r in range(30):
            engine.round(r)
        seen[staleness] = max(k - v for k, v in used)
        if staleness >= 0:
            assert seen[staleness] <= staleness
    assert seen[-1] > 3  # without a bound, slow neighbours fall far behind
    assert seen[0] == 0 and seen[1] == 1


@pytest.mark.parametrize("augment", [None, "crop-flip"])
def test_schedules_with_a_round_and_a_step_per_client_equal_each_clients_own(augment):
    from dfl.data.sampler import RoundSchedule
    data = row_coded_data(sizes=(5, 9, 3, 7), augment=augment)
    rounds, ids = np.array([4, 0, 7, 2]), [0, 1, 2, 3]
    mixed = RoundSchedule(data, ids, rounds, 3, 2, "epochs", 2)  # every client in its own round
    steps = np.array([5, 0, 3, 6])
    at = mixed.batch_at(steps)  # and at its own step
    for i, t in enumerate(rounds.tolist()):
        own = RoundSchedule(data, [i], t, 3, 2, "epochs", 2)
        assert own.steps_per_client.tolist() == [mixed.steps_per_client[i]]
        for k in range(own.steps):
            a, b = mixed.batch(k), own.batch(k)
            row = (a.rows == i).nonzero().item()
            for part in ("x", "y", "weight"):
                torch.testing.assert_close(getattr(a, part)[row], getattr(b, part)[0], atol=0, rtol=0)
        for part in ("x", "y", "weight"):
            torch.testing.assert_close(getattr(at, part)[i], getattr(own.batch(int(steps[i])), part)[0], atol=0,
                                       rtol=0)
    with pytest.raises(ValueError, match="steps must give every row a step below its step count"):
        mixed.batch_at([0, 0, 4, 0])  # client 2 has 2 epochs of 2 batches


# ---------------------------------------------------------------------------------------------- whole runs
@pytest.mark.parametrize("algorithm,changes", [
    ("dfedavg", {}), ("dfedavgm", {}), ("dfedsam", {"rho": 0.05}), ("dfedsam-mgs", {"gossip_steps": 1}),
    ("dpsgd", {}), ("dfedavg", {"topology": "exponential"}),  # directed
])
def test_equal_speeds_no_staleness_and_free_links_are_the_synchronous_schedule(algorithm, changes):
    data = make_data()
    sync = dfl.run(make_config(algorithm=algorithm, mode="sync", **changes), data=data)
    run = dfl.run(make_config(algorithm=algorithm, max_staleness=0, **NO_COST, **changes), data=data)
    torch.testing.assert_close(run.params, sync.params, atol=2e-6, rtol=0)
    for a, s in zip(run.history, sync.history):
        assert a["train_loss"] == pytest.approx(s["train_loss"], abs=1e-6)
        assert a["bytes_sent"] == s["bytes_sent"]
        assert a["staleness_max"] == 0 and a["updates_min"] == a["updates_max"]
    K = 3  # every update is K seconds of local steps (dpsgd: K updates of 1 s per round)
    assert [h["sim_time"] for h in run.history] == [K * (t + 1) for t in range(4)]


def test_a_denser_graph_costs_more_simulated_time_per_round():
    data = make_data()
    times = {}
    for topology in ("ring", "exponential"):
        options = {"symmetric": True} if topology != "ring" else {}
        result = dfl.run(make_config(topology=topology, topology_options=options, link_bandwidth=1e4,
                                     link_latency=0.5), data=data)
        T = result.layout.dim * 4 / 1e4  # seconds per message
        degree = int(topologies.build(topology, CLIENTS, **options).out_degrees(0)[0])  # 2 and 4
        times[topology] = [h["sim_time"] for h in result.history]
        # no waiting (max_staleness = -1): an update is 3 s of steps, the next starts after the d messages left
        assert times[topology] == pytest.approx([3 * (r + 1) + r * degree * T for r in range(4)])
    assert times["exponential"][-1] > times["ring"][-1]
    assert times["exponential"] > times["ring"]


def test_async_runs_are_reproducible_and_resume_exactly(tmp_path):
    data = make_data()
    for algorithm in ("dfedsam", "dpsgd"):
        config = make_config(algorithm=algorithm, rounds=4, **ASYNC)
        full = dfl.run(config, data=data, out=tmp_path / f"{algorithm}-full")
        again = dfl.run(config, data=data)
        torch.testing.assert_close(again.params, full.params, atol=0, rtol=0)
        assert [h["sim_time"] for h in again.history] == [h["sim_time"] for h in full.history]
        resumed = interrupted(config, 2, tmp_path / f"{algorithm}-part", data)
        torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)
        assert_same_history(resumed.history, full.history, algorithm)
        history = full.history
        assert max(h["staleness_max"] for h in history) == 1  # max_staleness, reached
        assert any(h["updates_max"] > h["updates_min"] for h in history)  # fast clients did more updates
        assert all(b["sim_time"] > a["sim_time"] for a, b in zip(history, history[1:]))
    other = dfl.run(make_config(algorithm="dpsgd", rounds=4, seed=2, **ASYNC), data=data)  # other speeds
    assert [h["sim_time"] for h in other.history] != [h["sim_time"] for h in full.history]


def test_report_plots_accuracy_against_simulated_time_and_bytes(tmp_path):
    from dfl.report import write_report

    data = make_data()
    dfl.run(make_config(rounds=2, **ASYNC), data=data, out=tmp_path / "runs" / "async")
    dfl.run(make_config(mode="sync", rounds=2), data=data, out=tmp_path / "runs" / "sync")  # no sim_time: left out
    files = write_report(tmp_path / "runs", rows="topology", cols="mode")
    for name in ("accuracy_time.png", "accuracy_bytes.png"):
        assert files[name].read_bytes().startswith(b"\x89PNG") and f"plots/{name}" in files["report.md"].read_text()
    assert "Simulated time" in files["report.md"].read_text()
    assert "staleness_mean" in files["settings.csv"].read_text().splitlines()[0]


@pytest.mark.parametrize("changes,message", [
    (dict(mode="asynchronous"), "mode must be one of sync, async; got 'asynchronous'"),
    (dict(link_latency=-1.0), "link_latency must be a finite number >= 0, got -1.0"),
    (dict(link_bandwidth=float("inf")), "link_bandwidth must be a finite number >= 0 (0 = unlimited), got inf"),
    (dict(max_staleness=-2), "max_staleness must be an integer >= 0, or -1 for unbounded, got -2"),
    (dict(max_staleness=1.5), "max_staleness must be an integer >= 0, or -1 for unbounded, got 1.5"),
    (dict(mode="sync", link_latency=1.0), "link_latency = 1.0 applies only to mode = async"),
    (dict(mode="sync", max_staleness=2), "max_staleness = 2 applies only to mode = async"),
    (dict(algorithm="fedavg"), "mode = async applies to gossip, not to the centralized 'fedavg'"),
    (dict(algorithm="dfedsam-mgs"), "gossip_steps = 4 (dfedsam-mgs): mode = async mixes once per update"),
    (dict(link_failure=0.1), "link_failure = 0.1 applies to mode = sync"),
    (dict(round_deadline=3.0), "round_deadline = 3.0 applies to mode = sync"),
    (dict(local_optimizer="adam"), "local_optimizer = adam is not supported with mode = async"),
    (dict(topology="one-peer-exponential"), "mode = async needs a static topology, but one-peer-exponential"),
])
def test_bad_async_fields_fail_validation(changes, message):
    with pytest.raises(ConfigError) as info:
        validate(make_config(**changes))
    assert message in str(info.value)


def test_an_unsupported_registered_algorithm_is_refused():
    from dfl.algorithms import ALGORITHMS, Algorithm, RoundStats

    class Mine(Algorithm):
        def round(self, t):  # pragma: no cover - never runs
            return RoundStats(self.X[:, 0], np.zeros(CLIENTS, dtype=np.int64))

    ALGORITHMS.register("mine-async-test", Mine)
    try:
        with pytest.raises(ConfigError, match="algorithm: mode = async runs dpsgd, dfedavg"):
            validate(make_config(algorithm="mine-async-test"))
    finally:
        ALGORITHMS.unregister("mine-async-test")


# ------------------------------------------------------------------------- world size (gloo, 2 processes)
def _async_worker(rank, world, rdzv, out_dir):
    init_gloo(rank, world, rdzv)
    try:
        for algorithm in ("dfedavg", "dpsgd"):
            result = dfl.run(make_config(algorithm=algorithm, **ASYNC), data=make_data())
            torch.save({"params": result.params, "ids": result.client_ids, "history": result.history},
                       Path(out_dir) / f"{algorithm}-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_async_runs_do_not_depend_on_the_world_size(tmp_path, world):
    references = {a: dfl.run(make_config(algorithm=a, **ASYNC), data=make_data()) for a in ("dfedavg", "dpsgd")}
    spawn(_async_worker, world, str(tmp_path / "rdzv"), str(tmp_path))
    for algorithm, reference in references.items():
        for rank in range(world):
            got = torch.load(tmp_path / f"{algorithm}-{rank}.pt")
            # every mix sums its terms in one order whatever the world size: bit for bit (every client on the main
            # process, the rank's own block elsewhere)
            torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=0, rtol=0,
                                       msg=f"{algorithm} {rank}")
            history = got["history"] if rank == 0 else [
                {**h, "client_acc": r["client_acc"]} for h, r in zip(got["history"], reference.history)]
            assert_histories_close(history, reference.history, f"{algorithm} rank {rank}")


# ------------------------------------------------------------------------------------------- the message pool
@pytest.mark.parametrize("topology", ["ring", "random-regular"])
@pytest.mark.parametrize("kind", ["local", "step"])
def test_the_message_pool_stays_within_its_bound_and_grows_by_a_factor(topology, kind):
    """With max_staleness S a sender keeps at most 2S + 3 versions: the rows in use never exceed `pool_bound`, the
    pool never grows past it, and each growth is one new buffer POOL_GROWTH times larger (no torch.cat)."""
    from dfl.engine import asynchronous

    m, K = 9, 2
    options = {"degree": 4} if topology == "random-regular" else {}
    W = topologies.build(topology, m, **options).matrix(0)
    rng = np.random.default_rng(3)
    A, b, X0 = rng.normal(size=(m, 3, 2)), rng.normal(size=(m, 3)), np.zeros((m, 2))
    for staleness in (0, 1, 3):
        steps, per_round = (np.full(m, K), 1) if kind == "local" else (np.ones(m), K)
        schedule = EventSchedule(sp.csr_array(W), ComputeTimes(2, 0.5, 6.0, steps, per_round), 0.3, 0.7, staleness)
        engine = quadratic_engine(W, schedule, X0, A, b, 0.05, K, kind, m if kind == "local" else m * K)
        bound = asynchronous.pool_bound(sp.csr_array(W), range(m), staleness)
        assert bound == m * (2 * staleness + 3)  # one process: nothing received from another
        sizes, most_used = [engine.pool.shape[0]], 0
        for r in range(40):
            engine.round(r)
            most_used = max(most_used, engine.pool.shape[0] - len(engine.free))
            if engine.pool.shape[0] != sizes[-1]:
                sizes.append(engine.pool.shape[0])
        assert most_used <= bound and max(sizes) <= bound, (staleness, most_used, sizes, bound)
        for before, after in zip(sizes, sizes[1:]):
            assert after == min(bound, int(np.ceil(before * asynchronous.POOL_GROWTH))) or after > before * 1.5
    unbounded = asynchronous.pool_bound(sp.csr_array(W), range(m), -1)
    assert unbounded is None


def test_the_pool_refuses_a_growth_that_does_not_fit_and_says_what_bounds_it(monkeypatch):
    from dfl.engine import asynchronous

    m = 6
    W = topologies.build("ring", m).matrix(0)
    schedule = EventSchedule(sp.csr_array(W), ComputeTimes(2, 0.5, 8.0, np.full(m, 2), 1), 0.1, 0.5, -1)
    rng = np.random.default_rng(3)
    engine = quadratic_engine(W, schedule, np.zeros((m, 2)), rng.normal(size=(m, 3, 2)), rng.normal(size=(m, 3)),
                              0.05, 2, "local", m)
    planned = engine.planned_pool_bytes()
    assert planned == (2 * m + int(np.ceil(2 * m * asynchronous.POOL_GROWTH))) * 2 * 8  # the pool and its growth
    monkeypatch.setattr(asynchronous.memory, "available_bytes", lambda device: 100)
    with pytest.raises(ConfigError, match="mode = async: the message pool of this process needs .* set "
                                          "max_staleness >= 0 to bound them"):
        for r in range(40):
            engine.round(r)
