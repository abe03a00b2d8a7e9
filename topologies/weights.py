"""Weight schemes: graph -> gossip matrix W (row = receiver, x_i <- sum_l W[i, l] x_l), float64.

d_i is the degree without self-loop. On undirected graphs:
- metropolis: w_ij = 1/(1 + max(d_i, d_j)) per edge, w_ii = 1 - sum_j w_ij (symmetric, doubly stochastic);
- uniform:    w_ij = 1/(d_i + 1) per edge and on the diagonal (doubly stochastic on regular graphs only,
              so irregular graphs are refused);
- max-degree: w_ij = 1/(1 + d_max) per edge, w_ii = 1 - d_i/(1 + d_max);
- lazy:       (I + W_base)/2 of another scheme (option `base`, default metropolis): eigenvalues >= 0;
- fastest:    fastest-mixing weights, see `topologies.fastest`.
On directed graphs (edge j -> i puts weight in W[i, j]) only what stays doubly stochastic is offered:
metropolis and uniform need a regular digraph (in-degree = out-degree = d at every node), where both are
1/(d + 1) — the natural weights of the static exponential graph; max-degree needs in-degree = out-degree at
every node; lazy works on top of those; fastest is refused (its method assumes a symmetric W).
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from topologies.fastest import fastest_mixing

SCHEMES = ("metropolis", "uniform", "max-degree", "lazy", "fastest")
LAZY_BASES = ("metropolis", "uniform", "max-degree", "fastest")


def receive_adjacency(G: nx.Graph) -> np.ndarray:
    """A[i, j] = 1.0 when i receives from j (edge j -> i, or the undirected edge i -- j); zero diagonal."""
    A = nx.to_numpy_array(G, nodelist=range(len(G)), weight=None, dtype=np.float64).T
    np.fill_diagonal(A, 0.0)
    return np.ascontiguousarray(A)


def _directed_regular_degree(A: np.ndarray, scheme: str) -> int:
    indeg, outdeg = A.sum(axis=1), A.sum(axis=0)
    if not (np.array_equal(indeg, outdeg) and np.all(indeg == indeg[0])):
        raise ValueError(f"weights {scheme!r} on a directed graph need every node to have in-degree = "
                         f"out-degree = d (a regular digraph); use 'max-degree' on a balanced digraph")
    return int(indeg[0]) if len(indeg) else 0


def _with_diagonal(offdiag: np.ndarray) -> np.ndarray:
    W = offdiag
    W[np.diag_indices_from(W)] = 1.0 - W.sum(axis=1)
    return W


def metropolis(G: nx.Graph) -> np.ndarray:
    """Metropolis–Hastings: w_ij = 1/(1 + max(d_i, d_j)) on each edge, w_ii = 1 - sum_j w_ij."""
    A = receive_adjacency(G)
    if G.is_directed():
        d = _directed_regular_degree(A, "metropolis")
        return _with_diagonal(A / (d + 1.0))
    deg = A.sum(axis=1)
    return _with_diagonal(A / (1.0 + np.maximum.outer(deg, deg)))


def uniform(G: nx.Graph, name: str = "graph") -> np.ndarray:
    """w_ij = 1/(d_i + 1) on each edge and on the diagonal; refused on irregular graphs."""
    A = receive_adjacency(G)
    if G.is_directed():
        d = _directed_regular_degree(A, "uniform")
        return _with_diagonal(A / (d + 1.0))
    deg = A.sum(axis=1)
    if len(deg) and deg.min() != deg.max():
        raise ValueError(f"weights 'uniform' (1/(deg+1)) are not doubly stochastic on the irregular {name} "
                         f"(degrees {int(deg.min())}..{int(deg.max())}): use 'metropolis' or 'max-degree'")
    return _with_diagonal(A / (deg[:, None] + 1.0))


def max_degree(G: nx.Graph) -> np.ndarray:
    """w_ij = 1/(1 + d_max) on each edge, w_ii = 1 - d_i/(1 + d_max) (d = in-degree on digraphs)."""
    A = receive_adjacency(G)
    if G.is_directed() and not np.array_equal(A.sum(axis=1), A.sum(axis=0)):
        raise ValueError("weights 'max-degree' on a directed graph need in-degree = out-degree at every node")
    dmax = A.sum(axis=1).max() if len(A) else 0.0
    return _with_diagonal(A / (1.0 + dmax))


def lazy(W: np.ndarray) -> np.ndarray:
    """(I + W)/2: same consensus point, all eigenvalues of a symmetric W moved into [0, 1]."""
    return 0.5 * (np.eye(len(W)) + W)


def weight_matrix(G: nx.Graph, scheme: str = "metropolis", base: str | None = None,
                  name: str = "graph") -> np.ndarray:
    """Dispatch a scheme name (see SCHEMES) to its weights; `base` is the scheme under 'lazy'."""
    if scheme not in SCHEMES:
        raise ValueError(f"weights must be one of {', '.join(SCHEMES)}; got {scheme!r}")
    if base is not None and scheme != "lazy":
        raise ValueError(f"option base only applies to weights='lazy', not to weights={scheme!r}")
    if scheme == "lazy":
        base = "metropolis" if base is None else base
        if base not in LAZY_BASES:
            raise ValueError(f"base (the scheme under 'lazy') must be one of {', '.join(LAZY_BASES)}; "
                             f"got {base!r}")
        return lazy(weight_matrix(G, base, name=name))
    if scheme == "metropolis":
        return metropolis(G)
    if scheme == "uniform":
        return uniform(G, name=name)
    if scheme == "max-degree":
        return max_degree(G)
    if G.is_directed():
        raise ValueError("weights 'fastest' need an undirected graph (the method optimises a symmetric W); "
                         "use 'metropolis', 'uniform', 'max-degree' or 'lazy' on directed graphs")
    return fastest(G)


def fastest(G: nx.Graph) -> np.ndarray:
    """Fastest-mixing symmetric weights (projected subgradient from Metropolis, `topologies.fastest`)."""
    W0 = metropolis(G)
    i, j = np.nonzero(np.triu(W0 != 0, k=1) & (receive_adjacency(G) != 0))
    edges = np.stack([i, j], axis=1)
    return fastest_mixing(len(G), edges, W0[i, j])
