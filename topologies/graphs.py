"""Graph constructors: small pure functions returning a networkx graph on the nodes 0..n-1.

Undirected graphs are `nx.Graph`; the static exponential graph is an `nx.DiGraph` whose edge u -> v means
"u sends to v". Weights are chosen elsewhere (`topologies.weights`); these functions only fix who talks
to whom, and raise ValueError naming the argument and the allowed values on bad input.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import numpy as np


def check_n(n: object, minimum: int = 1) -> int:
    """Return n as an int, or raise if it is not an integer >= minimum."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise ValueError(f"n (number of clients) must be an integer >= {minimum}, got {n!r}")
    return int(n)


def _with_nodes(n: int, edges, directed: bool = False) -> nx.Graph:
    G = nx.DiGraph() if directed else nx.Graph()
    G.add_nodes_from(range(n))
    G.add_edges_from((int(u), int(v)) for u, v in edges if u != v)
    return G


def ring(n: int) -> nx.Graph:
    """Cycle i -- i+1 (mod n). n = 1 is a lone node and n = 2 a single edge."""
    n = check_n(n)
    return _with_nodes(n, ((i, (i + 1) % n) for i in range(n)))


def grid_shape(n: int) -> tuple[int, int]:
    """Near-square factorisation n = r * c with r the largest divisor of n not above sqrt(n)."""
    n = check_n(n)
    r = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return r, n // r


def grid(n: int, shape: tuple[int, int] | None = None, periodic: bool = False) -> nx.Graph:
    """2-D mesh of shape (r, c), node (a, b) = a*c + b; `periodic=True` wraps both sides (torus).

    A wrapped side of length 2 repeats an existing edge and one of length 1 would be a self-loop; both are
    dropped, so the 2 x c torus has degree 3 (as in `nx.grid_2d_graph`).
    """
    n = check_n(n)
    if not isinstance(periodic, (bool, np.bool_)):
        raise ValueError(f"periodic must be True or False, got {periodic!r}")
    if shape is None:
        r, c = grid_shape(n)
    else:
        try:
            r, c = (int(s) for s in shape)
            ok = all(int(s) == s for s in shape)
        except (TypeError, ValueError):
            ok = False
        if not ok or r < 1 or c < 1 or r * c != n:
            raise ValueError(f"shape must be two positive integers (rows, cols) with rows*cols = n = {n}, "
                             f"got {shape!r}")
    edges = []
    for a in range(r):
        for b in range(c):
            if b + 1 < c or (periodic and c > 1):
                edges.append((a * c + b, a * c + (b + 1) % c))
            if a + 1 < r or (periodic and r > 1):
                edges.append((a * c + b, ((a + 1) % r) * c + b))
    return _with_nodes(n, edges)


def exponential_offsets(n: int) -> list[int]:
    """Hops 2^k for k = 0..tau-1, tau = ceil(log2 n): all distinct and < n."""
    n = check_n(n)
    tau = math.ceil(math.log2(n)) if n > 1 else 0
    return [2**k for k in range(tau)]


def exponential(n: int, symmetric: bool = False) -> nx.Graph:
    """Static exponential graph (Ying et al. 2021): i -> i + 2^k (mod n), k = 0..ceil(log2 n)-1.

    Directed (`nx.DiGraph`) by default; `symmetric=True` gives the undirected circulant graph with offsets
    +-2^k (the offset n/2 adds a single neighbour).
    """
    n = check_n(n)
    if not isinstance(symmetric, (bool, np.bool_)):
        raise ValueError(f"symmetric must be True or False, got {symmetric!r}")
    edges = [(i, (i + h) % n) for i in range(n) for h in exponential_offsets(n)]
    return _with_nodes(n, edges, directed=not symmetric)


def full(n: int) -> nx.Graph:
    """Complete graph K_n."""
    return nx.complete_graph(check_n(n))


def star(n: int) -> nx.Graph:
    """Star with centre 0 and leaves 1..n-1 (n nodes in total, unlike `nx.star_graph`)."""
    n = check_n(n)
    return _with_nodes(n, ((0, i) for i in range(1, n)))


def hypercube(n: int) -> nx.Graph:
    """Hypercube on n = 2^d nodes: i -- i XOR 2^b for each bit b."""
    n = check_n(n)
    if n & (n - 1):
        raise ValueError(f"hypercube needs n to be a power of 2 (1, 2, 4, 8, ...), got n = {n}")
    d = n.bit_length() - 1
    return _with_nodes(n, ((i, i ^ (1 << b)) for i in range(n) for b in range(d)))


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def _require_connected(G: nx.Graph, what: str, advice: str) -> nx.Graph:
    if len(G) > 0 and not nx.is_connected(G):
        k = nx.number_connected_components(G)
        raise ValueError(f"{what} is disconnected ({k} components): {advice}")
    return G


def random_regular(n: int, degree: int | None = None, seed: int = 0) -> nx.Graph:
    """Random `degree`-regular graph (`nx.random_regular_graph`); must come out connected."""
    n = check_n(n)
    seed = _check_seed(seed)
    if degree is None:
        raise ValueError("random-regular needs option degree (an integer, 0 <= degree < n, n*degree even)")
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or not 0 <= degree < n \
            or (n * degree) % 2:
        raise ValueError(f"degree must be an integer with 0 <= degree < n = {n} and n*degree even, "
                         f"got {degree!r}")
    G = nx.random_regular_graph(int(degree), n, seed=seed)
    G = _with_nodes(n, G.edges())
    return _require_connected(G, f"random-regular graph (n={n}, degree={degree}, seed={seed})",
                              "raise degree or change seed")


def erdos_renyi(n: int, p: float | None = None, seed: int = 0) -> nx.Graph:
    """Erdős–Rényi G(n, p) (`nx.erdos_renyi_graph`); must come out connected."""
    n = check_n(n)
    seed = _check_seed(seed)
    if p is None:
        raise ValueError("erdos-renyi needs option p (edge probability, 0 <= p <= 1)")
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) or not 0 <= p <= 1:
        raise ValueError(f"p must be a number with 0 <= p <= 1, got {p!r}")
    G = _with_nodes(n, nx.erdos_renyi_graph(n, float(p), seed=seed).edges())
    return _require_connected(G, f"erdos-renyi graph G(n={n}, p={p}, seed={seed})",
                              "raise p (connected w.h.p. when p > ln(n)/n) or change seed")


def from_networkx(graph: nx.Graph, n: int | None = None) -> nx.Graph:
    """Copy of `graph` relabelled 0..n-1 in sorted node order (insertion order if nodes do not sort).

    Self-loops are dropped (self weights come from the weight scheme); directedness is kept.
    """
    if not isinstance(graph, nx.Graph):
        raise ValueError(f"graph must be a networkx Graph or DiGraph, got {type(graph).__name__}")
    if isinstance(graph, nx.MultiGraph):
        raise ValueError("graph must be a simple networkx Graph or DiGraph, not a multigraph")
    nodes = list(graph)
    try:
        nodes = sorted(nodes)
    except TypeError:
        pass
    if n is not None and check_n(n) != len(nodes):
        raise ValueError(f"n = {n} does not match the {len(nodes)} nodes of the given graph")
    check_n(len(nodes))
    index = {v: i for i, v in enumerate(nodes)}
    edges = ((index[u], index[v]) for u, v in graph.edges())
    return _with_nodes(len(nodes), edges, directed=graph.is_directed())


def from_edge_list(path: str | Path, n: int | None = None) -> nx.Graph:
    """Undirected graph from a text file with one edge `u v` per line (integers in 0..n-1).

    Blank lines and `#` comments are ignored; n defaults to the largest node + 1.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path: edge-list file {str(path)!r} does not exist")
    edges = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        try:
            u, v = (int(f) for f in fields)
        except ValueError:
            raise ValueError(f"{path}:{lineno}: expected two integer node ids 'u v', got {line.strip()!r}") \
                from None
        if u < 0 or v < 0:
            raise ValueError(f"{path}:{lineno}: node ids must be >= 0, got {line.strip()!r}")
        edges.append((u, v))
    biggest = max((max(e) for e in edges), default=-1)
    if n is None:
        n = biggest + 1
    n = check_n(n)
    if biggest >= n:
        raise ValueError(f"{path}: node id {biggest} is out of range for n = {n} (ids must be 0..n-1)")
    return _with_nodes(n, edges)


def support(W: np.ndarray) -> nx.Graph:
    """Communication graph of a weight matrix: edge j -> i wherever W[i, j] != 0 (i != j).

    Undirected when W's support is symmetric, directed otherwise.
    """
    A = (W != 0) & ~np.eye(len(W), dtype=bool)
    directed = not np.array_equal(A, A.T)
    recv, send = np.nonzero(A)
    return _with_nodes(len(W), zip(send.tolist(), recv.tolist()), directed=directed)
