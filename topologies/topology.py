"""The Topology object: who talks to whom, with which weights, at every gossip step.

Convention: x_i <- sum_l W[i, l] x_l (row = receiver). Matrices are stored sparse (canonical float64 CSR,
`sparse(step)`); dense [n, n] arrays (`matrix(step)`, `W`) are made from them on demand, up to
topologies.limits.DENSE_LIMIT clients. The complete topology is not stored at all: its W = a I + (1 - a) J is
described by `averaging` = a.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeAlias, TypeVar

import networkx as nx
import numpy as np
import scipy.sparse as sp

from topologies import directed, graphs, limits, spectral
from topologies.directed import check_kind
from topologies.errors import TopologyError
from topologies.schedules import Schedule, _check_step
from topologies.validation import check_connected, check_gossip_matrix, check_stochastic, require_contraction

MAX_CONSENSUS_STEPS = 100_000
_RANDOM_CACHE = 256  # step matrices of a schedule without period kept at most (least recently used first out)
_SPARSE_CACHE_NNZ = 1 << 24  # ... and at most this many stored entries in all (~200 MB), one matrix at least
_DENSE_CACHE_BYTES = 1 << 30  # dense step matrices kept at most (1 GiB), one at least


V = TypeVar("V")
GraphSource: TypeAlias = nx.Graph | Callable[[], nx.Graph]  # a graph, or a function building it on first use


class _LRU(Generic[V]):
    """Least-recently-used cache bounded by a number of entries and a total cost (one entry always fits)."""

    def __init__(self, max_entries: int | None, max_cost: float = math.inf):
        self.max_entries, self.max_cost = max_entries, max_cost
        self._items: OrderedDict[int, tuple[V, float]] = OrderedDict()
        self._cost = 0.0

    def get(self, key: int) -> V | None:
        """The value stored under `key` (now the most recently used), or None."""
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: int, value: V, cost: float) -> None:
        """Store `value` under `key`, then drop the least recently used entries until both bounds hold."""
        self._items[key] = (value, cost)
        self._cost += cost
        while len(self._items) > 1 and ((self.max_entries is not None and len(self._items) > self.max_entries)
                                        or self._cost > self.max_cost):
            _, (_, old) = self._items.popitem(last=False)
            self._cost -= old


def _check_averaging(a: object) -> float:
    if isinstance(a, bool) or not isinstance(a, (int, float, np.floating)) or not 0.0 <= a < 1.0:
        raise TopologyError(f"averaging must be a number with 0 <= a < 1, got {a!r}")
    return float(a)


def averaging_matrix(a: float, n: int) -> np.ndarray:
    """Dense a I + (1 - a) J, with J written exactly (1/n, not 1 - (n-1)/n) when a = 0."""
    J = np.full((n, n), 1.0 / n)
    if a == 0.0:
        return J
    if a == 0.5:
        return 0.5 * (np.eye(n) + J)  # the lazy scheme's own arithmetic
    return a * np.eye(n) + (1.0 - a) * J


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

    `sparse(step)` is W_t as canonical float64 CSR (cached: static always, periodic per step mod period,
    random-k in a small LRU); callers must not modify it. `matrix(step)` / `W` are dense copies, refused above
    topologies.limits.DENSE_LIMIT clients. Exact averaging topologies (`full`) pass `averaging` = a instead of W:
    W = a I + (1 - a) J is then never stored (sparse() refuses above topologies.limits.FULL_SPARSE_LIMIT).
    `graph` may be a networkx graph or a zero-argument function building it on first use (default: the
    support of W); neighbours and degrees come from the graph when one was given, else from W's sparse
    structure. Time-varying topologies take `step_matrix(step)` -> W_t (dense or sparse), or the older pair
    `weigh(schedule.graph_at(step))`.

    `stochastic` says which sums of W are 1 (`topologies.directed`): "doubly" (the default, checked as above),
    "row" or "column" (one-sided W of directed graphs and of the row-/column-stochastic weight schemes). A
    one-sided static W must be primitive (strongly connected and aperiodic: `validation.check_primitive`); a
    one-sided periodic schedule must have a strongly connected union and a positive self-weight at every step
    (the B-connectivity of Nedić & Olshevsky 2015, which makes products of enough steps contract). Its spectral
    quantities are those of `topologies.directed`: second_eigenvalue is |lambda_2| (the asymptotic rate),
    gossip_lambda(Q) the kind's consensus error after Q steps; Phi and the effective number of neighbours are
    defined for doubly stochastic W only. `groups` ([n] group index per client, or None) marks the groups of a
    hierarchical topology (drawing only). `signed=True` accepts negative entries in a time-varying W_t whose
    rows and columns still sum to 1 (MATCHA's I - alpha L_t: `topologies.matcha`); every other W is nonnegative.
    """

    n: int
    period: int | None
    _graph: GraphSource
    _step_matrix: Callable[[int], np.ndarray | sp.sparray]
    _sparse_cache: _LRU[sp.csr_array]
    _dense_cache: _LRU[np.ndarray]

    def __init__(self, name: str, *, graph: GraphSource | None = None,
                 W: np.ndarray | sp.sparray | None = None,
                 schedule: Schedule | None = None, weigh: Callable[[nx.Graph], np.ndarray] | None = None,
                 weights: str = "metropolis", symmetric: bool = True, averaging: float | None = None,
                 n: int | None = None, step_matrix: Callable[[int], np.ndarray | sp.sparray] | None = None,
                 stochastic: str = "doubly", groups: np.ndarray | None = None, signed: bool = False):
        self.name = name
        self.signed = signed
        self.weights = weights
        self.stochastic = check_kind(stochastic)
        self.symmetric = symmetric and stochastic == "doubly"
        self.groups = groups
        self._schedule = schedule
        self._averaging: float | None = None
        self._static: sp.csr_array | None = None
        self._dense: np.ndarray | None = None
        self._lambda: float | None = None
        self._period_lambda: float | None = None
        self._spectra: dict[int, np.ndarray | None] = {}
        self._graph_given = schedule is None and averaging is None and isinstance(graph, nx.Graph)
        if schedule is None:
            self.period = 1
            if averaging is not None:
                self._init_averaging(averaging, n, graph)
            else:
                self._init_static(W, graph)
            return
        self._init_schedule(schedule, step_matrix, weigh)

    def _init_averaging(self, averaging: float, n: int | None, graph: GraphSource | None) -> None:
        """W = a I + (1 - a) J on n clients, described by a alone; the graph is K_n unless one is given."""
        self._averaging = _check_averaging(averaging)
        self.n = graphs.check_n(n)
        self._graph = graph if graph is not None else (lambda: graphs.full(self.n))

    def _init_static(self, W: np.ndarray | sp.sparray | None, graph: GraphSource | None) -> None:
        """A static W, validated and stored as CSR; the graph is W's support unless one is given."""
        if W is None:
            raise TopologyError("a static Topology needs W (or averaging with n)")
        checked = check_gossip_matrix(W, self.symmetric, f"W of {self.name}", self.stochastic)
        static = spectral.as_csr(checked)
        self._static = static
        self.n = static.shape[0]
        self._graph = graph if graph is not None else (lambda: graphs.support(static))

    def _init_schedule(self, schedule: Schedule, step_matrix: Callable[[int], np.ndarray | sp.sparray] | None,
                       weigh: Callable[[nx.Graph], np.ndarray] | None) -> None:
        """A time-varying schedule: its step matrices, their caches, and the check that its products contract.

        Periodic doubly stochastic: ||W_{tau-1} ... W_0 - J||_2 < 1; periodic one-sided: B-connectivity
        (`_check_one_sided_schedule`); random-k: step 0 is drawn and checked (later steps as they are drawn).
        """
        self.n = schedule.n
        self.period = schedule.period
        if step_matrix is None:
            if weigh is None:
                raise TopologyError("a time-varying Topology needs step_matrix (or weigh)")
            step_matrix = lambda step: weigh(schedule.graph_at(step))  # noqa: E731
        self._step_matrix = step_matrix
        self._graph = schedule.union_graph  # built on first use
        self._sparse_cache = _LRU(self.period) if self.period is not None else _LRU(_RANDOM_CACHE, _SPARSE_CACHE_NNZ)
        self._dense_cache = _LRU(self.period or _RANDOM_CACHE, _DENSE_CACHE_BYTES)
        if self.period is None:
            self.sparse(0)
        elif self.stochastic != "doubly":
            self._check_one_sided_schedule(self.period)
        else:
            lam = self._period_product_lambda(self.period)
            require_contraction(lam, f"the product of the {self.period} step matrices of {self.name}")

    def _check_one_sided_schedule(self, period: int) -> None:
        """Every step of one period has a positive diagonal and their union is strongly connected."""
        union = None
        for step in range(period):
            W = self.sparse(step)
            if not np.all(W.diagonal() > 0.0):
                i = int(np.flatnonzero(W.diagonal() <= 0.0)[0])
                raise TopologyError(f"W_{step} of {self.name} gives client {i} no self-weight: a one-sided schedule "
                                    "needs a positive self-weight at every step to converge")
            union = W if union is None else union + W
        check_connected(union, f"the union of the {period} step graphs of {self.name}")

    def _period_product_lambda(self, period: int) -> float:
        """||W_{tau-1} ... W_0 - J||_2 of a periodic schedule (tau = period), computed once."""
        if self._period_lambda is None:
            self._period_lambda = self._product_lambda(period)
        return self._period_lambda

    def __repr__(self) -> str:
        kind = f"time-varying, period={self.period}" if self.is_time_varying else "static"
        return f"Topology({self.name!r}, n={self.n}, weights={self.weights!r}, {kind})"

    @property
    def is_time_varying(self) -> bool:
        """Whether W changes from one gossip step to the next (a schedule was given)."""
        return self._schedule is not None

    @property
    def averaging(self) -> float | None:
        """The a of W = a I + (1 - a) J when every step's W is exactly that (`full`: 0, lazy `full`: 0.5), else None.

        Gossip with such a W is x_i <- a x_i + (1 - a) mean(x): use that instead of a matrix. Set only by
        construction (`full`); other matrices, custom ones included, are not inspected and give None.
        """
        return self._averaging

    @property
    def graph(self) -> nx.Graph:
        """Static graph; union over one period (periodic schedules); graph of step 0 (random-k)."""
        if callable(self._graph):
            self._graph = self._graph()
        return self._graph

    def _given_graph(self) -> nx.Graph | None:
        # a static graph passed in as a graph: neighbours and degrees keep coming from it (one built on demand
        # has W's pattern, which answers faster)
        return self.graph if self._graph_given else None

    def graph_at(self, step: int = 0) -> nx.Graph:
        """Communication graph of gossip step `step` (the static graph for every step when static)."""
        step = _check_step(step)
        return self.graph if self._schedule is None else self._schedule.graph_at(step)

    # --- matrices -------------------------------------------------------------------------------------------

    def _key(self, step: int) -> int:
        return step if self.period is None else step % self.period

    def sparse(self, step: int = 0) -> sp.csr_array:
        """W_t of gossip step `step` as canonical float64 CSR (row = receiver); do not modify it.

        Static topologies return the same matrix for every step. `full` (see `averaging`) is dense: refused
        above topologies.limits.FULL_SPARSE_LIMIT clients.
        """
        step = _check_step(step)
        if self._schedule is None:
            if self._averaging is None:
                return self._static
            if self._static is None:
                limit = limits.FULL_SPARSE_LIMIT
                if self.n > limit:
                    raise TopologyError(f"{self.name} on n = {self.n} clients is a dense matrix (n^2 = {self.n**2} "
                                        f"nonzeros; sparse() stops at topologies.limits.FULL_SPARSE_LIMIT = {limit}): "
                                        f"its W is a I + (1 - a) J with a = averaging = {self._averaging}, so use "
                                        "Topology.averaging (x_i <- a x_i + (1 - a) mean(x)) instead")
                self._static = sp.csr_array(averaging_matrix(self._averaging, self.n))
            return self._static
        key = self._key(step)
        W = self._sparse_cache.get(key)
        if W is None:
            label = f"W_{key} of {self.name}"
            W = spectral.as_csr(check_stochastic(self._step_matrix(key), self.symmetric, label, self.stochastic,
                                                 self.signed), label)
            self._sparse_cache.put(key, W, W.nnz)
        return W

    def _check_dense(self) -> None:
        limit = limits.DENSE_LIMIT
        if self.n > limit:
            raise TopologyError(f"{self.name} has n = {self.n} clients, above topologies.limits.DENSE_LIMIT = "
                                f"{limit}: a dense [n, n] float64 matrix would take {8 * self.n**2 / 2**30:.1f} GiB; "
                                "use sparse(step) (scipy CSR) instead")

    @property
    def W(self) -> np.ndarray:
        """The gossip matrix of a static topology, dense (read-only); time-varying ones raise, use matrix(step)."""
        if self.is_time_varying:
            raise TopologyError(f"{self.name} is time-varying and has no single W: use matrix(step)")
        return self.matrix(0)

    def matrix(self, step: int = 0) -> np.ndarray:
        """W_t of gossip step `step`, dense float64 (read-only); equals W for a static topology.

        Refused above topologies.limits.DENSE_LIMIT clients: use sparse(step).
        """
        step = _check_step(step)
        self._check_dense()
        if self._schedule is None:
            if self._dense is None:
                D = averaging_matrix(self._averaging, self.n) if self._averaging is not None \
                    else self.sparse(0).toarray()
                D.flags.writeable = False
                self._dense = D
            return self._dense
        key = self._key(step)
        D = self._dense_cache.get(key)
        if D is None:
            D = self.sparse(key).toarray()
            D.flags.writeable = False
            self._dense_cache.put(key, D, D.nbytes)
        return D

    def period_matrix(self) -> np.ndarray:
        """W_{tau-1} ... W_1 W_0: the product over one period (W itself when static), dense."""
        if self.period is None:
            raise TopologyError(f"{self.name} has no period (random-k never repeats)")
        P = self.matrix(0)
        for step in range(1, self.period):
            P = self.matrix(step) @ P
        return P

    # --- structure ------------------------------------------------------------------------------------------

    def neighbors(self, i: int, step: int = 0) -> list[int]:
        """Sorted in-neighbours of client i at gossip step `step` (those i receives from), without i."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.n:
            raise TopologyError(f"i must be a client index in 0..{self.n - 1}, got {i!r}")
        step = _check_step(step)
        if self._averaging is not None:
            return [j for j in range(self.n) if j != i]
        G = self._given_graph()
        if G is not None:
            nbrs = G.predecessors(i) if G.is_directed() else G.neighbors(i)
            return sorted(int(j) for j in nbrs if j != i)
        W = self.sparse(step)
        row = W.indices[W.indptr[i]:W.indptr[i + 1]]
        return [int(j) for j in row if j != i]

    def out_degrees(self, step: int = 0) -> np.ndarray:
        """Clients each client sends to at step `step`: off-diagonal nonzeros of each column of W_step."""
        step = _check_step(step)
        if self._averaging is not None:
            return np.full(self.n, self.n - 1, dtype=np.int64)
        W = self.sparse(step)
        return np.bincount(W.indices, minlength=self.n).astype(np.int64) - (W.diagonal() != 0)

    def degrees(self) -> np.ndarray:
        """Out-degrees (no self-loops) of the static graph, or of the graph of step 0 when time-varying."""
        G = self._given_graph()
        if G is not None:
            return np.array([G.out_degree(v) if G.is_directed() else G.degree(v) for v in range(self.n)],
                            dtype=np.int64)
        return self.out_degrees(0)

    # --- spectra --------------------------------------------------------------------------------------------

    def _spectrum(self, key: int) -> np.ndarray | None:
        """FFT eigenvalues of a circulant step matrix (None when not circulant); cached per step of a period."""
        if key not in self._spectra:
            c = spectral.circulant_row(self.sparse(key))
            spectrum = None if c is None else spectral.circulant_spectrum(c)
            if self.period is None:
                return spectrum
            self._spectra[key] = spectrum
        return self._spectra[key]

    def _circulant_spectra(self, steps: int) -> list[np.ndarray] | None:
        """Spectra of the first `steps` step matrices when all are circulant (periodic or static), else None."""
        if self.period is None:
            return None
        period = [self._spectrum(key) for key in range(min(steps, self.period))]
        known = [s for s in period if s is not None]
        if len(known) < len(period):
            return None
        return [known[t % self.period] for t in range(steps)]

    def _large(self) -> bool:
        return self.n > spectral.dense_spectral_limit()

    def _product_lambda(self, steps: int) -> float:
        """||W_{steps-1} ... W_0 - J||_2: dense below DENSE_SPECTRAL_LIMIT, else FFT or Lanczos."""
        if self._large():
            spectra = self._circulant_spectra(steps)
            if spectra is not None:
                return spectral.circulant_lambda(spectra)
        return spectral.product_lambda([self.sparse(t) for t in range(steps)])

    def _one_sided(self, what: str) -> None:
        if self.stochastic != "doubly":
            raise TopologyError(f"{what} is defined for a doubly stochastic W; {self.name} is "
                                f"{self.stochastic}-stochastic (see topologies.directed for what applies to it)")

    def second_eigenvalue(self) -> float:
        """The contraction of one gossip step, lambda = ||W - J||_2 (per step over a period when periodic).

        A periodic schedule has ||W_{tau-1} ... W_0 - J||_2^(1/tau). For a symmetric doubly stochastic W, lambda =
        max(|lambda_2(W)|, |lambda_n(W)|) and the spectral gap is 1 - lambda (e.g. the Metropolis ring on n >= 4
        clients: lambda = 1/3 + 2/3 cos(2 pi/n); `full`: 0).

        A row- or column-stochastic topology has |lambda_2(W)| instead (of the period's product, to the power
        1/tau): the asymptotic rate at which W^t approaches its rank-one limit (`topologies.directed`).

        Raises:
            TopologyError: random-k, which has no period: use gossip_lambda(Q) (the realised contraction of Q
                steps).
        """
        if self._lambda is None:
            if self.period is None:
                raise TopologyError(f"{self.name} has no period, so no single lambda: use gossip_lambda(Q)")
            if self.stochastic != "doubly":
                P = self.sparse(0) if not self.is_time_varying else directed.product(
                    [self.sparse(t) for t in range(self.period)])
                self._lambda = directed.second_eigenvalue_modulus(P) ** (1.0 / self.period)
            elif self._averaging is not None:
                self._lambda = 0.0 if self.n == 1 else self._averaging
            elif not self.is_time_varying:
                self._lambda = spectral.second_eigenvalue(self._static)
            else:
                self._lambda = self._period_product_lambda(self.period) ** (1.0 / self.period)
        return self._lambda

    def spectral_gap(self) -> float:
        """1 - lambda (see second_eigenvalue)."""
        return 1.0 - self.second_eigenvalue()

    def gossip_lambda(self, Q: int) -> float:
        """Contraction of Q gossip steps from step 0: ||W_{Q-1} ... W_0 - J||_2 (lambda^Q for a symmetric static W).

        See `spectral.gossip_lambda`. For a row- or column-stochastic topology, the kind's consensus error of the Q
        steps (`topologies.directed.consensus_error`).
        """
        Q = spectral.check_steps(Q)
        if self.stochastic != "doubly":
            return directed.consensus_error([self.sparse(t) for t in range(Q)], self.stochastic)
        if not self.is_time_varying and self.symmetric:
            return self.second_eigenvalue() ** Q  # reuse the cached lambda
        if self.is_time_varying:
            return self._product_lambda(Q)
        return spectral.gossip_lambda(self, Q)

    def phi(self, Q: int) -> float:
        """Phi(lambda, m = n, Q) of the DFedSAM-MGS bound (doubly stochastic W only)."""
        self._one_sided("Phi")
        return spectral.phi(self.second_eigenvalue(), self.n, Q)

    def stationary(self) -> np.ndarray:
        """The Perron vector pi of W (of the period's product when periodic), with sum pi = 1.

        1/n when doubly stochastic, the left one for row-stochastic W (x <- W x reaches consensus on pi^T x), the
        right one for column-stochastic W (push-sum's weights tend to n pi); see `topologies.directed.stationary`.
        """
        if self.period is None:
            raise TopologyError(f"{self.name} has no period, so no stationary vector")
        if self.stochastic == "doubly":
            return np.full(self.n, 1.0 / self.n)
        P = self.sparse(0) if not self.is_time_varying else directed.product(
            [self.sparse(t) for t in range(self.period)])
        return directed.stationary(P, self.stochastic)

    def effective_neighbors(self, gamma: float = 0.951) -> float:
        """n_W(gamma) of Vogels et al. 2022; a periodic schedule is solved over one period.

        Dense math up to topologies.limits.DENSE_SPECTRAL_LIMIT clients; above it closed forms for `full` and for
        circulant (periodic) topologies, and a ValueError otherwise.
        """
        if self.period is None:
            raise TopologyError(f"{self.name} has no period: effective neighbours are defined for static and "
                                "periodic topologies only")
        self._one_sided("the effective number of neighbours")
        gamma = spectral.check_gamma(gamma)
        if self._averaging is not None:
            return spectral.averaging_neighbors(self._averaging, self.n, gamma)
        if self._large():
            spectra = self._circulant_spectra(self.period)
            if spectra is not None:
                return spectral.circulant_neighbors(spectra, gamma)
        if not self.is_time_varying:
            return spectral.effective_neighbors(self.sparse(), gamma)
        return spectral.effective_neighbors([self.sparse(t) for t in range(self.period)], gamma)

    def consensus_steps(self, eps: float = 0.1) -> int | float:
        """Gossip steps to shrink disagreement by eps.

        Static: ceil(ln(1/eps)/ln(1/lambda)). Time-varying: the first T with ||W_{T-1}...W_0 - J||_2 <= eps
        (the norm never grows, since each ||W_t - J||_2 <= 1); inf if not reached within 100000 steps. Above
        topologies.limits.DENSE_SPECTRAL_LIMIT clients only circulant periodic schedules (one-peer exponential) have
        it (exactly, per Fourier mode); other time-varying topologies raise ValueError. A row- or column-stochastic
        topology: the first T <= topologies.directed.MAX_STEPS whose kind's consensus error is <= eps (dense, up to
        DENSE_SPECTRAL_LIMIT clients), else inf.
        """
        if self.stochastic != "doubly":
            return directed.consensus_steps(self.sparse, self.stochastic, eps, directed.MAX_STEPS)
        if not self.is_time_varying:
            return spectral.consensus_steps_for(self.second_eigenvalue(), eps)
        eps = spectral.check_eps(eps)
        if self._large():
            spectra = self._circulant_spectra(self.period or 1)
            if spectra is None:
                raise TopologyError(f"consensus_steps of the time-varying {self.name} multiplies dense [n, n] step "
                                    f"matrices, refused for n = {self.n} > topologies.limits.DENSE_SPECTRAL_LIMIT = "
                                    f"{spectral.dense_spectral_limit()} (only circulant periodic schedules have a "
                                    "closed form); use gossip_lambda(Q) for given Q instead")
            return spectral.circulant_consensus_steps(spectra, eps, MAX_CONSENSUS_STEPS)
        P = np.eye(self.n)
        for T in range(1, MAX_CONSENSUS_STEPS + 1):
            P = self.matrix(T - 1) @ P
            if spectral.disagreement_norm(P) <= eps:
                return T
        return math.inf
