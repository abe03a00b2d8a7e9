"""Time-varying topologies: the communication graph of each gossip step.

A schedule only says who talks to whom at step t; `Topology` turns each step into W_t with a weight scheme.
`period` is the number of steps after which the graphs repeat, or None when they never do. The built-in
schedules give the receive adjacency of a step (`adjacency_at(step)`, CSR, A[i, j] = 1 when i receives from j,
with `directed` saying whether it is a digraph) from index arithmetic and vectorised draws, so a step on
100,000 clients costs milliseconds; `graph_at(step)` builds the networkx graph on demand.
"""

from __future__ import annotations

import math
from typing import Protocol

import networkx as nx
import numpy as np
import scipy.sparse as sp

from topologies.errors import TopologyError
from topologies.graphs import _check_seed, adjacency, check_n, exponential, exponential_offsets, from_adjacency

# random-k draws node by node with `rng.choice` (the original definition, ~6 us per node) up to this many
# clients, and vectorised above (same distribution, different draws): see `RandomK.peers`
RANDOM_K_LOOP_LIMIT = 4096


class Schedule(Protocol):
    """What `Topology` needs of a time-varying schedule (the classes below, or one of the caller's own).

    `n` clients; `period` tau, the steps after which the graphs repeat, or None when they never do;
    `graph_at(step)` the communication graph of a gossip step; `union_graph()` the graph `Topology.graph` shows
    (the union over one period, or step 0's graph without a period).
    """

    n: int

    @property
    def period(self) -> int | None:
        """Steps after which the step graphs repeat (tau), or None when they never do."""

    def graph_at(self, step: int) -> nx.Graph:
        """The communication graph of gossip step `step`."""

    def union_graph(self) -> nx.Graph:
        """Every edge used over one period (step 0's graph when there is no period)."""


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise TopologyError(f"step must be an integer >= 0, got {step!r}")
    return int(step)


class OnePeerExponential:
    """One-peer exponential graph (Ying et al. 2021): at step t node i sends to i + 2^(t mod tau) (mod n).

    tau = ceil(log2 n). Each step graph is a permutation digraph (in- and out-degree 1), so the
    regular-digraph weights give W_t = (I + P^(2^(t mod tau)))/2; the product over tau steps is exactly J
    when n = 2^k.
    """

    directed = True

    def __init__(self, n: int):
        self.n = check_n(n)
        self.hops = exponential_offsets(self.n)
        self.period = max(1, len(self.hops))

    def hop(self, step: int) -> int:
        """The hop of step `step`: 2^(step mod tau), or 0 for a single client (no edges)."""
        step = _check_step(step)
        return self.hops[step % len(self.hops)] if self.hops else 0

    def adjacency_at(self, step: int) -> sp.csr_array:
        """Receive adjacency of step `step`: i receives from i - hop, A[(i + hop) mod n, i] = 1."""
        i = np.arange(self.n, dtype=np.int64)
        return adjacency(self.n, i, (i + self.hop(step)) % self.n, directed=True)

    def graph_at(self, step: int) -> nx.DiGraph:
        """The permutation digraph of step `step`: i -> i + hop (mod n), no edges for a single client."""
        G = nx.DiGraph()
        G.add_nodes_from(range(self.n))
        hop = self.hop(step)
        if hop:
            G.add_edges_from((i, (i + hop) % self.n) for i in range(self.n))
        return G

    def union_graph(self) -> nx.DiGraph:
        """All edges used over one period: the static exponential digraph."""
        return exponential(self.n)


def _distinct_draws(rng: np.random.Generator, m: int, k: int, rows: int) -> np.ndarray:
    """[rows, k] array, each row k distinct integers from 0..m-1, uniform: Floyd's algorithm across rows.

    For j = m-k..m-1 draw v uniform in 0..j and keep v, or j if v was already drawn: each row is a uniform
    k-subset. O(rows k^2) comparisons, k vectorised draws of `rows` integers.
    """
    chosen = np.empty((rows, k), dtype=np.int64)
    for t, j in enumerate(range(m - k, m)):
        v = rng.integers(0, j + 1, size=rows)
        if t:
            v = np.where((chosen[:, :t] == v[:, None]).any(axis=1), j, v)
        chosen[:, t] = v
    return chosen


def _check_k(k: object, n: int, name: str) -> int:
    if k is None:
        raise TopologyError(f"{name} needs option k (peers drawn per node per step, 1 <= k <= n-1)")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n - 1:
        raise TopologyError(f"k must be an integer with 1 <= k <= n-1 = {n - 1}, got {k!r}")
    return int(k)


def draw_peers(n: int, k: int, seed: int, step: int) -> np.ndarray:
    """The peers every client draws at gossip step `step`, from `np.random.default_rng([seed, step])` alone.

    Returns:
        An [n, k] int64 array; row i holds k distinct peers drawn uniformly from the other n - 1 clients (see
        `RandomK` for how: one `rng.choice` per client up to RANDOM_K_LOOP_LIMIT, Floyd's algorithm above).
    """
    rng = np.random.default_rng([seed, step])
    if n <= RANDOM_K_LOOP_LIMIT:
        draws = np.stack([rng.choice(n - 1, size=k, replace=False) for _ in range(n)])
    else:
        draws = _distinct_draws(rng, n - 1, k, n)
    draws = draws.astype(np.int64)
    return draws + (draws >= np.arange(n)[:, None])


class RandomK:
    """Random k-peer gossip: at each step every node draws k distinct peers uniformly at random.

    The draws of step t come from `np.random.default_rng([seed, t])` (so they depend only on (seed, t)); the
    step graph is their union made undirected (i -- j if i drew j or j drew i), so every node has degree >= k,
    and Metropolis (or max-degree) weights on it make W_t symmetric and doubly stochastic. A single W_t may be
    disconnected; the schedule mixes over several steps. There is no period (`period` is None).

    Up to RANDOM_K_LOOP_LIMIT clients node i's peers are `rng.choice(n - 1, size=k, replace=False)` drawn for
    i = 0, 1, ... in turn (the original definition, kept so small runs reproduce); above it all nodes draw at
    once by Floyd's algorithm (`_distinct_draws`): the same distribution, different realisations. A draw
    j >= i means peer j + 1, so nobody draws itself.
    """

    directed = False
    name = "random-k"  # in the error messages of k

    def __init__(self, n: int, k: int | None = None, seed: int = 0):
        self.n = check_n(n, minimum=2)
        self.k = _check_k(k, self.n, self.name)
        self.seed = _check_seed(seed)
        self.period = None

    def peers(self, step: int) -> np.ndarray:
        """[n, k] array: row i holds the k distinct peers node i draws at `step` (never i itself)."""
        return draw_peers(self.n, self.k, self.seed, _check_step(step))

    def adjacency_at(self, step: int) -> sp.csr_array:
        """Undirected union of the draws: A[i, j] = A[j, i] = 1 if i drew j or j drew i."""
        peers = self.peers(step)
        return adjacency(self.n, np.repeat(np.arange(self.n, dtype=np.int64), self.k), peers.ravel(),
                         directed=False)

    def graph_at(self, step: int) -> nx.Graph:
        """The undirected graph of step `step` (see `adjacency_at`)."""
        return from_adjacency(self.adjacency_at(step), directed=False)

    def union_graph(self) -> nx.Graph:
        """Without a period there is no finite union; this is the graph of step 0."""
        return self.graph_at(0)


class RandomPull(RandomK):
    """The DisPFL `random` topology (Dai et al., ICML 2022, code option `cs='random'`): random pulls of k peers.

    At every gossip step each client pulls the models of k peers drawn uniformly from the others and averages
    them with its own.

    Client i's draws at step t are `RandomK`'s (the same `draw_peers(n, k, seed, t)`), but the step graph stays
    directed: j -> i for each peer j that i drew, so in-degree k everywhere and out-degrees vary. Its natural
    weights are row-stochastic, w_ij = 1/(k + 1) on i's draws and itself (DisPFL's `_aggregate_func`:
    x_i <- (x_i + sum_{j drawn} x_j)/(k + 1)), so W_t 1 = 1 but the columns do not sum to 1: the average drifts
    (a biased consensus; `topologies.directed`). No period (`period` is None).
    """

    directed = True
    name = "random-pull"

    def adjacency_at(self, step: int) -> sp.csr_array:
        """A[i, j] = 1 when client i pulls from j at `step` (its `peers(step)`)."""
        peers = self.peers(step)
        return adjacency(self.n, peers.ravel(), np.repeat(np.arange(self.n, dtype=np.int64), self.k), directed=True)

    def graph_at(self, step: int) -> nx.DiGraph:
        """The pull digraph of step `step`: j -> i for each peer j that i drew."""
        return from_adjacency(self.adjacency_at(step), directed=True)


ONE_PEER_MAX_PERIOD = 100_000  # a longer cycle (the lcm of the out-degrees) is treated as having no period


class OnePeer:
    """One-peer schedule of any base graph (BlueFog's `GetDynamicOnePeerSendRecvRanks`): one out-neighbour a step.

    At step t client i sends to one out-neighbour only, the (t mod d_i)-th of its out-neighbours in clockwise
    order, i.e. sorted by (j - i) mod n (d_i its out-degree in the base graph; an undirected edge counts both ways).

    Each step costs one message per client instead of d_i. On the static exponential graph this is exactly the
    one-peer exponential graph (every node cycles through the hops 2^0, 2^1, ...); on a ring it alternates
    i -> i+1 and i -> i-1. A step graph is a permutation (so the regular-digraph weights (I + P_t)/2 are doubly
    stochastic) only when every client receives from exactly one; otherwise (irregular base graphs: a star, a
    non-periodic grid) the receivers get 0, 1 or several models and the step needs the one-sided weights
    ('row-stochastic': a receiver averages what it got; 'column-stochastic': push-sum's split).

    `base`: the receive adjacency of the base graph (CSR, A[i, j] = 1 when i receives from j). `period` is the least
    common multiple of the out-degrees, or None above ONE_PEER_MAX_PERIOD steps.
    """

    directed = True

    def __init__(self, base: sp.csr_array, name: str = "one-peer"):
        A = sp.csr_array(base)
        self.n = n = A.shape[0]
        self.name = name
        coo = sp.coo_array(A)
        keep = coo.row != coo.col
        senders, targets = coo.col[keep].astype(np.int64), coo.row[keep].astype(np.int64)
        # each sender's out-neighbours in clockwise order: sort by (sender, (target - sender) mod n)
        order = np.lexsort(((targets - senders) % n, senders))
        self._targets = targets[order]
        self._degree = np.bincount(senders, minlength=n).astype(np.int64)
        self._start = np.concatenate([[0], np.cumsum(self._degree)[:-1]]).astype(np.int64)
        degrees = sorted(set(self._degree[self._degree > 0].tolist()))
        period = math.lcm(*degrees) if degrees else 1
        self.period = period if period <= ONE_PEER_MAX_PERIOD else None
        self._base = A

    def receivers(self, step: int) -> np.ndarray:
        """[n]: whom each client sends to at `step` (-1 for a client without out-neighbours)."""
        step = _check_step(step)
        out = np.full(self.n, -1, dtype=np.int64)
        has = self._degree > 0
        out[has] = self._targets[self._start[has] + step % self._degree[has]]
        return out

    def adjacency_at(self, step: int) -> sp.csr_array:
        """Receive adjacency of step `step`: A[receivers(step)[i], i] = 1 for every client i that sends."""
        dst = self.receivers(step)
        src = np.arange(self.n, dtype=np.int64)
        keep = dst >= 0
        return adjacency(self.n, src[keep], dst[keep], directed=True)

    def graph_at(self, step: int) -> nx.DiGraph:
        """The digraph of step `step`: i -> receivers(step)[i]."""
        return from_adjacency(self.adjacency_at(step), directed=True)

    def union_graph(self) -> nx.DiGraph:
        """The base graph, as a digraph (every edge one client can send along)."""
        return from_adjacency(self._base, directed=True)


class WeightedSchedule:
    """A schedule that gives W_t itself (`step_matrix(step)`, CSR) rather than a graph for a weight scheme.

    The base of the topologies whose papers define their weights (`topologies.base_graph`, `topologies.equitopo`,
    `topologies.matcha`): the graph of a step is W_t's off-diagonal pattern, directed unless `directed` is False.
    Subclasses set `n`, `period` (None: never repeats) and `directed`, and define `step_matrix`.
    """

    n: int
    period: int | None
    directed: bool

    def step_matrix(self, step: int) -> sp.csr_array:
        """W of gossip step `step`."""
        raise NotImplementedError

    def adjacency_at(self, step: int) -> sp.csr_array:
        """Receive adjacency of step `step`: A[i, j] = 1 where W_t[i, j] != 0, i != j."""
        W = sp.coo_array(self.step_matrix(_check_step(step)))
        keep = (W.row != W.col) & (W.data != 0)
        return adjacency(self.n, W.col[keep], W.row[keep], directed=True)

    def graph_at(self, step: int) -> nx.Graph:
        """The communication graph of step `step` (an nx.Graph when `directed` is False)."""
        return from_adjacency(self.adjacency_at(step), directed=self.directed)

    def union_graph(self) -> nx.Graph:
        """Every edge used over one period; step 0's graph without a period."""
        steps = range(self.period) if self.period is not None else range(1)
        total = self.adjacency_at(0)
        for step in steps[1:]:
            total = total + self.adjacency_at(step)
        return from_adjacency(total, directed=self.directed)
