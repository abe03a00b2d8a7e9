"""Sparse-first topologies: CSR step matrices, large-n spectral paths (FFT, Lanczos), dense limits."""

from __future__ import annotations

import math
import tracemalloc

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

import topologies
from topologies import build, graphs, measures, schedules, spectral
from topologies.validation import check_gossip_matrix, check_stochastic

# --- reference: the dense construction the package used before it went sparse --------------------------------


def ref_adjacency(G):
    A = nx.to_numpy_array(G, nodelist=range(len(G)), weight=None, dtype=np.float64).T
    np.fill_diagonal(A, 0.0)
    return A


def ref_with_diagonal(W):
    W[np.diag_indices_from(W)] = 1.0 - W.sum(axis=1)
    return W


def ref_weights(G, scheme, base=None):
    """Dense weights exactly as computed before (numpy row sums for the diagonal)."""
    A = ref_adjacency(G)
    deg = A.sum(axis=1)
    if scheme == "lazy":
        return 0.5 * (np.eye(len(A)) + ref_weights(G, base or "metropolis"))
    if G.is_directed():
        if scheme == "max-degree":
            return ref_with_diagonal(A / (1.0 + deg.max()))
        return ref_with_diagonal(A / (deg[0] + 1.0))
    if scheme == "metropolis":
        return ref_with_diagonal(A / (1.0 + np.maximum.outer(deg, deg)))
    if scheme == "uniform":
        return ref_with_diagonal(A / (deg[:, None] + 1.0))
    return ref_with_diagonal(A / (1.0 + deg.max()))


def relabel(G):
    return nx.convert_node_labels_to_integers(G, ordering="sorted")


def ref_graph(name, n, options):
    """The graphs from networkx's own generators (independent of topologies.graphs)."""
    if name == "ring":
        return nx.cycle_graph(n)
    if name == "grid":
        r, c = graphs.grid_shape(n)
        return relabel(nx.grid_2d_graph(r, c, periodic=options.get("periodic", False)))
    if name == "exponential":
        hops = [2**k for k in range(math.ceil(math.log2(n)))]
        if options.get("symmetric"):
            return nx.circulant_graph(n, hops)
        return nx.DiGraph([(i, (i + h) % n) for i in range(n) for h in hops])
    if name == "star":
        return nx.star_graph(n - 1)
    if name == "hypercube":
        return relabel(nx.hypercube_graph(int(math.log2(n))))
    if name == "random-regular":
        return relabel(nx.random_regular_graph(options["degree"], n, seed=options.get("seed", 0)))
    if name == "erdos-renyi":
        return nx.erdos_renyi_graph(n, options["p"], seed=options.get("seed", 0))
    raise AssertionError(name)


def ref_random_k_graph(n, k, seed, step):
    """random-k's original definition: node by node, rng.choice without replacement."""
    rng = np.random.default_rng([seed, step])
    G = nx.Graph()
    G.add_nodes_from(range(n))
    for i in range(n):
        for j in rng.choice(n - 1, size=k, replace=False):
            G.add_edge(i, int(j) + (j >= i))
    return G


def assert_same_matrix(S, ref):
    """Same pattern and off-diagonal values bit for bit; the diagonal 1 - (row sum) to round-off.

    The diagonal is now summed in column order over the stored entries, the old dense code summed whole rows
    with numpy's pairwise summation: the two may differ in the last bits (<= 4e-16 seen).
    """
    assert isinstance(S, sp.csr_array) and S.dtype == np.float64 and S.has_canonical_format
    assert np.all(S.data != 0)  # no stored zeros: the pattern is the support
    D = S.toarray()
    assert np.array_equal(D != 0, ref != 0)
    off = ~np.eye(len(ref), dtype=bool)
    assert np.array_equal(D[off], ref[off])
    np.testing.assert_allclose(np.diag(D), np.diag(ref), rtol=0, atol=1e-15)


STATIC_CASES = [("ring", {}), ("grid", {}), ("grid", {"periodic": True}), ("exponential", {}),
                ("exponential", {"symmetric": True}), ("star", {}), ("hypercube", {}),
                ("random-regular", {"degree": 4, "seed": 1}), ("erdos-renyi", {"p": 0.5, "seed": 2})]


@pytest.mark.parametrize("n", [8, 9, 16, 25])
@pytest.mark.parametrize("name, options", STATIC_CASES)
@pytest.mark.parametrize("scheme", ["metropolis", "uniform", "max-degree", "lazy"])
def test_static_sparse_equals_dense_reference(name, options, scheme, n):
    if name == "hypercube" and n & (n - 1):  # no hypercube on n nodes: refused, naming the rule
        with pytest.raises(ValueError, match=f"hypercube needs n to be a power of 2 .*got n = {n}"):
            build(name, n, scheme, **options)
        return
    G = ref_graph(name, n, options)
    try:
        topo = build(name, n, scheme, **options)
    except ValueError as exc:  # uniform on irregular graphs, bipartite graphs that do not contract
        assert "irregular" in str(exc) or "does not contract" in str(exc)
        return
    ref = ref_weights(G, scheme)
    assert_same_matrix(topo.sparse(), ref)
    assert topo.sparse(3) is topo.sparse()  # cached, one matrix for every step
    np.testing.assert_array_equal(topo.W, topo.sparse().toarray())
    assert topo.degrees().tolist() == [G.out_degree(v) if G.is_directed() else G.degree(v) for v in range(n)]
    assert topo.out_degrees().tolist() == topo.degrees().tolist()


def test_fastest_weights_are_unchanged():
    topo = build("grid", 9, weights="fastest")
    assert isinstance(topo.graph, nx.Graph) and topo.graph.number_of_edges() == 12
    np.testing.assert_array_equal(topo.W, topo.sparse().toarray())
    with pytest.raises(ValueError, match="weights 'fastest' .* n <= 2000 clients, got n = 2001: use "
                                         "weights='metropolis'"):
        build("ring", 2001, weights="fastest")


@pytest.mark.parametrize("n", [8, 9, 12, 16])
@pytest.mark.parametrize("scheme", ["metropolis", "uniform", "max-degree", "lazy"])
def test_one_peer_sparse_steps(n, scheme):
    topo = build("one-peer-exponential", n, scheme)
    tau = topo.period
    for step in range(2 * tau + 1):
        hop = 2 ** (step % tau)
        P = np.roll(np.eye(n), hop, axis=0)
        W = (np.eye(n) + P) / 2
        expected = (np.eye(n) + W) / 2 if scheme == "lazy" else W
        assert np.array_equal(topo.sparse(step).toarray(), expected)
        assert topo.sparse(step) is topo.sparse(step + tau)  # cached per step mod period
        assert topo.neighbors(0, step) == [(-hop) % n] and topo.out_degrees(step).tolist() == [1] * n


@pytest.mark.parametrize("scheme", ["metropolis", "max-degree", "lazy"])
def test_random_k_sparse_steps_keep_the_original_draws(scheme):
    n, k, seed = 16, 2, 7
    topo = build("random-k", n, scheme, k=k, seed=seed)
    for step in (4, 0, 1, 9):
        G = ref_random_k_graph(n, k, seed, step)
        assert_same_matrix(topo.sparse(step), ref_weights(G, scheme))
        assert topo.neighbors(3, step) == sorted(G.neighbors(3))
        assert set(topo.graph_at(step).edges()) == {tuple(sorted(e)) for e in G.edges()}


def test_random_k_vectorised_draws(monkeypatch):
    monkeypatch.setattr(schedules, "RANDOM_K_LOOP_LIMIT", 10)
    n, k = 40, 5
    schedule = schedules.RandomK(n, k=k, seed=3)
    counts = np.zeros(n)
    for step in range(60):
        peers = schedule.peers(step)
        assert peers.shape == (n, k)
        assert all(len(set(row)) == k for row in peers.tolist())  # distinct
        assert not np.any(peers == np.arange(n)[:, None]) and peers.min() >= 0 and peers.max() < n
        counts += np.bincount(peers.ravel(), minlength=n)
    assert counts.min() > 0.6 * counts.mean() and counts.max() < 1.4 * counts.mean()  # roughly uniform
    again = schedules.RandomK(n, k=k, seed=3)
    assert np.array_equal(again.peers(17), schedule.peers(17))  # depends on (seed, step) only
    assert not np.array_equal(schedules.RandomK(n, k=k, seed=4).peers(17), schedule.peers(17))
    topo = build("random-k", n, k=k, seed=3)
    W = topo.sparse(5)
    assert (W != W.T).nnz == 0 and np.allclose(W.sum(axis=1), 1) and topo.out_degrees(5).min() >= k


def test_full_is_described_by_averaging():
    small = build("full", 7)
    assert small.averaging == 0.0 and small.second_eigenvalue() == 0.0
    assert np.array_equal(small.sparse().toarray(), np.full((7, 7), 1 / 7))
    assert build("full", 7, weights="lazy").averaging == 0.5
    assert build("ring", 7).averaging is None and build("one-peer-exponential", 8).averaging is None
    assert build("custom", None, matrix=np.full((3, 3), 1 / 3)).averaging is None


def test_full_at_100k_allocates_nothing_large():
    n = 100_000
    tracemalloc.start()
    try:
        topo = build("full", n)
        values = (topo.second_eigenvalue(), topo.gossip_lambda(3), topo.consensus_steps(0.1),
                  topo.effective_neighbors(0.9), topo.neighbors(5)[:3], topo.degrees()[:2].tolist())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20  # an n x n matrix would be 80 GB
    assert topo.averaging == 0.0
    assert values == (0.0, 0.0, 0, pytest.approx(n), [0, 1, 2], [n - 1, n - 1])
    with pytest.raises(ValueError, match="dense matrix \\(n\\^2 = 10000000000 nonzeros.*use Topology.averaging"):
        topo.sparse()
    refused = "n = 100000 clients, above topologies.limits.DENSE_LIMIT = 20000.*sparse\\(step\\)"
    with pytest.raises(ValueError, match=refused):
        _ = topo.W
    lazy = build("full", n, weights="lazy")
    assert lazy.averaging == 0.5 and lazy.second_eigenvalue() == 0.5 and lazy.gossip_lambda(2) == 0.25


def test_dense_matrices_refused_above_dense_limit(monkeypatch):
    monkeypatch.setattr(topologies.limits, "DENSE_LIMIT", 50)
    ring = build("ring", 51)
    with pytest.raises(ValueError, match="ring has n = 51 clients, above topologies.limits.DENSE_LIMIT = 50: .*use "
                                         "sparse\\(step\\)"):
        ring.matrix(0)
    with pytest.raises(ValueError, match="DENSE_LIMIT"):
        _ = ring.W
    with pytest.raises(ValueError, match="DENSE_LIMIT"):
        build("one-peer-exponential", 64).matrix(3)
    assert ring.sparse().shape == (51, 51) and build("ring", 50).W.shape == (50, 50)


# --- validation on sparse input ------------------------------------------------------------------------------

BAD = [
    (np.array([[1.0, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0.8, 0.2], [0, 0, 0, 0, 1]]), False),
    (np.diag([1.0, 0.9]), False),
    (np.array([[1.5, -0.5], [-0.5, 1.5]]), False),
    (np.array([[0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]]), True),
    (np.array([[np.nan]]), True),
    (np.array([[1.0, np.inf], [0.0, 1.0]]), False),
]


@pytest.mark.parametrize("W, symmetric", BAD)
def test_validation_messages_are_the_same_on_sparse_input(W, symmetric):
    with pytest.raises(ValueError) as dense:
        check_stochastic(W, symmetric=symmetric)
    with pytest.raises(ValueError) as sparse:
        check_stochastic(sp.csr_array(W), symmetric=symmetric)
    assert str(sparse.value) == str(dense.value)


def test_gossip_matrix_checks_on_sparse_input():
    for W, pattern in [(np.eye(2), "W is disconnected: its graph has 2"),
                       (np.array([[0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0]]),
                        "does not contract: lambda = .* = 1")]:
        for given in (W, sp.csr_array(W)):
            with pytest.raises(ValueError, match=pattern):
                check_gossip_matrix(given, symmetric=True)
    W = build("ring", 6).sparse()
    assert check_gossip_matrix(W, symmetric=True) is not None
    topo = build("custom", None, matrix=sp.csr_array(build("exponential", 12).W))
    assert topo.graph.is_directed() and topo.neighbors(0) == [4, 8, 10, 11]


# --- circulant spectra (FFT) ---------------------------------------------------------------------------------

def test_circulant_detection():
    assert spectral.circulant_row(build("ring", 10).sparse()) is not None
    assert spectral.circulant_row(build("exponential", 12).sparse()) is not None
    assert spectral.circulant_row(build("exponential", 12, symmetric=True).sparse()) is not None
    assert spectral.circulant_row(build("one-peer-exponential", 12).sparse(2)) is not None
    assert spectral.circulant_row(build("star", 10).sparse()) is None
    assert spectral.circulant_row(build("grid", 12).sparse()) is None
    assert spectral.circulant_row(build("grid", 16, periodic=True).sparse()) is None  # a Kronecker sum
    c = spectral.circulant_row(build("exponential", 12).sparse())
    assert c[0] == pytest.approx(1 / 5) and c[-1] == pytest.approx(1 / 5) and c[1] == 0  # 0 receives from -1


@pytest.mark.parametrize("name, options", [("ring", {}), ("exponential", {}), ("exponential", {"symmetric": True}),
                                           ("ring", {"weights": "lazy"})])
def test_fft_path_equals_dense_path(name, options):
    for n in (64, 75):
        W = build(name, n, **options).sparse()
        dense = spectral.product_lambda([W], "dense")
        assert spectral.product_lambda([W], "circulant") == pytest.approx(dense, abs=1e-13)
        assert spectral.product_lambda([W] * 3, "circulant") == pytest.approx(
            spectral.product_lambda([W] * 3, "dense"), abs=1e-13)


def test_ring_closed_form_at_100k():
    n = 100_000
    ring = build("ring", n)
    lam = (1 + 2 * math.cos(2 * math.pi / n)) / 3
    assert ring.second_eigenvalue() == pytest.approx(lam, abs=1e-14)
    assert ring.spectral_gap() == pytest.approx(1 - lam, rel=1e-5)  # ~ 4 pi^2 / (3 n^2)
    assert ring.gossip_lambda(4) == pytest.approx(lam**4, abs=1e-13)
    assert ring.phi(2) == pytest.approx(spectral.phi(lam, n, 2), rel=1e-4)
    assert ring.degrees().tolist()[:3] == [2, 2, 2] and ring.neighbors(0) == [1, n - 1]
    assert ring.consensus_steps(0.1) == spectral.consensus_steps_for(ring.second_eigenvalue(), 0.1)


def test_exponential_closed_form_at_100k():
    n = 100_000  # even n: lambda = 1 - 2/(1 + tau), tau = 17
    topo = build("exponential", n)
    assert topo.second_eigenvalue() == pytest.approx(1 - 2 / 18, abs=1e-13)
    assert topo.gossip_lambda(2) == pytest.approx(topo.second_eigenvalue() ** 2, abs=1e-13)  # normal W
    assert topo.out_degrees().tolist()[:2] == [17, 17]


def test_one_peer_exponential_is_exact_at_2_to_17():
    n = 2**17
    topo = build("one-peer-exponential", n)
    assert topo.period == 17 and topo.second_eigenvalue() == 0.0
    assert topo.gossip_lambda(17) == 0.0 and topo.gossip_lambda(16) > 0.4
    assert topo.consensus_steps(0.1) == 17


@pytest.mark.parametrize("name, options", [("ring", {}), ("ring", {"weights": "lazy"}), ("exponential", {}),
                                           ("exponential", {"symmetric": True}), ("one-peer-exponential", {}),
                                           ("one-peer-exponential", {"weights": "lazy"})])
def test_random_start_steps_by_fft_count_what_the_simulation_counts(name, options):
    """A circulant schedule's steps(x0) from its Fourier form (one FFT, a binary search) equal the steps applied one
    by one, converged or not within RANDOM_START_LIMIT."""
    for n in (2, 5, 16, 24, 31, 64, 75):
        topo = build(name, n, **options)
        period = topo.period if topo.is_time_varying else 1
        assert spectral.circulant_spectra([topo.sparse(t) for t in range(period)]) is not None
        for eps, seed in ((0.5, 0), (1e-3, 0), (1e-3, 1), (1e-6, 2)):
            assert measures.random_start_steps(topo, eps, seed) == \
                measures.random_start_steps(topo, eps, seed, method="simulate"), (n, eps, seed)
    tie = build("ring", 2, weights="lazy")  # one step leaves exactly half the disagreement: eps = 0.5 is a tie
    X = np.random.default_rng(0).standard_normal((2, measures.RANDOM_START_COLUMNS))
    assert spectral.circulant_disagreement_steps(spectral.circulant_spectra([tie.sparse(0)]), X, 0.5, 10) is None
    limited = build("ring", 75)  # ~4,000 steps to 1e-6: not within 1,000
    assert measures.random_start_steps(limited, 1e-6) < measures.RANDOM_START_LIMIT
    assert measures.random_start_steps(build("ring", 100_000), 1e-3) == math.inf  # gap 1.3e-9: far from 1e-3


# --- large-n paths against the dense ones (threshold lowered) -------------------------------------------------

@pytest.fixture
def low_limit(monkeypatch):
    monkeypatch.setattr(topologies.limits, "DENSE_SPECTRAL_LIMIT", 100)


def dense_values(topo, Qs=(1, 2, 5)):
    values = {"gossip": [topo.gossip_lambda(Q) for Q in Qs]}
    if topo.period is not None:
        values.update(lam=topo.second_eigenvalue(), nw=topo.effective_neighbors(0.8),
                      steps=topo.consensus_steps(0.1))
    return values


@pytest.mark.parametrize("name, n, options", [
    ("one-peer-exponential", 140, {}), ("one-peer-exponential", 128, {"weights": "lazy"}),
    ("exponential", 150, {}), ("exponential", 129, {"symmetric": True}), ("ring", 151, {})])
def test_circulant_large_paths_match_dense(monkeypatch, name, n, options):
    expected = dense_values(build(name, n, **options))
    monkeypatch.setattr(topologies.limits, "DENSE_SPECTRAL_LIMIT", 100)
    got = dense_values(build(name, n, **options))
    assert got["gossip"] == pytest.approx(expected["gossip"], abs=1e-12)
    assert got["lam"] == pytest.approx(expected["lam"], abs=1e-12)
    assert got["nw"] == pytest.approx(expected["nw"], rel=1e-9)
    assert got["steps"] == expected["steps"]


@pytest.mark.parametrize("name, n, options", [("random-regular", 500, {"degree": 4}), ("star", 300, {}),
                                              ("grid", 300, {}), ("grid", 324, {"periodic": True})])
def test_lanczos_matches_dense_eigensolver(monkeypatch, name, n, options):
    W = build(name, n, **options).sparse()
    dense = spectral.product_lambda([W], "dense")
    assert spectral.product_lambda([W], "iterative") == pytest.approx(dense, abs=1e-9)
    monkeypatch.setattr(topologies.limits, "DENSE_SPECTRAL_LIMIT", 100)
    topo = build(name, n, **options)
    assert topo.second_eigenvalue() == pytest.approx(dense, abs=1e-9)
    assert topo.gossip_lambda(3) == pytest.approx(dense**3, abs=1e-9)


def test_lanczos_on_products_and_nonsymmetric(monkeypatch):
    rk = build("random-k", 300, k=2, seed=1)
    steps = [rk.sparse(t) for t in range(3)]
    assert spectral.product_lambda(steps, "iterative") == pytest.approx(spectral.product_lambda(steps, "dense"),
                                                                       abs=1e-9)
    expected = rk.gossip_lambda(3)
    exp = build("exponential", 200).sparse()  # circulant, but the Lanczos path must agree too
    assert spectral.product_lambda([exp, exp], "iterative") == pytest.approx(
        spectral.product_lambda([exp, exp], "dense"), abs=1e-9)
    monkeypatch.setattr(topologies.limits, "DENSE_SPECTRAL_LIMIT", 100)
    assert build("random-k", 300, k=2, seed=1).gossip_lambda(3) == pytest.approx(expected, abs=1e-9)
    one_step_disconnected = build("random-k", 300, k=1, seed=0)
    assert one_step_disconnected.gossip_lambda(1) == 1.0  # 1-out graphs fall apart: exactly 1, no iterations


def test_lanczos_that_does_not_converge_raises():
    W = build("ring", 1000).sparse()
    with pytest.raises(ValueError, match="did not converge in 30 iterations"):
        spectral.iterative_lambda([W], maxiter=30)


def test_dense_only_quantities_refuse_large_n(low_limit):
    topo = build("random-k", 150, k=2)
    with pytest.raises(ValueError, match="consensus_steps of the time-varying random-k .* "
                                         "topologies.limits.DENSE_SPECTRAL_LIMIT = 100"):
        topo.consensus_steps(0.1)
    with pytest.raises(ValueError, match="effective_neighbors needs dense .* n = 150 > topologies.limits.DENSE_SPEC"):
        build("star", 150).effective_neighbors(0.9)
    assert build("full", 150).effective_neighbors(0.5) == pytest.approx(150)


def test_module_functions_take_sparse_matrices(low_limit):
    W = build("ring", 128).sparse()
    lam = (1 + 2 * math.cos(2 * math.pi / 128)) / 3
    assert topologies.second_eigenvalue(W) == pytest.approx(lam, abs=1e-13)
    assert topologies.spectral_gap(W) == pytest.approx(1 - lam, abs=1e-13)
    assert topologies.gossip_lambda(W, 3) == pytest.approx(lam**3, abs=1e-13)
    assert topologies.consensus_steps(W, 0.1) == spectral.consensus_steps_for(lam, 0.1)
    eig2 = ((1 + 2 * np.cos(2 * np.pi * np.arange(128) / 128)) / 3) ** 2  # the ring's eigenvalues, squared
    closed_form = 128 / (0.1 * np.sum(eig2 / (1 - 0.9 * eig2)))
    assert topologies.effective_neighbors(W, 0.9) == pytest.approx(closed_form, rel=1e-12)
    assert topologies.effective_neighbors([W, W], 0.9) == pytest.approx(closed_form, rel=1e-12)


def test_random_k_step_cache_is_bounded(monkeypatch):
    from topologies import topology

    monkeypatch.setattr(topology, "_RANDOM_CACHE", 3)
    topo = build("random-k", 12, k=2, seed=5)
    first = topo.sparse(0)
    for step in range(1, 6):
        topo.sparse(step)
    assert topo.sparse(5) is topo.sparse(5) and topo.sparse(0) is not first  # step 0 was evicted, redrawn
    assert (topo.sparse(0) != first).nnz == 0  # ... identically
    assert len(topo._sparse_cache._items) == 3
