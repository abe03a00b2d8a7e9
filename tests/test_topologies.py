"""Graphs, weight schemes, the Topology object and its validation."""

from __future__ import annotations

import math
import re

import networkx as nx
import numpy as np
import pytest

from topologies import NAMES, SCHEMES, Topology, build, graphs
from topologies.build import TIME_VARYING
from topologies.validation import check_gossip_matrix, check_stochastic

OPTIONS = {"random-regular": {"degree": 3}, "erdos-renyi": {"p": 0.5, "seed": 1}, "random-k": {"k": 2},
           "random-pull": {"k": 2}, "hierarchical": {"groups": 4}, "d-equistatic": {"M": 3},
           "u-equistatic": {"M": 3}}


def assert_doubly_stochastic(W, symmetric=True, signed=False):
    assert W.dtype == np.float64
    assert signed or W.min() >= 0
    assert np.allclose(W.sum(axis=0), 1, atol=1e-12) and np.allclose(W.sum(axis=1), 1, atol=1e-12)
    if symmetric:
        assert np.array_equal(W, W.T)


# --- every topology builds a valid matrix ----------------------------------------------------------------

@pytest.mark.parametrize("name", [name for name in NAMES if name != "custom"])
def test_every_topology_is_valid(name):
    n = 16
    topo = build(name, n, **OPTIONS.get(name, {}))
    assert isinstance(topo, Topology) and topo.name == name and topo.n == n
    for step in range(3):
        W = topo.matrix(step)
        assert W.shape == (n, n)
        if topo.stochastic == "doubly":
            assert_doubly_stochastic(W, symmetric=topo.symmetric, signed=topo.signed)
        else:  # random-pull: only the rows sum to 1 (tests/test_directed_topologies.py)
            assert topo.stochastic == "row" and W.min() >= 0 and np.allclose(W.sum(axis=1), 1, atol=1e-12)
        for i in range(n):
            nbrs = topo.neighbors(i, step)
            assert nbrs == sorted(nbrs) and i not in nbrs
            # row = receiver: i takes weight exactly from itself and its in-neighbours
            assert set(np.nonzero(W[i])[0]) - {i} == set(nbrs)
    assert len(topo.degrees()) == n
    assert topo.is_time_varying == (name in TIME_VARYING)
    assert topo.signed == (name == "matcha")  # MATCHA's I - alpha L_t is the one W that may be negative
    if not topo.is_time_varying:
        assert topo.period == 1 and topo.matrix(5) is topo.W
        assert 0 <= topo.second_eigenvalue() < 1


def test_degrees_and_neighbors_of_closed_form_graphs():
    assert build("ring", 10).degrees().tolist() == [2] * 10
    assert build("ring", 10).neighbors(0) == [1, 9]
    assert build("star", 6).degrees().tolist() == [5, 1, 1, 1, 1, 1]
    assert build("full", 5).degrees().tolist() == [4] * 5 and build("full", 5).neighbors(2) == [0, 1, 3, 4]
    assert build("full", 5).graph.number_of_edges() == 10
    assert build("hypercube", 8).neighbors(5) == [1, 4, 7]
    assert build("exponential", 16, symmetric=True).degrees().tolist() == [7] * 16  # +-1, +-2, +-4, 8
    assert build("random-regular", 20, degree=3, seed=4).degrees().tolist() == [3] * 20


def test_grid_shapes():
    assert [graphs.grid_shape(n) for n in (12, 7, 64)] == [(3, 4), (1, 7), (8, 8)]
    assert build("grid", 12).graph.number_of_edges() == 3 * 3 + 2 * 4
    assert build("grid", 12, shape=(2, 6)).neighbors(0) == [1, 6]
    torus = build("grid", 16, periodic=True)
    assert torus.degrees().tolist() == [4] * 16 and torus.neighbors(0) == [1, 3, 4, 12]
    # a wrapped side of 2 does not double its edge
    assert build("grid", 8, shape=(2, 4), periodic=True).degrees().tolist() == [3] * 8


def test_grid_with_a_prime_count_is_an_error_not_a_path():
    """A prime n > 3 has no 2-D grid: no silent 1 x n path (or ring, periodic); the error names the nearest counts
    that factor with both sides >= 2 and how to ask for the path."""
    for periodic, what in ((False, "1 × 17 path"), (True, "1 × 17 torus, i.e. a ring")):
        with pytest.raises(ValueError, match=r"n = 17 clients is prime") as err:
            build("grid", 17, periodic=periodic)
        assert what in str(err.value) and "16 (4 × 4) or 18 (3 × 6)" in str(err.value)
        assert "shape=(1, 17)" in str(err.value)
    for n, counts in ((5, "4 (2 × 2) or 6 (2 × 3)"), (7, "6 (2 × 3) or 8 (2 × 4)"), (97, "96 (8 × 12) or 98 (7 × 14)")):
        with pytest.raises(ValueError, match=re.escape(counts)):
            graphs.grid(n)
    path = build("grid", 17, shape=(1, 17))  # asked for explicitly: the path
    assert path.graph.number_of_edges() == 16 and path.degrees().tolist() == [1] + [2] * 15 + [1]
    assert build("grid", 17, shape=(17, 1), periodic=True).degrees().tolist() == [2] * 17
    # no 2-D grid exists for n <= 3: the path, as before; elongated but 2-D shapes (2 x prime) are kept
    assert [build("grid", n).graph.number_of_edges() for n in (1, 2, 3)] == [0, 1, 2]
    assert graphs.grid_shape(34) == (2, 17) and build("grid", 34).graph.number_of_edges() == 17 + 2 * 16


def test_small_n():
    assert build("ring", 1).W.tolist() == [[1.0]]
    assert np.allclose(build("ring", 2).W, 0.5)
    assert build("ring", 3).degrees().tolist() == [2, 2, 2]
    assert np.allclose(build("star", 2).W, 0.5)
    assert build("hypercube", 1).W.tolist() == [[1.0]]
    assert build("exponential", 1).W.tolist() == [[1.0]]
    assert np.allclose(build("one-peer-exponential", 2).matrix(0), 0.5)


def test_full_is_exactly_J():
    n = 7
    assert np.array_equal(build("full", n).W, np.full((n, n), 1.0 / n))
    assert np.allclose(build("full", n, weights="lazy").W, (np.eye(n) + 1.0 / n) / 2)


def test_static_exponential_is_directed_with_receiver_rows():
    n, tau = 12, 4
    topo = build("exponential", n)
    assert topo.graph.is_directed() and not topo.symmetric
    assert topo.neighbors(0) == sorted((-(2**k)) % n for k in range(tau))  # 0 receives from 0 - 2^k
    assert topo.W[1, 0] == pytest.approx(1 / (tau + 1)) and topo.W[0, 1] == 0  # 0 sends to 1
    assert topo.degrees().tolist() == [tau] * n
    for weights in ("uniform", "max-degree"):
        assert np.allclose(build("exponential", n, weights=weights).W, topo.W)


# --- weight schemes ----------------------------------------------------------------------------------------

def test_metropolis_weights_star():
    W = build("star", 5).W
    assert np.allclose(W[0, 1:], 1 / 5) and np.allclose(np.diag(W)[1:], 4 / 5)
    assert W[0, 0] == pytest.approx(1 / 5)


def test_max_degree_weights():
    W = build("star", 5, weights="max-degree").W
    assert np.allclose(W[0, 1:], 1 / 5) and np.allclose(np.diag(W)[1:], 1 - 1 / 5)
    W = build("grid", 9, weights="max-degree").W  # d_max = 4: corners keep 1 - 2/5
    assert W[0, 0] == pytest.approx(3 / 5) and W[4, 4] == pytest.approx(1 / 5)


def test_uniform_equals_metropolis_on_regular_graphs():
    assert np.allclose(build("hypercube", 16, weights="uniform").W, build("hypercube", 16).W)
    assert np.allclose(build("ring", 9, weights="uniform").W[0, [0, 1, 8]], 1 / 3)


def test_lazy_and_base():
    ring = build("ring", 8)
    assert np.allclose(build("ring", 8, weights="lazy").W, (np.eye(8) + ring.W) / 2)
    lazy_md = build("star", 6, weights="lazy", base="max-degree")
    assert np.allclose(lazy_md.W, (np.eye(6) + build("star", 6, weights="max-degree").W) / 2)
    assert lazy_md.weights == "lazy(max-degree)"
    assert build("ring", 8, weights="lazy").weights == "lazy(metropolis)"
    assert np.allclose(np.diag(build("one-peer-exponential", 8, weights="lazy").matrix(0)), 0.75)


def test_uniform_refused_on_irregular_graph():
    with pytest.raises(ValueError, match="'uniform'.*not doubly stochastic on the irregular star"):
        build("star", 10, weights="uniform")
    with pytest.raises(ValueError, match="use 'metropolis' or 'max-degree'"):
        build("grid", 9, weights="uniform")


def test_schemes_refused_on_directed_graphs():
    with pytest.raises(ValueError, match="'fastest' need an undirected graph"):
        build("exponential", 8, weights="fastest")
    with pytest.raises(ValueError, match="'fastest' need an undirected graph"):
        build("one-peer-exponential", 8, weights="fastest")
    G = nx.DiGraph([(0, 1), (1, 2), (2, 0), (0, 2)])  # node 0: in-degree 1, out-degree 2
    with pytest.raises(ValueError, match="in-degree = out-degree = d \\(a regular digraph\\)"):
        build("custom", None, graph=G)
    with pytest.raises(ValueError, match="'max-degree' on a directed graph need in-degree = out-degree"):
        build("custom", None, weights="max-degree", graph=G)


# --- time-varying schedules --------------------------------------------------------------------------------

def test_one_peer_exponential_schedule():
    n = 8
    topo = build("one-peer-exponential", n)
    assert topo.is_time_varying and topo.period == 3
    with pytest.raises(ValueError, match="time-varying and has no single W: use matrix\\(step\\)"):
        _ = topo.W
    for step in range(7):
        hop = 2 ** (step % 3)
        P = np.roll(np.eye(n), hop, axis=0)  # P[i + hop, i] = 1: i sends to i + hop
        assert np.array_equal(topo.matrix(step), (np.eye(n) + P) / 2)
        assert topo.neighbors(0, step) == [(-hop) % n]
    assert topo.degrees().tolist() == [1] * n
    assert set(topo.graph.edges()) == set(build("exponential", n).graph.edges())


def test_random_k_is_symmetric_doubly_stochastic_and_seeded():
    a = build("random-k", 20, k=2, seed=7)
    assert a.period is None and a.is_time_varying and a.weights == "metropolis"
    for step in (0, 1, 5, 1000):
        W = a.matrix(step)
        assert_doubly_stochastic(W)
        assert min(d for _, d in a.graph_at(step).degree()) >= 2
    b = build("random-k", 20, k=2, seed=7)
    # b draws step 9 first: the draw depends on (seed, t) only
    assert np.array_equal(a.matrix(9), b.matrix(9))
    assert not np.array_equal(a.matrix(0), a.matrix(1))
    assert not np.array_equal(a.matrix(3), build("random-k", 20, k=2, seed=8).matrix(3))
    assert np.array_equal(a.graph.edges(), a.graph_at(0).edges())
    with pytest.raises(ValueError, match="has no single W"):
        _ = a.W
    assert_doubly_stochastic(build("random-k", 20, weights="max-degree", k=3).matrix(2))


def test_random_k_bad_options():
    with pytest.raises(ValueError, match="random-k needs option k"):
        build("random-k", 8)
    with pytest.raises(ValueError, match="k must be an integer with 1 <= k <= n-1 = 7"):
        build("random-k", 8, k=8)
    with pytest.raises(ValueError, match="random-k supports weights metropolis, max-degree, lazy"):
        build("random-k", 8, k=2, weights="uniform")
    with pytest.raises(ValueError, match="n \\(number of clients\\) must be an integer >= 2"):
        build("random-k", 1, k=1)


# --- custom topologies -------------------------------------------------------------------------------------

def test_custom_from_networkx_graph_relabels_sorted():
    G = nx.Graph([("b", "c"), ("a", "b")])
    topo = build("custom", None, graph=G)
    assert topo.n == 3 and topo.neighbors(1) == [0, 2] and topo.weights == "metropolis"
    assert np.allclose(topo.W, build("custom", 3, graph=nx.path_graph(3)).W)
    with pytest.raises(ValueError, match="n = 4 does not match the 3 nodes"):
        build("custom", 4, graph=G)
    with pytest.raises(ValueError, match="graph must be a networkx Graph"):
        build("custom", None, graph=[(0, 1)])


def test_custom_from_edge_list(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("# a ring of 4\n0 1\n1 2\n\n2 3  # closing\n3 0\n")
    topo = build("custom", None, path=str(path))
    assert np.allclose(topo.W, build("ring", 4).W)
    bad = tmp_path / "bad.txt"
    bad.write_text("0 1\n1 x\n")
    with pytest.raises(ValueError, match="bad.txt:2: expected two integer node ids"):
        build("custom", None, path=bad)
    with pytest.raises(ValueError, match="node id 3 is out of range for n = 3"):
        build("custom", 3, path=path)
    with pytest.raises(ValueError, match="does not exist"):
        build("custom", None, path=tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="4 edge\\(s\\) connect at most 5 clients, not n = 6: the graph would be "
                       "disconnected"):  # refused from the edge count, before nodes 4 and 5 are made
        build("custom", 6, path=path)


def test_custom_from_matrix():
    W = np.array([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5], [0.25, 0.25, 0.5]])
    topo = build("custom", 3, matrix=W)
    assert topo.weights == "given" and np.array_equal(topo.W, W)
    assert topo.graph.is_directed() and topo.neighbors(0) == [1]  # 0 receives from 1 only
    with pytest.raises(ValueError, match="^custom with matrix= uses the matrix as W: leave weights unset, got "
                                         "weights='metropolis'$"):
        build("custom", 3, weights="metropolis", matrix=W)
    with pytest.raises(ValueError, match="leave base unset, got base='uniform'$"):
        build("custom", 3, matrix=W, base="uniform")
    with pytest.raises(ValueError, match="n = 4 does not match the matrix of shape \\(3, 3\\)"):
        build("custom", 4, matrix=W)


def test_custom_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one of the options graph, path, matrix; got none"):
        build("custom", 3)
    with pytest.raises(ValueError, match="got graph, matrix"):
        build("custom", 3, graph=nx.path_graph(3), matrix=np.eye(3))


# --- validation --------------------------------------------------------------------------------------------

def test_validation_messages():
    W = np.eye(5)
    W[3, 3], W[3, 4] = 0.8, 0.2  # rows sum to 1, column 3 sums to 0.8 (and column 4 to 1.2)
    with pytest.raises(ValueError, match="W is not column-stochastic: column 3 sums to 0.8"):
        check_stochastic(W, symmetric=False)
    with pytest.raises(ValueError, match="W is not row-stochastic: row 1 sums to 0.9"):
        check_stochastic(np.diag([1.0, 0.9]), symmetric=False)
    with pytest.raises(ValueError, match="W is not nonnegative: W\\[0, 1\\] = -0.5"):
        check_stochastic(np.array([[1.5, -0.5], [-0.5, 1.5]]), symmetric=False)
    A = np.array([[0.5, 0.5, 0], [0, 0.5, 0.5], [0.5, 0, 0.5]])
    with pytest.raises(ValueError, match="W is not symmetric: W\\[0, 1\\] = 0.5 but W\\[1, 0\\] = 0"):
        check_stochastic(A, symmetric=True)
    with pytest.raises(ValueError, match="non-finite"):
        check_stochastic(np.array([[np.nan]]), symmetric=True)
    with pytest.raises(ValueError, match="must be a square"):
        check_stochastic(np.ones(3), symmetric=True)
    with pytest.raises(ValueError, match="W is disconnected: its graph has 2"):
        check_gossip_matrix(np.eye(2), symmetric=True)
    bipartite = np.array([[0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0]])
    with pytest.raises(ValueError, match="does not contract: lambda = .* = 1"):
        check_gossip_matrix(bipartite, symmetric=True)
    with pytest.raises(ValueError, match="W of custom does not contract"):
        build("custom", None, matrix=bipartite)
    with pytest.raises(ValueError, match="W of custom is not column-stochastic"):
        build("custom", None, matrix=W)


# --- bad input ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, -3, 2.5, True, "8", None])
def test_bad_n(n):
    with pytest.raises(ValueError, match="n \\(number of clients\\) must be an integer >= 1"):
        build("ring", n)


def test_unknown_names_weights_options():
    with pytest.raises(ValueError, match="unknown topology 'torus'; allowed: ring, grid, exponential, full"):
        build("torus", 8)
    with pytest.raises(ValueError, match="weights must be one of " + ", ".join(SCHEMES)):
        build("ring", 8, weights="hastings")
    with pytest.raises(ValueError, match="unknown option\\(s\\) degree for topology 'ring'; allowed: base"):
        build("ring", 8, degree=3)
    with pytest.raises(ValueError, match="allowed: shape, periodic, base"):
        build("grid", 8, wrap=True)
    with pytest.raises(ValueError, match="option base only applies to weights='lazy'"):
        build("ring", 8, base="metropolis")
    with pytest.raises(ValueError, match="base .* must be one of metropolis, uniform, max-degree, fastest"):
        build("ring", 8, weights="lazy", base="lazy")


def test_bad_graph_options():
    with pytest.raises(ValueError, match="hypercube needs n to be a power of 2"):
        build("hypercube", 12)
    with pytest.raises(ValueError, match="shape must be two positive integers .* rows\\*cols = n = 12"):
        build("grid", 12, shape=(3, 5))
    with pytest.raises(ValueError, match="shape must be"):
        build("grid", 12, shape="3x4")
    with pytest.raises(ValueError, match="periodic must be True or False"):
        build("grid", 12, periodic="yes")
    with pytest.raises(ValueError, match="symmetric must be True or False"):
        build("exponential", 12, symmetric=1)
    with pytest.raises(ValueError, match="random-regular needs option degree"):
        build("random-regular", 12)
    with pytest.raises(ValueError, match="n\\*degree even"):
        build("random-regular", 9, degree=3)
    with pytest.raises(ValueError, match="random-regular graph .* is disconnected \\(2 components\\)"):
        build("random-regular", 4, degree=1)
    with pytest.raises(ValueError, match="erdos-renyi needs option p"):
        build("erdos-renyi", 12)
    with pytest.raises(ValueError, match="p must be a number with 0 <= p <= 1"):
        build("erdos-renyi", 12, p=1.5)
    with pytest.raises(ValueError, match="erdos-renyi graph G\\(n=64, p=0.01, seed=0\\) is disconnected"):
        build("erdos-renyi", 64, p=0.01)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        build("erdos-renyi", 12, p=0.5, seed=-1)


def test_bad_step_and_client_index():
    topo = build("ring", 5)
    with pytest.raises(ValueError, match="step must be an integer >= 0"):
        topo.matrix(-1)
    with pytest.raises(ValueError, match="i must be a client index in 0..4"):
        topo.neighbors(5)


def test_matrices_are_read_only():
    topo = build("ring", 5)
    with pytest.raises(ValueError):
        topo.W[0, 0] = 2.0
    assert math.isclose(topo.W[0, 0], 1 / 3)


def test_periodic_schedule_must_contract_over_its_period():
    class Shift:  # every step: all clients pass everything on to the next one, keeping nothing
        n, period = 4, 2

        def graph_at(self, step):
            return nx.DiGraph([(i, (i + 1) % 4) for i in range(4)])

        def union_graph(self):
            return self.graph_at(0)

    def weigh(G):
        return np.roll(np.eye(4), 1, axis=0)

    with pytest.raises(ValueError, match="product of the 2 step matrices of shift does not contract"):
        Topology("shift", schedule=Shift(), weigh=weigh, symmetric=False)


def test_grid_is_regular_says_what_the_built_mesh_has():
    """From n and the options alone: every node of the same degree exactly when each side is periodic or <= 2."""
    for n in range(1, 25):
        for rows in (r for r in range(1, n + 1) if n % r == 0):
            for periodic in (False, True):
                degrees = {d for _, d in graphs.grid(n, (rows, n // rows), periodic).degree()}
                assert graphs.grid_is_regular(n, (rows, n // rows), periodic) == (len(degrees) == 1), (n, rows)
    assert not graphs.grid_is_regular(8) and graphs.grid_is_regular(16, periodic=True)


def test_a_custom_matrix_refuses_a_weight_scheme_naming_it():
    W = np.full((4, 4), 0.25)
    for weights in ("metropolis", "sample-count"):
        with pytest.raises(ValueError, match=rf"^custom with matrix= uses the matrix as W: leave weights unset, got "
                                             rf"weights='{weights}'$"):
            build("custom", 4, weights, matrix=W, **({"sizes": [1, 2, 3, 4]} if weights == "sample-count" else {}))
