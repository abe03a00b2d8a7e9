"""Time-varying topologies: the communication graph of each gossip step.

A schedule only says who talks to whom at step t; `Topology` turns each step graph into W_t with a weight
scheme. `period` is the number of steps after which the graphs repeat, or None when they never do.
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from topologies.graphs import _check_seed, check_n, exponential, exponential_offsets


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    return int(step)


class OnePeerExponential:
    """One-peer exponential graph (Ying et al. 2021): at step t node i sends to i + 2^(t mod tau) (mod n).

    tau = ceil(log2 n). Each step graph is a permutation digraph (in- and out-degree 1), so the
    regular-digraph weights give W_t = (I + P^(2^(t mod tau)))/2; the product over tau steps is exactly J
    when n = 2^k.
    """

    def __init__(self, n: int):
        self.n = check_n(n)
        self.hops = exponential_offsets(self.n)
        self.period = max(1, len(self.hops))

    def graph_at(self, step: int) -> nx.DiGraph:
        step = _check_step(step)
        G = nx.DiGraph()
        G.add_nodes_from(range(self.n))
        if self.hops:
            hop = self.hops[step % len(self.hops)]
            G.add_edges_from((i, (i + hop) % self.n) for i in range(self.n))
        return G

    def union_graph(self) -> nx.DiGraph:
        """All edges used over one period: the static exponential digraph."""
        return exponential(self.n)


class RandomK:
    """Random k-peer gossip: at each step every node draws k distinct peers uniformly at random.

    The draws of step t come from `np.random.default_rng([seed, t])` (so they depend only on (seed, t)); the
    step graph is their union made undirected (i -- j if i drew j or j drew i), so every node has degree >= k,
    and Metropolis (or max-degree) weights on it make W_t symmetric and doubly stochastic. A single W_t may be
    disconnected; the schedule mixes over several steps. There is no period (`period` is None).
    """

    def __init__(self, n: int, k: int | None = None, seed: int = 0):
        self.n = check_n(n, minimum=2)
        if k is None:
            raise ValueError("random-k needs option k (peers drawn per node per step, 1 <= k <= n-1)")
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= self.n - 1:
            raise ValueError(f"k must be an integer with 1 <= k <= n-1 = {self.n - 1}, got {k!r}")
        self.k = int(k)
        self.seed = _check_seed(seed)
        self.period = None

    def graph_at(self, step: int) -> nx.Graph:
        step = _check_step(step)
        rng = np.random.default_rng([self.seed, step])
        G = nx.Graph()
        G.add_nodes_from(range(self.n))
        for i in range(self.n):
            draws = rng.choice(self.n - 1, size=self.k, replace=False)
            G.add_edges_from((i, int(j) + (j >= i)) for j in draws)  # skip i itself
        return G

    def union_graph(self) -> nx.Graph:
        """Without a period there is no finite union; this is the graph of step 0."""
        return self.graph_at(0)
