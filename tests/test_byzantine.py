"""Byzantine clients and robust aggregation (dfl.network.byzantine, dfl.network.robust, dfl.network.byzantine_settings).

Each aggregator against a plain numpy reference on small irregular graphs (padded neighbourhoods), each attack's
message against its formula, a run that an attack wrecks under mean gossip but not under a robust rule, the metrics
over the honest clients only, resume, and the refusals (one line each, before torch loads).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import norm

import dfl
import topologies
from dfl.config import Config
from dfl.errors import ConfigError
from dfl.network import robust
from dfl.network.byzantine import ByzantineGossip, Threat, byzantine_clients, server_updates
from dfl.network.byzantine_settings import alie_z, byzantine_count
from dfl.network.comm import LocalCommunicator
from dfl.network.gossip import Gossip
from tests.helpers import assert_same_history, interrupted

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def hood_sets(W):
    """Per receiver: [i, then its in-neighbours j ≠ i with W_ij > 0] (the reference's neighbourhoods)."""
    W = np.asarray(W)
    return [[i] + [j for j in range(len(W)) if j != i and W[i, j] > 0] for i in range(len(W))]


def reference_rule(M, W, rule, b):
    """Coordinate-wise median / b-trimmed mean per receiver over its neighbourhood, in float64 numpy."""
    out = np.empty_like(M, dtype=np.float64)
    for i, hood in enumerate(hood_sets(W)):
        values = np.sort(M[hood].astype(np.float64), axis=0)
        k = len(hood)
        if rule == "median":
            out[i] = np.median(values, axis=0)
        else:
            bi = min(b, (k - 1) // 2)
            out[i] = values[bi:k - bi].mean(axis=0)
    return out


GRAPHS = [("grid", 12), ("star", 7), ("ring", 9), ("full", 6)]


@pytest.mark.parametrize("name,n", GRAPHS)
def test_neighbourhood_tables_pad_irregular_degrees(name, n):
    W = topologies.build(name, n).matrix(0)
    hood = robust.Neighbourhoods.of(W, torch.float64, CPU)
    sets = hood_sets(W)
    assert hood.most == max(map(len, sets))
    for i, expected in enumerate(sets):
        k = len(expected)
        assert hood.count[i] == k and hood.valid[i].sum() == k
        assert hood.index[i, :k].tolist() == expected
        assert torch.allclose(hood.weight[i, :k], torch.as_tensor(W[i, expected]))
        assert (hood.weight[i, k:] == 0).all()


@pytest.mark.parametrize("name,n", GRAPHS)
@pytest.mark.parametrize("rule,b", [("median", 0), ("trimmed-mean", 1), ("trimmed-mean", 2)])
def test_coordinate_wise_rules_match_numpy(name, n, rule, b):
    W = topologies.build(name, n).matrix(0)
    M = torch.randn(n, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    hood = robust.Neighbourhoods.of(W, torch.float64, CPU)
    for rows in (1, 3, n):  # row blocks change nothing
        out = robust.robust_step(M, hood, rule, b, rows)
        np.testing.assert_allclose(out.numpy(), reference_rule(M.numpy(), W, rule, b), rtol=1e-12, atol=1e-12)


def test_trimmed_mean_with_b_0_is_the_neighbourhood_mean_and_an_odd_median_is_exact():
    W = topologies.build("grid", 12).matrix(0)
    M = torch.randn(12, 7, generator=torch.Generator().manual_seed(2))
    hood = robust.Neighbourhoods.of(W, torch.float32, CPU)
    mean = np.stack([M.numpy()[s].mean(axis=0) for s in hood_sets(W)])
    np.testing.assert_allclose(robust.robust_step(M, hood, "trimmed-mean", 0, 5).numpy(), mean, rtol=1e-5, atol=1e-6)
    ring = topologies.build("ring", 8).matrix(0)  # every neighbourhood has 3 members: the median is one of them
    med = robust.robust_step(M[:8], robust.Neighbourhoods.of(ring, torch.float32, CPU), "median", 0, 8)
    assert torch.equal(med, torch.as_tensor(np.median(np.stack([M.numpy()[s] for s in hood_sets(ring)]), axis=1)))


def reference_clipped(M, W, tau, b):
    """x_i + Σ_j w_ij clip(z_j − x_i, τ_i) (He et al. 2022), τ_i fixed or the (b+1)-th largest distance."""
    out = np.empty_like(M, dtype=np.float64)
    for i, hood in enumerate(hood_sets(W)):
        others = hood[1:]
        dist = np.array([np.linalg.norm(M[j] - M[i]) for j in others])
        radius = tau
        if tau is None:
            ranked = np.sort(dist)[::-1]
            radius = ranked[b] if b < len(ranked) else 0.0
        out[i] = M[i].astype(np.float64)
        for j, dj in zip(others, dist):
            scale = 1.0 if dj == 0 else min(1.0, radius / dj)
            out[i] += W[i, j] * scale * (M[j] - M[i])
    return out


@pytest.mark.parametrize("name,n", GRAPHS)
@pytest.mark.parametrize("tau,b", [(0.5, 0), (None, 1), (None, 2)])
def test_clipped_gossip_matches_its_definition_and_rows_sum_to_one(name, n, tau, b):
    W = topologies.build(name, n).matrix(0)
    M = torch.randn(n, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    hood = robust.Neighbourhoods.of(W, torch.float64, CPU)
    weight = robust.clipped_weights(robust.neighbour_distances(M, hood, 2), hood, tau, b)
    assert torch.allclose(weight.sum(dim=1), torch.ones(n, dtype=torch.float64))
    assert (weight[:, 1:] <= hood.weight[:, 1:] + 1e-15).all()
    out = robust.weighted_step(M, hood, weight, 2)
    np.testing.assert_allclose(out.numpy(), reference_clipped(M.numpy(), W, tau, b), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,n", GRAPHS)
def test_clipped_gossip_with_an_infinite_radius_is_plain_gossip(name, n):
    topo = topologies.build(name, n)
    M = torch.randn(n, 6, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    hood = robust.Neighbourhoods.of(topo.matrix(0), torch.float64, CPU)
    weight = robust.clipped_weights(robust.neighbour_distances(M, hood, n), hood, float("inf"), 0)
    plain = Gossip(topo, LocalCommunicator(n), torch.float64, CPU).mix(M, 0, 1)
    assert torch.allclose(robust.weighted_step(M, hood, weight, n), plain, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------ the attacks
def threat(attack, scale, m=8, count=2, aggregator="mean", trim=None, clip_radius=None):
    config = Config(clients=m, byzantine=count, attack=attack, attack_scale=scale, aggregator=aggregator, trim=trim,
                    clip_radius=clip_radius)
    return Threat.from_config(config, m)


def test_adaptive_clipped_gossip_warns_when_it_isolates_honest_receivers():
    """On a ring whose client 4 has two Byzantine neighbours (3, 5), trim unset means b = 2 for every receiver: each has
    2 neighbours, so τ = 0 everywhere and nobody gossips; dfl says so. With trim = 1 it gossips and says nothing."""
    bad = np.zeros(8, dtype=bool)
    bad[[3, 5]] = True
    ring = topologies.build("ring", 8)
    for trim, warns in ((None, True), (1, False)):
        t = dataclasses.replace(threat("ipm", None, aggregator="clipped-gossip", trim=trim), byzantine=bad)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ByzantineGossip(Gossip(ring, LocalCommunicator(8), torch.float32, CPU), t, torch.zeros(8, 3))
        said = [str(w.message) for w in caught if "clipped-gossip" in str(w.message)]
        assert said == (["aggregator = clipped-gossip: 6 of the 6 honest clients have at most b = 2 neighbours, so "
                         "the adaptive radius clips every neighbour to tau = 0 and they keep their own models (b: "
                         "trim, unset = the most Byzantine in-neighbours of any honest client); set trim below 2 (e.g. "
                         "trim = 1) or clip_radius"] if warns else [])


def test_the_clipped_gossip_warning_suggests_a_trim_below_b():
    """A star with one Byzantine leaf: b = 1 (the centre's), so every honest leaf (one neighbour) is isolated; the
    advice is trim = 0, not the trim = 1 it already has (as it said before)."""
    bad = np.zeros(8, dtype=bool)
    bad[5] = True
    t = dataclasses.replace(threat("ipm", None, aggregator="clipped-gossip"), byzantine=bad)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ByzantineGossip(Gossip(topologies.build("star", 8), LocalCommunicator(8), torch.float32, CPU), t,
                        torch.zeros(8, 3))
    said = [str(w.message) for w in caught if "clipped-gossip" in str(w.message)]
    assert len(said) == 1 and "at most b = 1 neighbours" in said[0], said
    assert said[0].endswith("set trim below 1 (e.g. trim = 0) or clip_radius"), said


def test_each_attack_sends_its_formula():
    own, start = torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    honest = torch.randn(6, 5, dtype=torch.float64)
    mu, sigma = honest.mean(dim=0), honest.std(dim=0)  # n_H − 1 in the denominator
    t = threat("sign-flip", 3.0)
    assert torch.allclose(t.forge(own, start, mu, None, 0), start - 3 * (own - start))
    assert torch.allclose(t.forge(own, None, mu, None, 0), -3 * own)  # at the server: −s Δ
    t = threat("gaussian", 2.0)
    assert torch.allclose(t.forge(own, start, mu, None, 5), start + 2 * t.noise(5, 2, 5, own))
    assert torch.equal(t.noise(5, 2, 5, own), t.noise(5, 2, 5, own)) and not torch.equal(
        t.noise(5, 2, 5, own), t.noise(6, 2, 5, own))  # seeded per step
    t = threat("alie", 1.5)
    assert torch.allclose(t.forge(own, start, mu, sigma, 0), (mu - 1.5 * sigma).expand(2, 5))
    t = threat("ipm", 0.1)
    assert torch.allclose(t.forge(own, start, mu, None, 0), (-0.1 * mu).expand(2, 5))
    assert threat("ipm", None).scale == 0.1 and threat("sign-flip", None).scale == 1.0


def test_alie_z_is_baruch_et_al_z_max():
    for n, f in [(16, 3), (20, 4), (9, 1), (50, 10)]:
        s = np.floor(n / 2 + 1) - f
        assert alie_z(n, f) == pytest.approx(norm.ppf((n - f - s) / (n - f)), rel=1e-12)
    assert threat("alie", None, m=16, count=3).scale == pytest.approx(alie_z(16, 3))


def test_byzantine_set_is_seeded_and_sized():
    assert byzantine_count(0.25, 16) == 4 and byzantine_count(3, 16) == 3 and byzantine_count(0, 16) == 0
    a, b = byzantine_clients(0, 20, 5), byzantine_clients(0, 20, 5)
    assert a.sum() == 5 and np.array_equal(a, b) and not np.array_equal(a, byzantine_clients(1, 20, 5))


@pytest.mark.parametrize("attack", ["sign-flip", "ipm", "alie"])
def test_gossip_step_under_attack_equals_numpy(attack):
    m = 9
    topo = topologies.build("ring", m)
    t = threat(attack, 2.0, m=m, count=2)
    X0 = torch.randn(m, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    gossip = ByzantineGossip(Gossip(topo, LocalCommunicator(m), torch.float64, CPU), t, X0)
    Y = X0 + 0.1 * torch.randn(m, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    out = gossip.mix(Y, 0, 1)
    bad, y = t.byzantine, Y.numpy()
    H = y[~bad]
    message = {"sign-flip": X0.numpy()[bad] - 2 * (y[bad] - X0.numpy()[bad]),
               "ipm": np.tile(-2 * H.mean(axis=0), (2, 1)),
               "alie": np.tile(H.mean(axis=0) - 2 * H.std(axis=0, ddof=1), (2, 1))}[attack]
    M = y.copy()
    M[bad] = message
    expected = topo.matrix(0) @ M
    expected[bad] = expected[~bad].mean(axis=0)  # Byzantine clients hold the honest mean
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-10, atol=1e-12)
    if attack == "sign-flip":  # x^start is now the honest mean the Byzantine rows hold
        assert torch.allclose(gossip.start, out[torch.as_tensor(np.flatnonzero(bad))])


# ------------------------------------------------------------------------------------------------ the server
def test_server_rules_match_numpy():
    V = torch.randn(9, 6, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    v = V.numpy()
    np.testing.assert_allclose(robust.server_aggregate(V, "median", 0).numpy(), np.median(v, axis=0))
    ranked = np.sort(v, axis=0)
    np.testing.assert_allclose(robust.server_aggregate(V, "trimmed-mean", 2).numpy(), ranked[2:7].mean(axis=0))
    d2 = ((v[:, None] - v[None]) ** 2).sum(-1)
    scores = [np.sort(np.delete(d2[i], i))[: 9 - 2 - 2].sum() for i in range(9)]
    np.testing.assert_allclose(robust.server_aggregate(V, "krum", 2).numpy(), v[int(np.argmin(scores))])
    center = torch.full((6,), 0.3, dtype=torch.float64)
    diff = v - 0.3
    clipped = diff * np.minimum(1, 0.5 / np.linalg.norm(diff, axis=1, keepdims=True))
    np.testing.assert_allclose(robust.server_aggregate(V, "centered-clipping", 0, 0.5, center).numpy(),
                               0.3 + clipped.mean(axis=0))


def test_server_mean_under_sign_flip_is_the_weighted_mean_of_the_messages():
    t = threat("sign-flip", 1.0, m=4, count=1)
    V = torch.randn(4, 3, dtype=torch.float64)
    bad = t.byzantine
    w = torch.full((4,), 0.25, dtype=torch.float64)
    expected = V.clone()
    expected[torch.as_tensor(bad)] *= -1
    assert torch.allclose(server_updates(t, V, bad, w, 0, torch.zeros(3, dtype=torch.float64)), w @ expected)


def test_a_neighbourhood_that_cannot_fit_is_refused_before_the_first_round(monkeypatch):
    monkeypatch.setattr(robust, "free_bytes", lambda device: 1000)
    with pytest.raises(ConfigError, match="aggregator = median on topology = full"):
        robust.block_rows(100, 1000, 4, CPU, "aggregator = median on topology = full (100 clients)")
    trained = []
    monkeypatch.setattr("dfl.training.local.LocalTrainer.train", lambda *a, **k: trained.append(1))
    with pytest.raises(ConfigError, match=r"aggregator = median on topology = full \(8 clients\): one receiver's "):
        dfl.run(Config(topology="full", clients=8, rounds=1, aggregator="median", progress=False))
    assert not trained


# ------------------------------------------------------------------------------------------------ runs
RUN = dict(topology="full", clients=16, rounds=10, eval_every=10, progress=False, seed=0)


def test_an_attack_wrecks_mean_gossip_but_not_clipped_gossip():
    clean = dfl.run(Config(**RUN)).history[-1]["test_acc"]
    attacked = dict(RUN, byzantine=3, attack="gaussian")
    wrecked = dfl.run(Config(**attacked)).history[-1]["test_acc"]
    kept = dfl.run(Config(**attacked, aggregator="clipped-gossip")).history[-1]["test_acc"]
    assert wrecked < 0.2 < 0.3 < kept and kept > clean - 0.05, (clean, wrecked, kept)


def test_an_attack_wrecks_the_server_mean_but_not_the_trimmed_mean():
    base = dict(RUN, algorithm="fedavg", byzantine=3, attack="gaussian", attack_scale=3.0)
    wrecked = dfl.run(Config(**base)).history[-1]["test_acc"]
    kept = dfl.run(Config(**base, aggregator="trimmed-mean")).history[-1]["test_acc"]
    assert wrecked < 0.15 < 0.25 < kept, (wrecked, kept)


def test_metrics_are_over_the_honest_clients_only(tmp_path):
    result = dfl.run(Config(**dict(RUN, topology="ring", clients=8, rounds=2, eval_every=1), byzantine=2,
                            attack="ipm", aggregator="median"), out=tmp_path / "run")
    record, summary = result.history[-1], json.loads((tmp_path / "run" / "summary.json").read_text())
    honest = ~np.isin(np.arange(8), summary["byzantine_clients"])
    assert record["honest_clients"] == summary["honest_clients"] == 6 and len(record["client_acc"]) == 6
    X = result.params.double().numpy()[honest]
    distance = ((X - X.mean(axis=0)) ** 2).sum(axis=1).mean()
    assert record["consensus_distance"] == pytest.approx(distance, rel=1e-6)
    assert summary["attack"] == "ipm" and summary["attack_scale"] == 0.1 and summary["aggregator"] == "median"


def test_without_byzantine_clients_the_run_takes_todays_code_path():
    from dfl.engine import setup

    result = dfl.run(Config(**dict(RUN, clients=8, rounds=1, eval_every=1)))
    assert "honest_clients" not in result.history[-1] and "byzantine_clients" not in result.summary
    network = setup.network(Config(clients=8), topologies.build("ring", 8), _FakeData(8), {})
    assert type(network.gossip(LocalCommunicator(8), torch.float32, CPU, torch.zeros(8, 3))) is Gossip


class _FakeData:
    """What `Network` reads of the data (sample counts) when no straggler model is on."""

    def __init__(self, m):
        self.sizes = torch.full((m,), 10)


@pytest.mark.parametrize("attack", ["sign-flip", "gaussian"])
def test_resume_continues_bit_for_bit(tmp_path, attack):
    config = Config(**dict(RUN, topology="ring", clients=8, rounds=4, eval_every=1), byzantine=2, attack=attack,
                    aggregator="trimmed-mean", algorithm="dfedsam-mgs", gossip_steps=2)
    straight = dfl.run(config, out=tmp_path / "a").history
    assert_same_history(interrupted(config, 2, tmp_path / "b", None).history, straight)


def test_server_resume_keeps_the_centered_clipping_state(tmp_path):
    config = Config(**dict(RUN, clients=8, rounds=4, eval_every=1), algorithm="fedavgsm", byzantine=2,
                    attack="sign-flip", aggregator="centered-clipping", clip_radius=0.5, participation=0.75)
    straight = dfl.run(config, out=tmp_path / "a").history
    assert_same_history(interrupted(config, 2, tmp_path / "b", None).history, straight)


# ------------------------------------------------------------------------------------------------ refusals
REFUSALS = [
    (dict(byzantine=2), "needs attack"),
    (dict(attack="ipm"), "attack = 'ipm' applies to Byzantine clients"),
    (dict(attack_scale=2.0), "attack_scale = 2.0 applies to Byzantine clients"),
    (dict(byzantine=16, attack="ipm"), "leaves no honest client"),
    (dict(byzantine=0.01, attack="ipm"), "rounds to no Byzantine client"),
    (dict(byzantine=2.5, attack="ipm"), "byzantine must be a count"),
    (dict(aggregator="krum"), "aggregator = krum is not a rule of the decentralized"),
    (dict(aggregator="clipped-gossip", algorithm="fedavg"), "aggregator = clipped-gossip is not a rule of the central"),
    (dict(aggregator="median", trim=1), "trim = 1 applies to aggregator = clipped-gossip, trimmed-mean"),
    (dict(aggregator="median", clip_radius=1.0), "clip_radius = 1.0 applies to aggregator = clipped-gossip"),
    (dict(aggregator="clipped-gossip", trim=1, clip_radius=1.0), "set one of them"),
    (dict(aggregator="centered-clipping", algorithm="fedavg"), "needs clip_radius"),
    (dict(byzantine=2, attack="ipm", algorithm="dsgt"), "not 'dsgt'"),
    (dict(byzantine=2, attack="ipm", algorithm="scaffold"), "not 'scaffold'"),
    (dict(aggregator="median", algorithm="kgt"), "not 'kgt'"),
    (dict(aggregator="median", topology="full", clients=2049, dataset_options={"num_samples": 10_000}),
     "explicit neighbourhoods stop at 2,048 clients"),
    (dict(byzantine=2, attack="ipm", compressor="top-k"), "compressor = top-k is not modelled"),
    (dict(byzantine=2, attack="ipm", mode="async", algorithm="dfedavg"), "mode = async is not modelled"),
    (dict(byzantine=2, attack="ipm", weights="column-stochastic", topology="exponential"), "push-sum"),
    (dict(byzantine=2, attack="ipm", algorithm="fedavg", aggregator="median", aggregation="size"), "aggregation ="),
    (dict(byzantine=9, attack="alie", clients=16), "z_max"),
    (dict(byzantine=3, attack="ipm", algorithm="fedavg", aggregator="krum", clients=8), "krum with 3 Byzantine"),
]


@pytest.mark.parametrize("changes,message", REFUSALS)
def test_refusals_are_one_line(changes, message):
    with pytest.raises(ConfigError, match=message) as info:
        dfl.validate(Config(**changes))
    assert "\n" not in str(info.value)


NO_TORCH = """
import sys, dfl
from dfl.errors import ConfigError
for changes in {changes!r}:
    try:
        dfl.validate(dfl.Config(**changes))
        raise SystemExit(f"accepted: {{changes}}")
    except ConfigError:
        pass
print('torch' in sys.modules)
"""


def test_refusals_answer_before_torch_loads():
    changes = [c for c, _ in REFUSALS]
    proc = subprocess.run([sys.executable, "-c", NO_TORCH.format(changes=changes)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", (proc.stdout, proc.stderr[-2000:])


def test_a_multi_process_world_is_refused_at_set_up():
    first_of_two = LocalCommunicator(8)  # rank 0 of a world of two hosts the first block of 4 clients
    first_of_two.client_ids = [0, 1, 2, 3]

    topo = topologies.build("ring", 8)
    with pytest.raises(ConfigError, match="hosts 4 of the 8 clients .a torchrun world of several processes., which is "
                                          "not supported"):
        ByzantineGossip(Gossip(topo, first_of_two, torch.float32, CPU), threat("ipm", None), torch.zeros(8, 3))


# ------------------------------------------------------------------------------------------------ host syncs
SMALL = Config(clients=8, model="mlp", model_options={"hidden": [16]}, dataset="mnist1d",
               dataset_options={"num_samples": 600}, batch_size=8, eval_every=1, seed=0, train_eval_samples=50)


@pytest.mark.parametrize("attack,aggregator", [("alie", "mean"), ("alie", "clipped-gossip"), ("sign-flip", "median"),
                                               ("gaussian", "trimmed-mean")])
def test_no_host_sync_per_gossip_step(attack, aggregator):
    """D-PSGD gossips after every local step: a round of 6 steps reads back and uploads what one of 2 steps does."""
    from benchmarks.host_syncs import per_local_step

    counts = per_local_step(SMALL.replace(algorithm="dpsgd", topology="ring", byzantine=2, attack=attack,
                                          aggregator=aggregator))
    assert counts["syncs_per_local_step"] == 0 and counts["uploads_per_local_step"] == 0, counts
