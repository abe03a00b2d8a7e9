"""The defining property of each topology of recent topology research, on many n: Base-(k+1) graphs (exact consensus
after one period, <= k peers per step), EquiTopo (||W - J||_2 <= epsilon at the paper's M; the EquiDyn step's
expected contraction) and MATCHA (budget met in expectation, the certified optimum of its two problems); and the
published formulas and small cases worked by hand."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

import topologies
from topologies import base_graph, equitopo, graphs, matcha, spectral

J = lambda n: np.full((n, n), 1.0 / n)  # noqa: E731


def apply_step(entries, x):
    """One step of a Base-(k+1) template on the vector x: the entries, and self-weight 1 for the clients left out."""
    rows, cols, vals = entries
    out = np.bincount(rows, weights=vals * x[cols], minlength=len(x))
    idle = np.bincount(rows, minlength=len(x)) == 0
    out[idle] = x[idle]
    return out


# ------------------------------------------------------------------------------------------- Base-(k+1)
@pytest.mark.slow  # 8,000 sequences: about 5 s per (k, variant) on a 2-core machine
@pytest.mark.parametrize(("simple", "largest"), [(False, 1000), (True, 400)], ids=["base", "simple"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_every_n_up_to_1000_averages_exactly_with_at_most_k_peers(k, simple, largest):
    """For every n <= 1000 (the simple variant: n <= 400): each step's clients have <= k peers, its rows (so its
    columns) sum to 1, W_t = W_t^T (y^T W x = x^T W y for Gaussian x, y), the product of one period maps two Gaussian
    vectors to their means (P = J: (P - J) x = 0 for a random x has probability 0 otherwise), and
    tau <= 2 log_(k+1) n + 2 (the authors' test) in integers."""
    rng = np.random.default_rng(k)
    b = k + 1
    for n in range(1, largest + 1):
        template = base_graph.simple_base(n, b) if simple else base_graph.base(n, b)
        tau = len(template)
        assert n == 1 or b ** (tau - 2) <= n * n, (n, tau)
        X = rng.standard_normal((2, n))
        Y = X.copy()
        for entries in template:
            rows, cols, vals = entries
            off = rows != cols
            assert np.bincount(rows[off], minlength=n).max(initial=0) <= k, (n, k)
            sums = np.bincount(rows, weights=vals, minlength=n)
            assert np.abs(sums[np.bincount(rows, minlength=n) > 0] - 1.0).max() <= 1e-14
            x, y = X
            assert abs(vals @ (y[rows] * x[cols]) - vals @ (x[rows] * y[cols])) <= 1e-12 * n
            Y = np.stack([apply_step(entries, y) for y in Y])
        np.testing.assert_allclose(Y, X.mean(axis=1, keepdims=True) * np.ones(n), atol=1e-13, err_msg=f"n={n}")


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_the_period_product_is_J_to_machine_precision(k):
    """The full product W_{tau-1} ... W_0 against J, entry by entry, for n <= 130 and across 243..330 (where the
    authors' float log_3 gives k = 2 a third peer or fails)."""
    for n in [*range(1, 131), *range(243, 331, 7)]:
        sched = base_graph.BaseGraph(n, k)
        P = np.eye(n)
        for t in range(sched.period):
            W = sched.step_matrix(t)
            assert (W != W.T).nnz == 0
            P = W @ P
        assert np.abs(P - J(n)).max() <= 1e-14, (n, k)


def test_digits_are_integer_arithmetic():
    assert base_graph.digits(243, 3) == [(1, 5)]  # float: int(math.log(243, 3)) == 4
    assert int(math.log(243, 3)) == 4
    assert base_graph.digits(324, 3) == [(1, 5), (1, 4)]
    assert base_graph.digits(485, 3) == [(1, 5), (2, 4), (2, 3), (2, 2), (2, 1), (2, 0)]
    assert base_graph.smooth_part(2 * 3**5 * 7, 3) == 2 * 3**5
    assert base_graph.factors(24, 3) == [2, 2, 2, 3]
    assert base_graph.factors(12, 3) == [2, 2, 3]  # greedy 3 first, then 2s, used ascending (the authors' order)
    with pytest.raises(ValueError):
        base_graph.factors(14, 3)
    for k, n in [(2, 243), (2, 244), (2, 300), (2, 324), (2, 325), (2, 485)]:
        sched = base_graph.BaseGraph(n, k)
        assert max(int((np.diff(sched.step_matrix(t).indptr) - 1).max()) for t in range(sched.period)) <= k


def test_published_lengths():
    """The sequence lengths the authors' code (yukiTakezawa/BaseGraph) gives, and tau = p at n = (k+1)^p."""
    assert [base_graph.BaseGraph(n, 1).period for n in (6, 12, 25, 100)] == [4, 5, 9, 11]
    assert base_graph.BaseGraph(100, 2).period == 8
    for k in (1, 2, 3, 4):
        for p in (1, 2, 3, 4):
            assert base_graph.BaseGraph((k + 1) ** p, k).period == p
    assert base_graph.BaseGraph(16, 1).period == topologies.build("one-peer-exponential", 16).period == 4


def test_base_2_graph_on_6_clients_by_hand():
    """n = 6, k = 1: 6 = 2 x 3, so two blocks {0, 1, 2}, {3, 4, 5} run the simple Base-2 graph of 3 (3 = 2 + 1:
    pair 0-1; 2 gives 1 the weight 2/3 of a group of 2 out of 3; pair 0-1 again), then the columns pair across
    (4 steps; the simple Base-2 graph of 6 takes 5)."""
    half, third = 0.5, 1.0 / 3.0
    W0 = np.eye(6)
    for i, j in ((0, 1), (3, 4)):
        W0[np.ix_([i, j], [i, j])] = half
    W1 = np.eye(6)
    for i, j in ((1, 2), (4, 5)):
        W1[np.ix_([i, j], [i, j])] = [[third, 2 * third], [2 * third, third]]
    W3 = np.zeros((6, 6))
    for i in range(3):
        W3[np.ix_([i, i + 3], [i, i + 3])] = half
    expected = [W0, W1, W0, W3]
    topo = topologies.build("base-graph", 6, k=1)
    assert topo.period == 4 and topologies.build("simple-base-graph", 6, k=1).period == 5
    for t, W in enumerate(expected):
        np.testing.assert_allclose(topo.matrix(t), W, atol=1e-15)
    np.testing.assert_allclose(topo.period_matrix(), J(6), atol=1e-15)
    assert topo.second_eigenvalue() == 0.0 and topo.consensus_steps(1e-9) == 4


def test_base_graph_is_exact_where_one_peer_exponential_is_not():
    for n in (12, 24, 100):
        base = topologies.build("base-graph", n, k=1)
        ope = topologies.build("one-peer-exponential", n)
        assert base.gossip_lambda(base.period) == 0.0
        assert ope.gossip_lambda(ope.period) > 0.05  # 0.21 at n = 12


# -------------------------------------------------------------------------------------------------- EquiTopo
def test_the_basis_matrices_average_to_J():
    for n in (2, 5, 16, 33):
        mean = equitopo.basis_sum(n, np.arange(1, n), 1.0 / (n - 1)).toarray()
        np.testing.assert_allclose(mean, J(n), atol=1e-15)


def test_the_paper_M_and_the_authors_truncation():
    for n, eps, delta in ((17, 0.5, 0.1), (100, 0.3, 0.05), (1000, 0.8, 0.01)):
        bound = 8 * math.log(2 * n / delta) / (3 * eps**2)
        M = equitopo.required_samples(n, eps, delta)
        assert M == math.ceil(bound) and M >= bound and M - int(bound) <= 1  # the authors' code: int(bound)
    assert topologies.build("d-equistatic", 17, epsilon=0.5, delta=0.1, seed=3).sparse(0).nnz <= 17 * (
        equitopo.required_samples(17, 0.5, 0.1) + 1)


@pytest.mark.parametrize("n", [8, 16, 24, 33, 64, 100, 128])
@pytest.mark.parametrize("name", ["d-equistatic", "u-equistatic"])
def test_equistatic_meets_epsilon_over_seeds(name, n):
    """At the paper's M for (epsilon, delta) = (0.5, 0.1), ||W - J||_2 <= epsilon in at least 1 - delta of 30 seeds
    (the bound is loose: all of them), and every client has at most M (2M undirected) peers."""
    eps, delta = 0.5, 0.1
    M = equitopo.required_samples(n, eps, delta)
    norms = []
    for seed in range(30):
        W = topologies.build(name, n, epsilon=eps, delta=delta, seed=seed).W
        norms.append(np.linalg.norm(W - J(n), 2))
        assert ((W > 0).sum(axis=1) - 1).max() <= (2 * M if name == "u-equistatic" else M)
    assert np.mean(np.array(norms) <= eps) >= 1 - delta, norms
    assert max(norms) < 1


def test_equistatic_is_the_transpose_of_the_authors_graph_code():
    """Their graph code: W[i, (i + a) mod n] += (n - 1)/n per offset (i pulls from i + a); dfl (their training
    convention): i receives from i - a. U-EquiStatic is symmetric: both agree."""
    n, M, seed = 12, 5, 7
    shifts = equitopo.offsets(n, M, seed)
    theirs = np.zeros((n, n))
    for a in shifts:
        H = np.eye(n) / n
        H[np.arange(n), (np.arange(n) + a) % n] += (n - 1) / n
        theirs += H / M
    ours = topologies.build("d-equistatic", n, M=M, seed=seed).W
    np.testing.assert_allclose(ours, theirs.T, atol=1e-15)
    np.testing.assert_allclose(topologies.build("u-equistatic", n, M=M, seed=seed).W, (theirs + theirs.T) / 2,
                               atol=1e-15)
    assert np.isclose(np.linalg.norm(ours - J(n), 2), np.linalg.norm(theirs - J(n), 2))


def test_a_disconnected_equistatic_draw_is_refused():
    # n = 16 with offsets all even: find a seed whose 2 draws are both even
    seed = next(s for s in range(200) if all(a % 2 == 0 for a in equitopo.offsets(16, 2, s)))
    with pytest.raises(ValueError, match="multiples of .* disconnected; raise M .* or change seed"):
        topologies.build("d-equistatic", 16, M=2, seed=seed)


@pytest.mark.parametrize("eta", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("n", [5, 16, 50])
def test_od_equidyn_expected_contraction_is_independent_of_n(n, eta):
    """E over a uniform in 1..n-1 of W_a^T W_a - J = ((1 - eta)^2 + eta^2 (1 - 2/n)) (I - J), exactly."""
    dyn = equitopo.ODEquiDyn(n, eta=eta)
    mean = np.zeros((n, n))
    for a in range(1, n):
        H = equitopo.basis_sum(n, np.array([a]), 1.0).toarray()
        W = (1 - eta) * np.eye(n) + eta * H
        mean += (W.T @ W) / (n - 1)
    rate = (1 - eta) ** 2 + eta**2 * (1 - 2 / n)
    np.testing.assert_allclose(mean - J(n), rate * (np.eye(n) - J(n)), atol=1e-13)
    for step in range(20):  # every drawn W_t is one of those: a circulant with one peer
        W = dyn.step_matrix(step).toarray()
        a, _ = dyn.draw(step)
        np.testing.assert_allclose(W, (1 - eta) * np.eye(n) + eta * equitopo.basis_sum(n, np.array([a]), 1.0),
                                   atol=1e-15)


def test_ou_equidyn_steps_are_matchings_along_the_offset():
    for n in (2, 7, 16, 31):
        dyn = equitopo.OUEquiDyn(n, eta=0.5, M=4, seed=3)
        for step in range(30):
            W = dyn.step_matrix(step).toarray()
            a, _ = dyn.draw(step)
            assert a in dyn.shifts
            np.testing.assert_array_equal(W, W.T)
            np.testing.assert_allclose(W.sum(axis=0), 1, atol=1e-15)
            off = W - np.diag(np.diag(W))
            assert ((off > 0).sum(axis=1) <= 1).all()
            i, j = np.nonzero(np.triu(off))
            assert set(((j - i) % n).tolist()) <= {a, (n - a) % n}
            assert np.allclose(off[i, j], 0.5 * (n - 1) / n)


def test_random_families_depend_on_seed_and_step_only():
    for name, options in (("od-equidyn", {}), ("ou-equidyn", {"M": 3}), ("matcha", {"budget": 0.3}),
                          ("d-equistatic", {"M": 4})):
        a = topologies.build(name, 16, seed=5, **options)
        b = topologies.build(name, 16, seed=5, **options)
        c = topologies.build(name, 16, seed=6, **options)
        later = [b.matrix(s) for s in (9, 3, 0)]  # drawn in another order
        assert all(np.array_equal(a.matrix(s), m) for s, m in zip((9, 3, 0), later))
        assert any(not np.array_equal(a.matrix(s), c.matrix(s)) for s in range(10))


# ---------------------------------------------------------------------------------------------------- MATCHA
def _matcha(A, budget, seed=0):
    return matcha.Matcha(A, budget, seed)


BASES = {
    "ring-16": graphs.ADJACENCY["ring"](16)[0],
    "exponential-16": graphs.ADJACENCY["exponential"](16, symmetric=True)[0],
    "erdos-renyi-20": graphs.ADJACENCY["erdos-renyi"](20, p=0.3, seed=1)[0],
    "geometric-16": graphs.adjacency_of(nx.convert_node_labels_to_integers(
        nx.random_geometric_graph(16, 0.45, seed=2)))[0],
}


@pytest.mark.parametrize("budget", [0.1, 0.3, 0.5, 0.8])
@pytest.mark.parametrize("base", BASES)
def test_matcha_probabilities_are_the_certified_optimum_within_budget(base, budget):
    m = _matcha(BASES[base], budget)
    count = len(m.matchings)
    p = m.probabilities
    assert (p >= 0).all() and (p <= 1).all()
    assert p.sum() == pytest.approx(budget * count, rel=1e-7)  # lambda_2 grows with every p_j: the budget is spent
    assert m.upper_bound - m.connectivity <= 1e-6 * max(1.0, m.upper_bound)  # certified: LP bound = lambda_2 achieved
    stacked = np.stack(m.laplacians)
    lam2 = lambda q: np.linalg.eigvalsh(np.tensordot(q, stacked, axes=1))[1]  # noqa: E731
    assert lam2(p) == pytest.approx(m.connectivity, abs=1e-10)
    rng = np.random.default_rng(0)
    assert lam2(np.full(count, budget)) <= m.connectivity + 1e-10
    for _ in range(100):  # random feasible points never beat it
        q = rng.dirichlet(np.ones(count)) * budget * count
        if q.max() <= 1:
            assert lam2(q) <= m.connectivity + 1e-10


def test_matcha_symmetric_bases_have_closed_forms():
    n = 16  # ring: two perfect matchings swapped by a rotation: p = (C_b, C_b), lambda_2 = C_b (2 - 2 cos 2pi/n)
    for budget in (0.2, 0.6):
        m = _matcha(BASES["ring-16"], budget)
        assert len(m.matchings) == 2
        assert m.connectivity == pytest.approx(budget * (2 - 2 * math.cos(2 * math.pi / n)), rel=1e-9)
    star = graphs.ADJACENCY["star"](9)[0]  # 8 one-edge matchings, all alike: lambda_2 = C_b * 1
    assert _matcha(star, 0.25).connectivity == pytest.approx(0.25, rel=1e-9)
    # budget 1: every matching always, W = I - alpha L, rho(alpha) = max((1 - alpha l_2)^2, (1 - alpha l_n)^2):
    # alpha = 2 / (l_2 + l_n)
    full = _matcha(BASES["ring-16"], 1.0)
    l2, ln = 2 - 2 * math.cos(2 * math.pi / n), 4.0
    assert full.alpha == pytest.approx(2 / (l2 + ln), rel=1e-7)
    assert full.rho == pytest.approx(((ln - l2) / (ln + l2)) ** 2, rel=1e-7)


@pytest.mark.parametrize("base", BASES)
def test_matcha_alpha_minimises_rho(base):
    m = _matcha(BASES[base], 0.4)
    grid = np.linspace(0, 2 / m.connectivity, 801)
    values = [matcha.rho(m.laplacians, m.probabilities, a) for a in grid]
    assert m.rho <= min(values) + 1e-9 and m.rho < 1


def test_matcha_activations_meet_the_budget_in_expectation():
    """Over 4,000 steps the mean number of active matchings is sum_j p_j (within 4 standard errors), and the mean
    W_t is I - alpha Lbar."""
    m = _matcha(BASES["erdos-renyi-20"], 0.3, seed=11)
    steps = 4000
    active = np.array([m.active(t) for t in range(steps)])
    expected, sd = m.probabilities.sum(), math.sqrt((m.probabilities * (1 - m.probabilities)).sum() / steps)
    assert abs(active.sum(axis=1).mean() - expected) <= 4 * sd
    mean_W = sum(m.step_matrix(t) for t in range(steps)).toarray() / steps
    Lbar = np.tensordot(m.probabilities, np.stack(m.laplacians), axes=1)
    np.testing.assert_allclose(mean_W, np.eye(20) - m.alpha * Lbar, atol=0.05)


def test_matcha_steps_are_symmetric_with_rows_summing_to_one():
    topo = topologies.build("matcha", 16, graph="exponential", budget=0.3, seed=2)
    for step in range(10):
        W = topo.matrix(step)
        np.testing.assert_array_equal(W, W.T)
        np.testing.assert_allclose(W.sum(axis=1), 1, atol=1e-13)
    assert topo.signed and min(topo.matrix(s).min() for s in range(50)) < 0  # the paper's alpha: negative self-weights
    assert topo.gossip_lambda(40) < 1e-2


def test_matcha_decomposition_is_a_partition_into_matchings():
    A = BASES["erdos-renyi-20"]
    m = _matcha(A, 0.5)
    edges = np.concatenate(m.matchings)
    assert len(edges) == A.nnz // 2 == len({tuple(e) for e in edges.tolist()})
    for part in m.matchings:
        assert len(np.unique(part)) == part.size  # no client twice in a matching
    assert len(m.matchings) <= 2 * int(np.diff(A.indptr).max()) - 1  # a greedy edge colouring's bound


def test_spectral_helpers_see_a_finite_time_product():
    topo = topologies.build("base-graph", 24, k=2)
    assert spectral.product_lambda([topo.sparse(t) for t in range(topo.period)]) == 0.0
    assert sp.issparse(topo.sparse(0))
