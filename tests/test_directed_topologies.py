"""Directed graphs and one-sided W: BlueFog's constructions, the DisPFL random topology, hierarchical
topologies, the row-/column-stochastic and sample-count schemes, and the spectral tools for non-symmetric W.

Every reference below is written from the convention it checks (BlueFog's topology_util semantics: a row of its
matrix is a sender, so dfl's W is its transpose; DisPFL's aggregation; push-sum's recursion), not from dfl's code.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import topologies
from topologies import directed
from topologies.validation import check_gossip_matrix, check_stochastic


def bluefog_circulant(x: np.ndarray) -> np.ndarray:
    """BlueFog's topology matrix from its first row: row i = roll(x, i), row = sender; as dfl's W (row = receiver)."""
    n = len(x)
    sender_rows = np.stack([np.roll(x / x.sum(), i) for i in range(n)])
    return sender_rows.T


# ------------------------------------------------------------------------------------------- BlueFog's graphs
@pytest.mark.parametrize("n", [3, 5, 8, 13])
def test_directed_ring_is_bluefogs_right_connected_ring(n):
    x = np.zeros(n)
    x[0] = x[1] = 0.5  # RingGraph(n, connect_style=2): i sends to i + 1 with 1/2, keeps 1/2
    topo = topologies.build("directed-ring", n)
    np.testing.assert_allclose(topo.W, bluefog_circulant(x), atol=1e-15)
    assert topo.stochastic == "doubly" and not topo.symmetric
    assert topo.second_eigenvalue() == pytest.approx(np.cos(np.pi / n), abs=1e-12)  # |1 + e^{2 pi i/n}|/2


@pytest.mark.parametrize("n,base", [(16, 2), (16, 4), (64, 4), (30, 3), (12, 4)])
def test_exponent_base_takes_bluefogs_powers(n, base):
    # ExponentialGraph(n, base): x[i] = 1 for i = 0 and every i < n that is a power of base
    powers = {base**k for k in range(n) if base**k < n}
    x = np.array([1.0 if i == 0 or i in powers else 0.0 for i in range(n)])
    topo = topologies.build("exponential", n, exponent_base=base)
    np.testing.assert_allclose(topo.W, bluefog_circulant(x), atol=1e-15)
    np.testing.assert_array_equal(topologies.build("exponential", n, exponent_base=2).W,
                                  topologies.build("exponential", n).W)


@pytest.mark.parametrize("centre", [0, 3, 9])
def test_star_centre_with_max_degree_weights_is_bluefogs_star(centre):
    n = 10
    bf = np.zeros((n, n))  # StarGraph(n, center_rank): its loop, as written
    for i in range(n):
        bf[i, i] = 1 - 1 / n
        bf[centre, i] = 1 / n
        bf[i, centre] = 1 / n
    topo = topologies.build("star", n, weights="max-degree", centre=centre)
    np.testing.assert_allclose(topo.W, bf.T, atol=1e-15)
    assert sorted(topo.graph.degree)[centre] == (centre, n - 1)
    with pytest.raises(ValueError, match="centre must be a client index in 0..9"):
        topologies.build("star", n, centre=10)


def bluefog_one_peer_sends(G: nx.Graph, step: int) -> dict[int, int]:
    """GetDynamicOnePeerSendRecvRanks: each rank's successors sorted clockwise, the (step mod degree)-th."""
    n = len(G)
    out = {}
    for rank in range(n):
        succ = G.successors(rank) if G.is_directed() else G.neighbors(rank)
        ranks = sorted((r for r in succ if r != rank), key=lambda r, rk=rank: r - rk if r >= rk else r - rk + n)
        out[rank] = ranks[step % len(ranks)]
    return out


@pytest.mark.parametrize("graph,options,n", [("star", {"centre": 2}, 7), ("grid", {}, 12), ("ring", {}, 9),
                                             ("exponential", {"exponent_base": 3}, 10),
                                             ("erdos-renyi", {"p": 0.4, "seed": 1}, 10)])
def test_one_peer_of_any_graph_follows_bluefogs_schedule(graph, options, n):
    base = topologies.build(graph, n, **options).graph
    topo = topologies.build("one-peer", n, weights="row-stochastic", graph=graph, graph_options=options)
    for step in range(7):
        sends = bluefog_one_peer_sends(base, step)
        expected = np.eye(n)
        for sender, receiver in sends.items():
            expected[receiver, sender] = 1.0
        expected /= expected.sum(axis=1, keepdims=True)  # each receiver averages itself and what it got
        np.testing.assert_allclose(topo.matrix(step), expected, atol=1e-15, err_msg=f"step {step}")
    degrees = [len(list(base.successors(i) if base.is_directed() else base.neighbors(i))) for i in range(n)]
    assert topo.period == np.lcm.reduce(degrees)


def test_one_peer_of_the_exponential_graph_is_the_one_peer_exponential_graph():
    for n in (8, 12, 17):
        a, b = topologies.build("one-peer", n), topologies.build("one-peer-exponential", n)
        assert a.period == b.period
        for step in range(2 * a.period):
            np.testing.assert_array_equal(a.matrix(step), b.matrix(step))
    with pytest.raises(ValueError, match="regular digraph"):  # a star's one-peer steps are not permutations
        topologies.build("one-peer", 8, graph="star")
    with pytest.raises(ValueError, match="unknown graph_options degree"):
        topologies.build("one-peer", 8, graph="ring", graph_options={"degree": 2})


# ------------------------------------------------------------------------------------------------ DisPFL random
def test_random_pull_is_dispfls_random_topology():
    n, k = 12, 3
    topo = topologies.build("random-pull", n, k=k, seed=4)
    assert topo.stochastic == "row" and topo.weights == "row-stochastic" and topo.period is None
    peers_k = topologies.build("random-k", n, k=k, seed=4)._schedule.peers
    for step in (0, 1, 7):
        W = topo.matrix(step)
        peers = peers_k(step)  # the same draws as random-k, kept directed
        expected = np.eye(n) / (k + 1)
        for i in range(n):
            assert i not in peers[i] and len(set(peers[i])) == k
            expected[i, peers[i]] = 1 / (k + 1)  # x_i <- (x_i + sum of its k pulls) / (k + 1)
        np.testing.assert_allclose(W, expected, atol=1e-15)
    assert not np.allclose(topo.matrix(0), topo.matrix(1))
    np.testing.assert_array_equal(topologies.build("random-pull", n, k=k, seed=4).matrix(9), topo.matrix(9))
    with pytest.raises(ValueError, match="random-pull .* supports weights row-stochastic"):
        topologies.build("random-pull", n, weights="metropolis", k=k)


# ------------------------------------------------------------------------------------------------- the schemes
def test_one_sided_and_sample_count_schemes():
    G = nx.DiGraph([(0, 1), (0, 2), (1, 2), (2, 0), (3, 0), (2, 3)])  # u -> v: u sends to v
    n = 4
    row = topologies.build("custom", None, weights="row-stochastic", graph=G).W
    col = topologies.build("custom", None, weights="column-stochastic", graph=G).W
    for i in range(n):
        senders = [u for u, v in G.edges if v == i]
        receivers = [v for u, v in G.edges if u == i]
        assert row[i, i] == pytest.approx(1 / (len(senders) + 1))
        for j in senders:
            assert row[i, j] == pytest.approx(1 / (len(senders) + 1))
            assert col[i, j] == pytest.approx(1 / (len(list(G.successors(j))) + 1))
        assert col[i, i] == pytest.approx(1 / (len(receivers) + 1))
    np.testing.assert_allclose(row.sum(axis=1), 1)
    np.testing.assert_allclose(col.sum(axis=0), 1)
    sizes = [10, 20, 30, 40, 50]
    W = topologies.build("ring", 5, weights="sample-count", sizes=sizes).W
    for i in range(5):
        hood = [i, (i - 1) % 5, (i + 1) % 5]
        for j in hood:
            assert W[i, j] == pytest.approx(sizes[j] / sum(sizes[h] for h in hood))
    with pytest.raises(ValueError, match="need the clients' sample counts"):
        topologies.build("ring", 5, weights="sample-count")
    with pytest.raises(ValueError, match="sizes must be 5 sample counts"):
        topologies.build("ring", 5, weights="sample-count", sizes=[1, 2])
    with pytest.raises(ValueError, match="applies to weights='sample-count' only"):
        topologies.build("ring", 5, sizes=sizes)


def test_custom_matrices_and_edge_lists_of_each_kind(tmp_path):
    P = np.roll(np.eye(5), 1, axis=1)
    row_W = 0.5 * np.eye(5) + 0.25 * P + 0.25 * np.diag([1, 1, 1, 1, 0]) @ P.T + np.diag([0, 0, 0, 0, 0.25])
    with pytest.raises(ValueError, match="not column-stochastic"):
        topologies.build("custom", None, matrix=row_W)  # doubly stochastic stays the default requirement
    topo = topologies.build("custom", None, matrix=row_W, stochastic="row")
    assert topo.stochastic == "row" and topo.weights == "given"
    with pytest.raises(ValueError, match="not row-stochastic"):
        topologies.build("custom", None, matrix=row_W.T, stochastic="row")
    assert topologies.build("custom", None, matrix=row_W.T, stochastic="column").stochastic == "column"
    with pytest.raises(ValueError, match="stochastic must be one of doubly, row, column"):
        topologies.build("custom", None, matrix=row_W, stochastic="left")
    with pytest.raises(ValueError, match="does not converge"):  # a directed ring without self-weight is periodic
        check_gossip_matrix(P, False, kind="column")
    assert check_stochastic(row_W, False, kind="row") is not None
    path = tmp_path / "edges.txt"
    path.write_text("0 1\n1 2\n2 0\n2 3\n3 0\n")
    topo = topologies.build("custom", None, weights="column-stochastic", edges=str(path), directed=True)
    assert topo.graph.is_directed() and topo.neighbors(0) == [2, 3] and topo.stochastic == "column"
    with pytest.raises(ValueError, match="directed= applies to an edge-list file"):
        topologies.build("custom", None, matrix=row_W, stochastic="row", directed=True)


# ------------------------------------------------------------------------------------------------ hierarchical
@pytest.mark.parametrize("inner,outer", [("full", "ring"), ("ring", "exponential"), ("full", "one-peer")])
def test_hierarchical_is_the_kronecker_product_and_mixes_as_its_slower_level(inner, outer):
    n, groups = 24, 4
    if outer == "one-peer":
        with pytest.raises(ValueError, match="option outer must be a static topology"):
            topologies.build("hierarchical", n, groups=groups, inner=inner, outer=outer)
        return
    topo = topologies.build("hierarchical", n, groups=groups, inner=inner, outer=outer)
    W_out, W_in = topologies.build(outer, groups).W, topologies.build(inner, n // groups).W
    np.testing.assert_allclose(topo.W, np.kron(W_out, W_in), atol=1e-15)
    lam = max(topologies.build(outer, groups).second_eigenvalue(),
              topologies.build(inner, n // groups).second_eigenvalue())
    assert topo.second_eigenvalue() == pytest.approx(lam, abs=1e-12)
    assert topo.groups.tolist() == [i // (n // groups) for i in range(n)]
    assert 1 <= topo.effective_neighbors() <= n


def test_hierarchical_with_full_inner_graph_is_bluefogs_hierarchical_neighbour_allreduce():
    n, groups = 12, 4
    topo = topologies.build("hierarchical", n, groups=groups, outer="exponential")
    W_machines = topologies.build("exponential", groups).W
    x = np.random.default_rng(0).normal(size=(n, 4))
    means = x.reshape(groups, n // groups, 4).mean(axis=1)  # every machine allreduces its processes
    expected = np.repeat(W_machines @ means, n // groups, axis=0)  # neighbour allreduce of the machine averages
    np.testing.assert_allclose(topo.W @ x, expected, atol=1e-13)
    assert not np.allclose(W_machines, 1 / groups)  # the machines do not average exactly in one step
    with pytest.raises(ValueError, match="groups must be an integer that divides n = 12"):
        topologies.build("hierarchical", n, groups=5)
    with pytest.raises(ValueError, match="needs option groups"):
        topologies.build("hierarchical", n)


# ------------------------------------------------------------------------------------------------ spectral tools
def test_second_singular_value_is_lambda_of_a_doubly_stochastic_w():
    for name, n in (("exponential", 12), ("directed-ring", 9), ("ring", 10)):
        topo = topologies.build(name, n)
        assert directed.second_singular_value(topo.W) == pytest.approx(topo.second_eigenvalue(), abs=1e-12)


def test_perron_vectors_influence_and_consensus_errors():
    topo = topologies.build("star", 6, weights="row-stochastic", centre=0)  # uneven degrees: a biased consensus
    W = topo.W
    pi = topo.stationary()
    limit = np.linalg.matrix_power(W, 400)
    np.testing.assert_allclose(limit, np.outer(np.ones(6), pi), atol=1e-12)  # W^t -> 1 pi^T
    x0 = np.arange(6.0)
    assert (limit @ x0)[0] == pytest.approx(pi @ x0) and pi @ x0 != pytest.approx(x0.mean())
    lo, hi = directed.influence(W, "row")
    assert lo == pytest.approx(6 * pi.min()) and hi == pytest.approx(6 * pi.max()) and hi > 1 > lo
    P = np.linalg.matrix_power(W, 3)
    assert topo.gossip_lambda(3) == pytest.approx(np.linalg.norm(P - P.mean(axis=0), 2))
    assert topo.second_eigenvalue() == pytest.approx(sorted(abs(np.linalg.eigvals(W)))[-2])

    col = topologies.build("star", 6, weights="column-stochastic", centre=0)
    C = col.W
    # push-sum: x <- C x, y <- C y from y = 1; z = x / y tends to the exact average
    x, y = x0.copy(), np.ones(6)
    for _ in range(60):
        x, y = C @ x, C @ y
    np.testing.assert_allclose(x / y, x0.mean(), atol=1e-9)
    np.testing.assert_allclose(y, 6 * col.stationary(), atol=1e-9)  # the weights tend to n pi
    np.testing.assert_allclose(directed.pushsum_weights([C] * 60)[-1], y)
    P = np.linalg.matrix_power(C, 2)
    assert col.gossip_lambda(2) == pytest.approx(np.linalg.norm(P / P.sum(axis=1, keepdims=True) - 1 / 6, 2))
    assert col.consensus_steps(1e-3) < 60
    with pytest.raises(ValueError, match="defined for a doubly stochastic W"):
        col.effective_neighbors()
    with pytest.raises(ValueError, match="defined for a doubly stochastic W"):
        col.phi(1)
