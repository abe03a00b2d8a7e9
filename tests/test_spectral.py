"""Spectral analysis against closed forms (docs/concepts/gossip.md#the-spectral-gap,
docs/concepts/topologies.md#spectral-facts)."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest

import topologies
from topologies import (
    build,
    consensus_steps,
    effective_neighbors,
    gossip_lambda,
    phi,
    second_eigenvalue,
    spectral_gap,
)


def J(n):
    return np.full((n, n), 1.0 / n)


# --- closed forms of lambda -------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [8, 9, 12, 16, 32, 64])
def test_ring_lambda(n):
    assert build("ring", n).second_eigenvalue() == pytest.approx(1 / 3 + 2 / 3 * math.cos(2 * math.pi / n),
                                                                 abs=1e-12)


@pytest.mark.parametrize("s", [3, 4, 5, 8])
@pytest.mark.parametrize("weights", ["uniform", "metropolis"])
def test_torus_lambda(s, weights):
    topo = build("grid", s * s, weights=weights, periodic=True)
    assert np.allclose(topo.W[topo.W > 0], 0.2)  # 1/5 on the diagonal and on each of the 4 edges
    assert topo.second_eigenvalue() == pytest.approx(3 / 5 + 2 / 5 * math.cos(2 * math.pi / s), abs=1e-12)


def test_open_grid_metropolis_values():
    assert build("grid", 25).second_eigenvalue() == pytest.approx(0.916, abs=5e-4)
    assert build("grid", 64).second_eigenvalue() == pytest.approx(0.968, abs=5e-4)


@pytest.mark.parametrize("d", [1, 3, 4, 5, 6])
def test_hypercube_lambda(d):
    assert build("hypercube", 2**d, weights="uniform").second_eigenvalue() == pytest.approx((d - 1) / (d + 1),
                                                                                            abs=1e-12)


@pytest.mark.parametrize("n", [8, 12, 16, 20, 32, 64])
def test_static_exponential_lambda_even_n(n):
    tau = math.ceil(math.log2(n))
    topo = build("exponential", n)
    assert np.allclose(topo.W[topo.W > 0], 1 / (tau + 1))
    assert topo.second_eigenvalue() == pytest.approx(1 - 2 / (1 + tau), abs=1e-12)


def test_static_exponential_odd_n_is_smaller():
    assert build("exponential", 9).second_eigenvalue() == pytest.approx(0.442, abs=5e-4)


@pytest.mark.parametrize("n", [5, 10, 20])
def test_star_metropolis_lambda(n):
    assert build("star", n).second_eigenvalue() == pytest.approx(1 - 1 / n, abs=1e-12)


def test_complete_graph_lambda_is_zero():
    assert second_eigenvalue(build("full", 16).W) == 0.0
    assert spectral_gap(J(7)) == 1.0


def test_lazy_halves_the_gap_on_the_ring():
    lam = build("ring", 8).second_eigenvalue()
    assert lam == pytest.approx(0.805, abs=5e-4)
    assert build("ring", 8, weights="lazy").second_eigenvalue() == pytest.approx((1 + lam) / 2, abs=1e-12)


def test_second_eigenvalue_of_nonsymmetric_is_largest_singular_value():
    W = build("exponential", 12).W
    assert not np.allclose(W, W.T)
    assert second_eigenvalue(W) == pytest.approx(np.linalg.svd(W - J(12), compute_uv=False)[0], abs=1e-12)


# --- time-varying -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4, 8, 16, 32])
def test_one_peer_exponential_is_exact_after_tau_steps(n):
    topo = build("one-peer-exponential", n)
    assert topo.period == int(math.log2(n))
    assert np.allclose(topo.period_matrix(), J(n), atol=1e-14)
    assert topo.gossip_lambda(topo.period) == 0.0
    assert topo.consensus_steps(0.1) == topo.period


def test_one_peer_exponential_not_exact_for_n12():
    topo = build("one-peer-exponential", 12)
    assert topo.period == 4
    assert topo.gossip_lambda(4) == pytest.approx(0.209, abs=1e-3)
    assert topo.second_eigenvalue() == pytest.approx(topo.gossip_lambda(4) ** 0.25, abs=1e-12)


def test_single_one_peer_step_does_not_contract():
    topo = build("one-peer-exponential", 16)
    assert second_eigenvalue(topo.matrix(1)) == pytest.approx(1.0, abs=1e-12)  # hop 2: lambda = 1


def test_gossip_lambda_of_time_varying_is_norm_of_product():
    topo = build("random-k", 10, k=2, seed=3)
    P = topo.matrix(2) @ topo.matrix(1) @ topo.matrix(0)
    assert gossip_lambda(topo, 3) == pytest.approx(np.linalg.norm(P - J(10), 2), abs=1e-12)


# --- Q gossip steps ----------------------------------------------------------------------------------------

def test_lambda_of_W_power_Q_is_lambda_power_Q():
    W = build("ring", 16).W
    explicit = np.linalg.norm(np.linalg.matrix_power(W, 3) - J(16), 2)
    assert explicit == pytest.approx(0.85535, abs=1e-5)
    assert gossip_lambda(W, 3) == pytest.approx(explicit, abs=1e-12)
    assert gossip_lambda(W, 3) == pytest.approx(second_eigenvalue(W) ** 3, abs=1e-12)
    assert build("ring", 16).gossip_lambda(3) == pytest.approx(explicit, abs=1e-12)


def test_gossip_lambda_nonsymmetric_uses_matrix_power():
    W = build("exponential", 10).W
    explicit = np.linalg.norm(np.linalg.matrix_power(W, 2) - J(10), 2)
    assert gossip_lambda(W, 2) == pytest.approx(explicit, abs=1e-12)
    assert gossip_lambda(build("exponential", 10), 2) == pytest.approx(explicit, abs=1e-12)


def test_consensus_steps():
    ring16 = build("ring", 16)
    lam = ring16.second_eigenvalue()
    assert consensus_steps(ring16.W, 0.1) == math.ceil(math.log(10) / math.log(1 / lam)) == 45
    assert ring16.consensus_steps(0.1) == 45
    assert lam ** 45 <= 0.1 < lam**44
    lam64 = 1 / 3 + 2 / 3 * math.cos(2 * math.pi / 64)  # Metropolis ring: 1/3 + 2/3 cos(2 pi / n)
    steps64 = math.ceil(math.log(0.1) / math.log(lam64))
    assert lam64**steps64 <= 0.1 < lam64 ** (steps64 - 1)
    assert consensus_steps(build("ring", 64).W, 0.1) == steps64
    assert consensus_steps(J(5), 0.1) == 0
    assert consensus_steps(np.eye(3), 0.1) == math.inf
    # eps = lambda^2 exactly: 2 steps, not 3 from round-off
    assert consensus_steps(build("hypercube", 8, weights="uniform").W, 0.25) == 2


# --- Phi of DFedSAM-MGS ------------------------------------------------------------------------------------

def test_phi_formula():
    lam, m, Q = 0.9, 10, 2
    expected = (lam**Q + 1) / ((1 - lam) ** 2 * m ** (2 * (Q - 1))) + (lam**Q + 1) / (1 - lam**Q) ** 2
    assert phi(lam, m, Q) == pytest.approx(expected, rel=1e-12)
    assert phi(0.0, 5, 1) == 2.0
    assert phi(1.0, 5, 3) == math.inf
    assert phi(0.5, 4, 3) < phi(0.5, 4, 1)  # more gossip steps shrink the bound


# --- effective number of neighbours (Vogels et al. 2022) -------------------------------------------------

def _brute_force_neighbors(Ws, gamma, iters=4000):
    """Iterate S <- gamma W S W^T + W W^T through the schedule to stationarity; average over phases."""
    n = len(Ws[0])
    S = np.zeros((n, n))
    for _ in range(iters):
        for W in Ws:
            S = gamma * W @ S @ W.T + W @ W.T
    variances = []
    for W in Ws:
        variances.append(np.trace(S) / n)
        S = gamma * W @ S @ W.T + W @ W.T
    return 1.0 / ((1 - gamma) * np.mean(variances))


def test_effective_neighbors_limits():
    assert effective_neighbors(J(12), 0.951) == pytest.approx(12, rel=1e-12)
    assert build("full", 12).effective_neighbors(0.5) == pytest.approx(12, rel=1e-12)
    assert build("ring", 1).effective_neighbors(0.951) == pytest.approx(1.0, rel=1e-12)
    assert effective_neighbors(np.eye(6), 0.9) == pytest.approx(1.0, rel=1e-12)
    W = build("grid", 12).W
    assert effective_neighbors(W, 0.0) == pytest.approx(12 / np.linalg.norm(W) ** 2, rel=1e-12)
    hypercube = build("hypercube", 16, weights="uniform").W
    assert effective_neighbors(hypercube, 0.0) == pytest.approx(5, rel=1e-12)  # d + 1
    # gamma -> 1: every connected graph tends to n
    assert effective_neighbors(build("hypercube", 16).W, 0.999999) == pytest.approx(16, rel=1e-3)


def test_effective_neighbors_paper_values_n32():
    values = {
        "ring": build("ring", 32).effective_neighbors(0.951),
        "torus": build("grid", 32, shape=(4, 8), periodic=True).effective_neighbors(0.951),
        "hypercube": build("hypercube", 32).effective_neighbors(0.951),
        "exponential": build("exponential", 32).effective_neighbors(0.951),
    }
    expected = {"ring": 8.9, "torus": 20.6, "hypercube": 24.3, "exponential": 24.9}
    for key, value in values.items():
        assert value == pytest.approx(expected[key], abs=0.05), key


def test_effective_neighbors_symmetric_closed_form_matches_recursion():
    W = build("grid", 9).W
    assert effective_neighbors(W, 0.8) == pytest.approx(_brute_force_neighbors([W], 0.8), rel=1e-9)


def test_effective_neighbors_nonsymmetric_lyapunov_matches_recursion():
    W = build("exponential", 10).W
    assert effective_neighbors(W, 0.7) == pytest.approx(_brute_force_neighbors([W], 0.7), rel=1e-9)


def test_effective_neighbors_periodic_schedule():
    topo = build("one-peer-exponential", 12)
    Ws = [topo.matrix(t) for t in range(topo.period)]
    assert effective_neighbors(Ws, 0.6) == pytest.approx(_brute_force_neighbors(Ws, 0.6, 600), rel=1e-9)
    assert topo.effective_neighbors(0.6) == pytest.approx(effective_neighbors(Ws, 0.6), rel=1e-12)
    W = build("ring", 8).W
    assert effective_neighbors([W, W], 0.9) == pytest.approx(effective_neighbors(W, 0.9), rel=1e-9)


# --- fastest-mixing weights --------------------------------------------------------------------------------

def test_fastest_matches_known_optima():
    ring = build("ring", 16, weights="fastest")
    optimum = 4 / (3 - math.cos(math.pi / 8)) - 1  # uniform edge weight balancing lambda_2 and lambda_n
    assert optimum == pytest.approx(0.9267, abs=1e-4)
    assert ring.second_eigenvalue() == pytest.approx(optimum, abs=1e-3)
    assert build("grid", 25, weights="fastest").second_eigenvalue() == pytest.approx(0.8868, abs=1e-3)
    assert build("star", 10, weights="fastest").second_eigenvalue() == pytest.approx(8 / 9, abs=1e-3)


@pytest.mark.parametrize("name, options", [("erdos-renyi", {"n": 14, "p": 0.35, "seed": 2}),
                                           ("grid", {"n": 12}), ("star", {"n": 7}), ("ring", {"n": 2})])
def test_fastest_never_worse_than_metropolis(name, options):
    options = dict(options)
    n = options.pop("n")
    fast = build(name, n, weights="fastest", **options)
    mh = build(name, n, **options)
    assert fast.second_eigenvalue() <= mh.second_eigenvalue() + 1e-12
    W = fast.W
    assert np.allclose(W, W.T) and W.min() >= -1e-12
    assert np.allclose(W.sum(axis=0), 1) and np.allclose(W.sum(axis=1), 1)
    assert set(zip(*np.nonzero(W * (1 - np.eye(n))))) <= set(zip(*np.nonzero(mh.W * (1 - np.eye(n)))))


def test_fastest_is_deterministic():
    G = nx.erdos_renyi_graph(12, 0.4, seed=5)
    a = build("custom", None, weights="fastest", graph=G).W
    b = build("custom", None, weights="fastest", graph=G).W
    assert np.array_equal(a, b)


# --- bad input ---------------------------------------------------------------------------------------------

def test_spectral_bad_input():
    W = build("ring", 6).W
    with pytest.raises(ValueError, match="Q \\(gossip steps\\) must be an integer >= 1"):
        gossip_lambda(W, 0)
    with pytest.raises(ValueError, match="gamma must be a number with 0 <= gamma < 1"):
        effective_neighbors(W, 1.0)
    with pytest.raises(ValueError, match="eps must be a number with 0 < eps < 1"):
        consensus_steps(W, 0.0)
    with pytest.raises(ValueError, match="must be a square"):
        second_eigenvalue(np.ones((2, 3)))
    with pytest.raises(ValueError, match="m \\(number of clients\\) must be an integer >= 1"):
        phi(0.5, 0, 1)
    with pytest.raises(ValueError, match="lam must be in \\[0, 1\\]"):
        phi(1.5, 4, 1)
    with pytest.raises(ValueError, match="same shape"):
        effective_neighbors([np.eye(2), np.eye(3)], 0.5)
    topo = build("random-k", 6, k=1)
    with pytest.raises(ValueError, match="no period"):
        topo.second_eigenvalue()
    with pytest.raises(ValueError, match="no period"):
        topo.effective_neighbors(0.9)


def test_public_names():
    assert set(topologies.__all__) >= {"build", "Topology", "second_eigenvalue", "spectral_gap",
                                       "gossip_lambda", "phi", "effective_neighbors", "consensus_steps"}
