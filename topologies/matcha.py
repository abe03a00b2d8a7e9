"""MATCHA: a base graph decomposed into matchings, each activated at random per step under a communication budget.

Wang, Sahu, Yang, Joshi & Kar, "MATCHA: Speeding Up Decentralized SGD via Matching Decomposition Sampling"
(arXiv 1905.09435, 2019; the authors' code: JYWa/MATCHA). Given an undirected base graph G:

1. Decompose G's edges into disjoint matchings M_1, ..., M_m (here a proper edge colouring: networkx's greedy
   colouring of the line graph, largest saturation first). L_j is the Laplacian of matching j.
2. Activation probabilities (the paper's problem (5)): maximise the algebraic connectivity of the expected
   Laplacian, lambda_2(sum_j p_j L_j), subject to sum_j p_j <= C_b m and 0 <= p_j <= 1, C_b in (0, 1] being the
   communication budget: the expected fraction of the matchings used per step (C_b = 1 activates all: the base
   graph itself). The objective is concave in p (a minimum of the linear functions u^T L(p) u over unit u
   orthogonal to 1), so it is solved here through such cuts, with the level method and `scipy.optimize.linprog`
   (HiGHS): the cuts' LP gives an upper bound on the optimum, the best iterate's lambda_2 a lower one, and it stops
   when the two are within GAP_TOL = 1e-6 (relative). The authors solve the same problem as a semidefinite
   program with cvxpy (not a dfl dependency); here the two bounds certify the answer.
3. Mixing weight alpha (the paper's problem (6)): W_t = I - alpha L_t with L_t = sum_j B_j^(t) L_j, B_j^(t)
   independent Bernoulli(p_j), minimises rho = ||E[W_t^T W_t] - J||_2 =
   lambda_max(I - 2 alpha Lbar + alpha^2 (Lbar^2 + 2 sum_j p_j (1 - p_j) L_j) - J) (L_j^2 = 2 L_j for a
   matching). rho is convex in alpha, so the one-dimensional `scipy.optimize.minimize_scalar` (bounded) solves the
   authors' SDP (their slack b is alpha^2 at the optimum); MATCHA converges when rho < 1.

Each step client i exchanges with at most one peer per active matching and keeps 1 - alpha deg_t(i). The
optimal alpha usually exceeds 1 / (the base graph's largest degree) (e.g. 0.65 on a ring at C_b = 0.5, 0.24 on
a 7-regular graph), so a step that activates many of a client's matchings gives it a negative self-weight: W_t
is then symmetric with rows and columns summing to 1 but not nonnegative, as in the paper. It is the one
built-in topology whose W may be negative (`Topology.signed`); the mixing is still linear and averages exactly
in expectation, and rho < 1 is what MATCHA's convergence needs.

Randomness: step t's activations come from `np.random.default_rng([seed, t])` alone (one uniform per matching),
the same on every process of a run whatever the world size.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog, minimize_scalar

from topologies import limits
from topologies.errors import TopologyError
from topologies.graphs import _check_seed, from_adjacency
from topologies.schedules import WeightedSchedule

GAP_TOL = 1e-6  # relative gap between the cutting-plane bounds at which the activation probabilities are optimal
CUT_WINDOW = 1e-2  # eigenvalues this close (relative) to lambda_2 give cuts too
MAX_CUT_ROUNDS = 1000
ALPHA_XTOL = 1e-12


def check_budget(budget: object) -> float:
    """C_b, the expected fraction of the matchings activated per step: a number with 0 < C_b <= 1."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float, np.floating)) or not 0 < budget <= 1:
        raise TopologyError(f"matcha option budget (C_b: the expected fraction of the base graph's matchings used "
                            f"per step) must be a number with 0 < budget <= 1, got {budget!r}")
    return float(budget)


def matchings(A: sp.csr_array) -> list[np.ndarray]:
    """The base graph's edges (undirected support of A) as disjoint matchings: [edges, 2] arrays (i < j)."""
    G = from_adjacency(sp.csr_array(A + A.T), directed=False)
    if G.number_of_edges() == 0:
        return []
    colours = nx.greedy_color(nx.line_graph(G), strategy="saturation_largest_first")
    groups: dict[int, list[tuple[int, int]]] = {}
    for (u, v), c in colours.items():
        groups.setdefault(c, []).append((min(u, v), max(u, v)))
    return [np.array(sorted(groups[c]), dtype=np.int64) for c in sorted(groups)]


def laplacian(n: int, edges: np.ndarray) -> np.ndarray:
    """Dense Laplacian of the edges ([e, 2])."""
    L = np.zeros((n, n))
    i, j = edges[:, 0], edges[:, 1]
    np.add.at(L, (i, i), 1.0)
    np.add.at(L, (j, j), 1.0)
    L[i, j] -= 1.0
    L[j, i] -= 1.0
    return L


def _fiedler(L: np.ndarray) -> tuple[float, np.ndarray]:
    """lambda_2 of a Laplacian and the eigenvectors (columns, unit, orthogonal to 1) of the eigenvalues near it.

    Near: within CUT_WINDOW (relative). Each gives a valid cut, and near an optimum where lambda_2 is multiple all
    of them are needed.
    """
    vals, vecs = np.linalg.eigh(L - 1.0)  # L - 11^T: the eigenvalue of 1 moves to -n, below every other
    lam = vals[1]
    near = np.flatnonzero(vals[1:] - lam <= CUT_WINDOW * max(1.0, abs(lam))) + 1
    return float(lam), vecs[:, near]


def _lp(objective: np.ndarray, A: np.ndarray, rhs: np.ndarray, bounds: list) -> np.ndarray:
    res = linprog(objective, A_ub=A, b_ub=rhs, bounds=bounds, method="highs")
    if res.status != 0:
        raise TopologyError(f"matcha: a linear program of the activation probabilities failed ({res.message})")
    return res.x


def activation_probabilities(laplacians: list[np.ndarray], budget: float) -> tuple[np.ndarray, float, float]:
    """argmax_p lambda_2(sum_j p_j L_j) s.t. sum_j p_j <= budget * m, 0 <= p_j <= 1 (module docstring, step 2).

    The level method of Lemarechal, Nemirovskii & Nesterov (1995) in the max-norm, so that each step is a linear
    program: the cuts t <= sum_j p_j u^T L_j u (u a Fiedler vector of an iterate) bound lambda_2 from above; the
    largest t they allow (an LP) is the upper bound, the best iterate's lambda_2 the lower one; the next iterate is
    the point nearest (max-norm) the best one where the cuts allow lambda_2 >= lower + 0.3 (upper - lower).

    Returns:
        (p, lambda_2 of p: the lower bound, the upper bound); they agree within GAP_TOL (relative).
    """
    m = len(laplacians)
    stacked = np.stack(laplacians)
    if budget >= 1.0:  # lambda_2 never decreases when a p_j grows: all matchings, always
        lam = _fiedler(stacked.sum(axis=0))[0]
        return np.ones(m), lam, lam
    cap = 2.0 * float(max(L.diagonal().max() for L in laplacians)) * m + 1.0  # > any lambda_2: bounds the first LP
    cuts: list[np.ndarray] = []  # each: c_j = u^T L_j u, so lambda_2(p) <= sum_j p_j c_j
    budget_row = np.ones((1, m))
    p = np.full(m, budget)
    best_p, lower = p, -np.inf
    for _ in range(MAX_CUT_ROUNDS):
        lam, U = _fiedler(np.tensordot(p, stacked, axes=1))
        if lam > lower:
            best_p, lower = p, lam
        cuts.extend(np.einsum("ik,jil,lk->kj", U, stacked, U))
        C = np.array(cuts)
        # upper bound: max t s.t. t <= C p, sum p <= budget m, 0 <= p <= 1   (variables p, t)
        x = _lp(np.concatenate([np.zeros(m), [-1.0]]),
                np.vstack([np.hstack([-C, np.ones((len(C), 1))]), np.hstack([budget_row, [[0.0]]])]),
                np.concatenate([np.zeros(len(C)), [budget * m]]), [(0.0, 1.0)] * m + [(None, cap)])
        upper = float(x[-1])
        if upper - lower <= GAP_TOL * max(1.0, abs(upper)):
            return best_p, lower, upper
        level = lower + 0.3 * (upper - lower)
        # next: min s s.t. |p - best_p| <= s, C p >= level, sum p <= budget m, 0 <= p <= 1   (variables p, s)
        eye = np.eye(m)
        x = _lp(np.concatenate([np.zeros(m), [1.0]]),
                np.vstack([np.hstack([eye, -np.ones((m, 1))]), np.hstack([-eye, -np.ones((m, 1))]),
                           np.hstack([-C, np.zeros((len(C), 1))]), np.hstack([budget_row, [[0.0]]])]),
                np.concatenate([best_p, -best_p, np.full(len(C), -level), [budget * m]]),
                [(0.0, 1.0)] * m + [(0.0, None)])
        p = np.clip(x[:m], 0.0, 1.0)
    raise TopologyError(f"matcha: the activation probabilities did not converge in {MAX_CUT_ROUNDS} rounds "
                        f"(bounds {lower:.9g} .. {upper:.9g})")


def expected_gram(laplacians: list[np.ndarray], p: np.ndarray, alpha: float) -> np.ndarray:
    """E[W^T W] - J for W = I - alpha sum_j B_j L_j, B_j ~ Bernoulli(p_j) independent."""
    n = laplacians[0].shape[0]
    mean = np.tensordot(p, np.stack(laplacians), axes=1)
    var = np.tensordot(p * (1.0 - p), np.stack(laplacians), axes=1)
    return np.eye(n) - 2.0 * alpha * mean + alpha**2 * (mean @ mean + 2.0 * var) - 1.0 / n


def rho(laplacians: list[np.ndarray], p: np.ndarray, alpha: float) -> float:
    """||E[W^T W] - J||_2 (a PSD matrix: its largest eigenvalue)."""
    return float(np.linalg.eigvalsh(expected_gram(laplacians, p, alpha))[-1])


def mixing_weight(laplacians: list[np.ndarray], p: np.ndarray, connectivity: float) -> tuple[float, float]:
    """(alpha, rho(alpha)) minimising rho over alpha >= 0 (module docstring, step 3).

    rho(0) = 1 and rho(2 / lambda_2(Lbar)) >= 1 (the Fiedler direction), so the convex minimum lies between.
    """
    res = minimize_scalar(lambda a: rho(laplacians, p, a), bounds=(0.0, 2.0 / connectivity), method="bounded",
                          options={"xatol": ALPHA_XTOL})
    return float(res.x), float(res.fun)


class Matcha(WeightedSchedule):
    """MATCHA on n clients over the base graph of receive adjacency `base` (its undirected support).

    Computed once at construction: `matchings`, `probabilities` (p_j), `connectivity` (lambda_2 of the expected
    Laplacian, the optimum of step 2) with `upper_bound` (its certificate), `alpha` and `rho`. No period.
    """

    period = None
    directed = False

    def __init__(self, base: sp.csr_array, budget: float = 0.5, seed: int = 0, name: str = "matcha"):
        self.name = name
        self.n = n = base.shape[0]
        self.budget = check_budget(budget)
        self.seed = _check_seed(seed)
        if n > limits.DENSE_SPECTRAL_LIMIT:
            raise TopologyError(f"matcha on n = {n} clients: its probabilities and alpha take dense eigensolves, "
                                f"refused above topologies.limits.DENSE_SPECTRAL_LIMIT = {limits.DENSE_SPECTRAL_LIMIT}")
        self.matchings = matchings(base)
        if not self.matchings:
            raise TopologyError("matcha needs a base graph with at least one edge")
        self.laplacians = [laplacian(n, edges) for edges in self.matchings]
        self.probabilities, self.connectivity, self.upper_bound = activation_probabilities(self.laplacians,
                                                                                           self.budget)
        if self.connectivity <= 1e-12:
            raise TopologyError("matcha: the base graph is disconnected (its expected Laplacian has lambda_2 = 0)")
        self.alpha, self.rho = mixing_weight(self.laplacians, self.probabilities, self.connectivity)

    def active(self, step: int) -> np.ndarray:
        """[m] bool: which matchings gossip step `step` activates (uniforms from (seed, step) against p_j)."""
        return np.random.default_rng([self.seed, step]).random(len(self.matchings)) < self.probabilities

    def step_matrix(self, step: int) -> sp.csr_array:
        """W_t = I - alpha L_t of gossip step `step`."""
        n = self.n
        on = [edges for edges, active in zip(self.matchings, self.active(step)) if active]
        edges = np.concatenate(on) if on else np.zeros((0, 2), dtype=np.int64)
        degree = np.bincount(edges.ravel(), minlength=n)
        i = np.arange(n, dtype=np.int64)
        rows = np.concatenate([i, edges[:, 0], edges[:, 1]])
        cols = np.concatenate([i, edges[:, 1], edges[:, 0]])
        vals = np.concatenate([1.0 - self.alpha * degree, np.full(2 * len(edges), self.alpha)])
        W = sp.csr_array((vals, (rows, cols)), shape=(n, n))
        W.sum_duplicates()
        return W
