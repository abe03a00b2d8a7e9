"""The Topology object: who talks to whom, with which weights, at every gossip step.

Convention: x_i <- sum_l W[i, l] x_l (row = receiver); all matrices are float64 [n, n].
"""

from __future__ import annotations

import math
from collections.abc import Callable

import networkx as nx
import numpy as np

from topologies import spectral
from topologies.schedules import _check_step
from topologies.validation import check_contraction, check_gossip_matrix, check_stochastic

MAX_CONSENSUS_STEPS = 100_000
_RANDOM_CACHE = 256


class Topology:
    """A validated gossip topology, static or time-varying.

    Static: `W` is the gossip matrix and `matrix(step)` returns it for every step; `period` is 1.
    Time-varying: `matrix(step)` is W_t and `W` raises (there is no single matrix). `period` is tau for a
    periodic schedule (one-peer exponential) and None for one that never repeats (random-k). `graph` is the
    static graph, the union over one period for a periodic schedule, or the graph of step 0 for random-k;
    `graph_at(step)` gives the graph of any step. Construction validates every matrix: nonnegative, row- and
    column-stochastic, symmetric when `symmetric` is promised; a static W must be connected with
    lambda < 1, a periodic schedule's product over one period must have lambda < 1, and random-k matrices
    are checked one by one (stochasticity, symmetry) as they are drawn, since one draw may be disconnected.
    `graph` may be passed as a zero-argument function, built on first use (the complete graph on thousands
    of nodes is costly in networkx and rarely needed; neighbours and degrees then come from W's support).
    """

    def __init__(self, name: str, *, graph: nx.Graph | Callable[[], nx.Graph] | None = None,
                 W: np.ndarray | None = None,
                 schedule: object | None = None, weigh: Callable[[nx.Graph], np.ndarray] | None = None,
                 weights: str = "metropolis", symmetric: bool = True):
        self.name = name
        self.weights = weights
        self.symmetric = symmetric
        self._schedule = schedule
        self._weigh = weigh
        self._cache: dict[int, np.ndarray] = {}
        self._lambda: float | None = None
        if schedule is None:
            if graph is None or W is None:
                raise ValueError("a static Topology needs both graph and W")
            self._graph = graph
            self._W = check_gossip_matrix(W, symmetric, f"W of {name}")
            self._W.flags.writeable = False
            self.n = len(self._W)
            self.period: int | None = 1
        else:
            self.n = schedule.n
            self.period = schedule.period
            self._graph = schedule.union_graph()
            if self.period is None:
                self.matrix(0)
            else:
                for step in range(self.period):
                    self.matrix(step)
                check_contraction(self.period_matrix(), f"the product of the {self.period} step matrices of "
                                  f"{name}", force=True)

    def __repr__(self) -> str:
        kind = f"time-varying, period={self.period}" if self.is_time_varying else "static"
        return f"Topology({self.name!r}, n={self.n}, weights={self.weights!r}, {kind})"

    @property
    def is_time_varying(self) -> bool:
        return self._schedule is not None

    @property
    def graph(self) -> nx.Graph:
        """Static graph; union over one period (periodic schedules); graph of step 0 (random-k)."""
        if callable(self._graph):
            self._graph = self._graph()
        return self._graph

    @property
    def W(self) -> np.ndarray:
        """The gossip matrix of a static topology (read-only); time-varying ones raise, use matrix(step)."""
        if self.is_time_varying:
            raise ValueError(f"{self.name} is time-varying and has no single W: use matrix(step)")
        return self._W

    def graph_at(self, step: int = 0) -> nx.Graph:
        """Communication graph of gossip step `step` (the static graph for every step when static)."""
        step = _check_step(step)
        return self.graph if self._schedule is None else self._schedule.graph_at(step)

    def matrix(self, step: int = 0) -> np.ndarray:
        """W_t of gossip step `step` (read-only); equals W for a static topology."""
        step = _check_step(step)
        if self._schedule is None:
            return self._W
        key = step if self.period is None else step % self.period
        if key not in self._cache:
            if self.period is None and len(self._cache) >= _RANDOM_CACHE:
                self._cache.pop(next(iter(self._cache)))
            W = check_stochastic(self._weigh(self._schedule.graph_at(key)), self.symmetric,
                                 f"W_{key} of {self.name}")
            W.flags.writeable = False
            self._cache[key] = W
        return self._cache[key]

    def period_matrix(self) -> np.ndarray:
        """W_{tau-1} ... W_1 W_0: the product over one period (W itself when static)."""
        if self.period is None:
            raise ValueError(f"{self.name} has no period (random-k never repeats)")
        P = self.matrix(0)
        for step in range(1, self.period):
            P = self.matrix(step) @ P
        return P

    def neighbors(self, i: int, step: int = 0) -> list[int]:
        """Sorted in-neighbours of client i at gossip step `step` (those i receives from), without i."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.n:
            raise ValueError(f"i must be a client index in 0..{self.n - 1}, got {i!r}")
        if callable(self._graph) and self._schedule is None:
            return [int(j) for j in np.nonzero(self._W[i])[0] if j != i]
        G = self.graph_at(step)
        nbrs = G.predecessors(i) if G.is_directed() else G.neighbors(i)
        return sorted(int(j) for j in nbrs if j != i)

    def degrees(self) -> np.ndarray:
        """Out-degrees (no self-loops) of the static graph, or of the graph of step 0 when time-varying."""
        if callable(self._graph) and self._schedule is None:
            # out-degree of j = off-diagonal nonzeros of column j (receiver rows)
            return np.count_nonzero(self._W, axis=0) - (np.diag(self._W) != 0)
        G = self.graph_at(0)
        return np.array([G.out_degree(v) if G.is_directed() else G.degree(v) for v in range(self.n)],
                        dtype=np.int64)

    def second_eigenvalue(self) -> float:
        """lambda = ||W - J||_2; for a periodic schedule the per-step rate ||prod_period - J||_2^(1/tau).

        random-k has no period and raises: use gossip_lambda(Q) (the realised contraction of Q steps).
        """
        if self._lambda is None:
            if self.period is None:
                raise ValueError(f"{self.name} has no period, so no single lambda: use gossip_lambda(Q)")
            lam = spectral.second_eigenvalue(self.period_matrix())
            self._lambda = lam ** (1.0 / self.period)
        return self._lambda

    def spectral_gap(self) -> float:
        """1 - lambda (see second_eigenvalue)."""
        return 1.0 - self.second_eigenvalue()

    def gossip_lambda(self, Q: int) -> float:
        """Contraction of Q gossip steps from step 0 (see `spectral.gossip_lambda`)."""
        if not self.is_time_varying and self.symmetric:
            return self.second_eigenvalue() ** spectral.check_steps(Q)  # reuse the cached lambda
        return spectral.gossip_lambda(self, Q)

    def phi(self, Q: int) -> float:
        """Phi(lambda, m = n, Q) of the DFedSAM-MGS bound."""
        return spectral.phi(self.second_eigenvalue(), self.n, Q)

    def effective_neighbors(self, gamma: float = 0.951) -> float:
        """n_W(gamma) of Vogels et al. 2022; a periodic schedule is solved over one period."""
        if self.period is None:
            raise ValueError(f"{self.name} has no period: effective neighbours are defined for static and "
                             "periodic topologies only")
        if not self.is_time_varying:
            return spectral.effective_neighbors(self._W, gamma)
        return spectral.effective_neighbors([self.matrix(t) for t in range(self.period)], gamma)

    def consensus_steps(self, eps: float = 0.1) -> int | float:
        """Gossip steps to shrink disagreement by eps.

        Static: ceil(ln(1/eps)/ln(1/lambda)). Time-varying: the first T with ||W_{T-1}...W_0 - J||_2 <= eps
        (the norm never grows, since each ||W_t - J||_2 <= 1); inf if not reached within 100000 steps.
        """
        if not self.is_time_varying:
            return spectral.consensus_steps_for(self.second_eigenvalue(), eps)
        eps = spectral.check_eps(eps)
        P = np.eye(self.n)
        for T in range(1, MAX_CONSENSUS_STEPS + 1):
            P = self.matrix(T - 1) @ P
            if spectral.disagreement_norm(P) <= eps:
                return T
        return math.inf
