"""Graph constructors: who talks to whom, as edge arrays, sparse adjacency matrices or networkx graphs.

The closed-form graphs (ring, grid, exponential, star, hypercube) are index arithmetic: `*_edges(n)` return
numpy arrays (src, dst) of edges src -> dst, and `ADJACENCY[name](n, **options)` turns them into a sparse
receive adjacency (CSR, A[i, j] = 1 when i receives from j) without networkx, which is what `build` uses, so
100,000 clients cost milliseconds. The networkx constructors (`ring(n)`, ...) build the same graphs on the
nodes 0..n-1 for whoever wants a graph: undirected graphs are `nx.Graph`; the static exponential graph is an
`nx.DiGraph` whose edge u -> v means "u sends to v". Weights are chosen elsewhere (`topologies.weights`).
Bad input raises ValueError naming the argument and the allowed values.
"""

from __future__ import annotations

import io
import math
import os
import stat
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

import networkx as nx
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from topologies.errors import TopologyError

MAX_N = 2**63 - 1  # numpy and scipy index with 64-bit integers


def check_n(n: object, minimum: int = 1) -> int:
    """Return n as an int, or raise if it is not an integer >= minimum (that fits in 64 bits)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < minimum:
        raise TopologyError(f"n (number of clients) must be an integer >= {minimum}, got {str(n)[:80]!r}")
    if n > MAX_N:
        raise TopologyError(f"n (number of clients) must be an integer that fits in 64 bits (at most 2^63 - 1), "
                            f"got {n}"[:300])
    return int(n)


def _with_nodes(n: int, edges, directed: bool = False) -> nx.Graph:
    G = nx.DiGraph() if directed else nx.Graph()
    G.add_nodes_from(range(n))
    G.add_edges_from((int(u), int(v)) for u, v in edges if u != v)
    return G


def _pairs(src: np.ndarray, dst: np.ndarray):
    return zip(src.tolist(), dst.tolist())


def adjacency(n: int, src: np.ndarray, dst: np.ndarray, directed: bool) -> sp.csr_array:
    """Receive adjacency of the edges src -> dst: A[dst, src] = 1.0 (both ways when undirected).

    Canonical float64 CSR; self-loops dropped and repeated edges counted once.
    """
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    if not directed:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    A = sp.csr_array((np.ones(len(src)), (dst, src)), shape=(n, n))
    A.sum_duplicates()
    A.data[:] = 1.0
    return A


def _edge_arrays(G: nx.Graph) -> tuple[np.ndarray, np.ndarray]:
    flat = np.fromiter((v for e in G.edges() for v in e), dtype=np.int64, count=2 * G.number_of_edges())
    return flat[0::2], flat[1::2]


def adjacency_of(G: nx.Graph) -> tuple[sp.csr_array, bool]:
    """(receive adjacency, directed) of a graph on the nodes 0..n-1 (edge j -> i gives A[i, j] = 1)."""
    return adjacency(len(G), *_edge_arrays(G), G.is_directed()), G.is_directed()


def from_adjacency(A: sp.sparray, directed: bool) -> nx.Graph:
    """The networkx graph on 0..n-1 of a receive adjacency (the nonzero pattern off the diagonal; edge j -> i)."""
    coo = sp.coo_array(A)
    recv, send = coo.row.astype(np.int64), coo.col.astype(np.int64)
    keep = recv != send if directed else send < recv
    return _with_nodes(A.shape[0], _pairs(send[keep], recv[keep]), directed=directed)


def ring_edges(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Edges i -- i+1 (mod n)."""
    i = np.arange(check_n(n), dtype=np.int64)
    return i, (i + 1) % n


def ring(n: int) -> nx.Graph:
    """Cycle i -- i+1 (mod n). n = 1 is a lone node and n = 2 a single edge."""
    n = check_n(n)
    return _with_nodes(n, _pairs(*ring_edges(n)))


def directed_ring(n: int) -> nx.DiGraph:
    """Directed cycle: i sends to i+1 (mod n) only (BlueFog's `RingGraph(n, connect_style=2)`).

    Every node has in- and out-degree 1, so the uniform (or Metropolis) weights are W = (I + P)/2 with P the
    cyclic shift: doubly stochastic, with lambda = ||W - J||_2 = cos(pi/n) (the undirected ring's 1/3 + 2/3
    cos(2 pi/n) is smaller). n = 2 is the single edge both ways; n = 1 a lone node.
    """
    n = check_n(n)
    return _with_nodes(n, _pairs(*ring_edges(n)), directed=n > 2)


def grid_shape(n: int) -> tuple[int, int]:
    """Near-square factorisation n = r * c with r the largest divisor of n not above sqrt(n) ((1, n) for a prime)."""
    n = check_n(n)
    r = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return r, n // r


def _two_dimensional(n: int) -> bool:
    return grid_shape(n)[0] >= 2


def _nearest_grid_counts(n: int) -> str:
    """The client counts nearest to n whose near-square grid has both sides >= 2, e.g. '16 (4 × 4) or 18 (3 × 6)'.

    The nearest smaller count is named only when there is one (n > 4); the nearest larger one always.
    """
    below = next((m for m in range(n - 1, 3, -1) if _two_dimensional(m)), None)
    above = next(m for m in range(n + 1, 2 * n + 4) if _two_dimensional(m))  # n + 1 is even for prime n > 2
    return " or ".join(f"{m} ({' × '.join(map(str, grid_shape(m)))})" for m in (below, above) if m is not None)


def _grid_shape_option(n: int, shape: object, periodic: object) -> tuple[int, int]:
    if not isinstance(periodic, (bool, np.bool_)):
        raise TopologyError(f"periodic must be True or False, got {periodic!r}")
    if shape is None:
        r, c = grid_shape(n)
        if r == 1 and n > 3:
            what, force = (("torus, i.e. a ring", "topology ring, or shape=(1, {n}) to mean it") if periodic else
                           ("path (a ring without its wrap-around edge)", "or shape=(1, {n}) to mean that path"))
            raise TopologyError(
                f"grid: n = {n} clients is prime, so the near-square grid would be a 1 × {n} {what}; use "
                f"{_nearest_grid_counts(n)} clients, {force.format(n=n)} "
                f"(dfl run: --topology-options 'shape=(1,{n})'; dfl topology: --shape 1 {n})")
        return r, c
    values = shape if isinstance(shape, Iterable) else ()  # not iterable: refused below, as a wrong count
    try:
        r, c = (int(s) for s in values)
        ok = all(int(s) == s for s in values)
    except (TypeError, ValueError):
        ok = False
    if not ok or r < 1 or c < 1 or r * c != n:
        raise TopologyError(f"shape must be two positive integers (rows, cols) with rows*cols = n = {n}, "
                            f"got {shape!r}")
    return r, c


def grid_edges(n: int, shape: tuple[int, int] | None = None,
               periodic: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Edges of the (r, c) mesh, node (a, b) = a*c + b: to the right and downwards (wrapping when periodic).

    Per node, its right edge then its down edge (the order of the former double loop over a, b).
    """
    n = check_n(n)
    r, c = _grid_shape_option(n, shape, periodic)
    a, b = np.divmod(np.arange(n, dtype=np.int64), c)
    right = (b + 1 < c) | (periodic and c > 1)
    down = (a + 1 < r) | (periodic and r > 1)
    src = np.stack([a * c + b, a * c + b], axis=1)
    dst = np.stack([a * c + (b + 1) % c, ((a + 1) % r) * c + b], axis=1)
    keep = np.stack([right, down], axis=1)
    return src[keep], dst[keep]


def grid_is_regular(n: int, shape: tuple[int, int] | None = None, periodic: bool = False) -> bool:
    """Whether every node of the (r, c) mesh has the same degree, from n and the options alone (nothing is built).

    A node's degree is the sum of its degrees along the two sides. Along a side of length L that is 2 inside a
    path and 1 at its ends (L >= 3), 1 everywhere for L = 2 (one edge, its wrap-around dropped) and 0 for L = 1; a
    periodic side of length L >= 3 is a cycle, degree 2 everywhere. So the mesh is regular exactly when each side
    is periodic or at most 2 long: the torus, the 2 x 2 square, the single edge. Options are checked as `grid`'s.
    """
    r, c = _grid_shape_option(check_n(n), shape, periodic)
    return all(periodic or side <= 2 for side in (r, c))


def grid(n: int, shape: tuple[int, int] | None = None, periodic: bool = False) -> nx.Graph:
    """2-D mesh of shape (r, c), node (a, b) = a*c + b; `periodic=True` wraps both sides (torus).

    Without `shape` the mesh is near-square (`grid_shape`). A prime n > 3 has no r x c shape with both sides
    >= 2, and its 1 x n "grid" would be a path (a ring with periodic=True): that is a ValueError suggesting the
    nearest counts that factor, unless shape=(1, n) (or (n, 1)) asks for the path explicitly. n <= 3 has no 2-D
    grid at all and stays the 1 x n path. Elongated shapes such as 2 x p (n = 2p) are kept as they are.
    A wrapped side of length 2 repeats an existing edge and one of length 1 would be a self-loop; both are
    dropped, so the 2 x c torus has degree 3 (as in `nx.grid_2d_graph`).
    """
    n = check_n(n)
    return _with_nodes(n, _pairs(*grid_edges(n, shape, periodic)))


def check_exponent_base(exponent_base: object) -> int:
    """The base b of an exponential graph's hops b^k: an integer >= 2."""
    if isinstance(exponent_base, bool) or not isinstance(exponent_base, (int, np.integer)) or exponent_base < 2:
        raise TopologyError(f"exponent_base must be an integer >= 2, got {exponent_base!r}")
    return int(exponent_base)


def exponential_offsets(n: int, exponent_base: int = 2) -> list[int]:
    """Hops b^k for k = 0, 1, ... while b^k < n (b = exponent_base): all distinct and < n.

    For b = 2 these are 2^k, k = 0..ceil(log2 n) - 1. BlueFog's `ExponentialGraph(n, base)` takes the same
    powers (every i < n with log_b i an integer); its default base is 2, its symmetric variant's 4.
    """
    n = check_n(n)
    b = check_exponent_base(exponent_base)
    hops, h = [], 1
    while h < n:
        hops.append(h)
        h *= b
    return hops


def exponential_edges(n: int, exponent_base: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Edges i -> i + b^k (mod n) for every hop b^k < n (per node, in increasing hop)."""
    n = check_n(n)
    hops = np.array(exponential_offsets(n, exponent_base), dtype=np.int64)
    i = np.repeat(np.arange(n, dtype=np.int64), len(hops))
    return i, (i + np.tile(hops, n)) % n


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TopologyError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_symmetric(symmetric: object) -> bool:
    return _check_flag("symmetric", symmetric)


def exponential(n: int, symmetric: bool = False, exponent_base: int = 2) -> nx.Graph:
    """Static exponential graph (Ying et al., NeurIPS 2021): i -> i + b^k (mod n) for every b^k < n.

    Directed (`nx.DiGraph`, BlueFog's `ExponentialGraph(n, base=b)`) by default: every node has in- and
    out-degree tau = the number of hops, so its uniform weights 1/(tau + 1) are doubly stochastic. `symmetric=True`
    gives the undirected circulant graph with offsets +-b^k (the offset n/2 adds a single neighbour).
    `exponent_base` b (default 2; BlueFog's symmetric variant uses 4) trades degree (log_b n) for mixing.
    """
    n = check_n(n)
    symmetric = _check_symmetric(symmetric)
    return _with_nodes(n, _pairs(*exponential_edges(n, exponent_base)), directed=not symmetric)


def full(n: int) -> nx.Graph:
    """Complete graph K_n."""
    return nx.complete_graph(check_n(n))


def _check_centre(n: int, centre: object) -> int:
    if isinstance(centre, bool) or not isinstance(centre, (int, np.integer)) or not 0 <= centre < n:
        raise TopologyError(f"centre must be a client index in 0..{n - 1}, got {centre!r}")
    return int(centre)


def star_edges(n: int, centre: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Edges centre -- i for every other i."""
    n = check_n(n)
    centre = _check_centre(n, centre)
    leaves = np.delete(np.arange(n, dtype=np.int64), centre)
    return np.full_like(leaves, centre), leaves


def star(n: int, centre: int = 0) -> nx.Graph:
    """Star: every client linked to the client `centre` (default 0, as BlueFog's `StarGraph(n, center_rank)`).

    n nodes in total, unlike `nx.star_graph` (n + 1). Its Metropolis weights are 1/n on each spoke, leaving the
    centre 1/n and each leaf 1 - 1/n for itself.
    """
    n = check_n(n)
    return _with_nodes(n, _pairs(*star_edges(n, centre)))


def hypercube_edges(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Edges i -- i XOR 2^b for each bit b of n = 2^d (refused for other n)."""
    n = check_hypercube(check_n(n))
    bits = 1 << np.arange(n.bit_length() - 1, dtype=np.int64)
    i = np.repeat(np.arange(n, dtype=np.int64), len(bits))
    return i, i ^ np.tile(bits, n)


def hypercube(n: int) -> nx.Graph:
    """Hypercube on n = 2^d nodes: i -- i XOR 2^b for each bit b."""
    n = check_n(n)
    return _with_nodes(n, _pairs(*hypercube_edges(n)))


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise TopologyError(f"seed must be an integer >= 0, got {seed!r}")
    return int(seed)


def _require_connected(A: sp.sparray, what: str, advice: str) -> sp.sparray:
    """Raise unless the undirected graph of the symmetric adjacency A is connected (scipy csgraph)."""
    k, _ = connected_components(A, directed=False)
    if A.shape[0] > 0 and k > 1:
        raise TopologyError(f"{what} is disconnected ({k} components): {advice}")
    return A


def check_degree(n: int, degree: object) -> int:
    """random-regular's degree: an integer, 0 <= degree < n, n*degree even."""
    if degree is None:
        raise TopologyError("random-regular needs option degree (an integer, 0 <= degree < n, n*degree even)")
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or not 0 <= degree < n \
            or (n * degree) % 2:
        raise TopologyError(f"degree must be an integer with 0 <= degree < n = {n} and n*degree even, "
                            f"got {degree!r}")
    return int(degree)


def check_probability(p: object) -> float:
    """erdos-renyi's edge probability p in [0, 1]."""
    if p is None:
        raise TopologyError("erdos-renyi needs option p (edge probability, 0 <= p <= 1)")
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating)) or not 0 <= p <= 1:
        raise TopologyError(f"p must be a number with 0 <= p <= 1, got {p!r}")
    return float(p)


def check_hypercube(n: int) -> int:
    """Return n unchanged when it is a power of 2 (the hypercube's 2^d nodes); TopologyError otherwise."""
    if n & (n - 1):
        raise TopologyError(f"hypercube needs n to be a power of 2 (1, 2, 4, 8, ...), got n = {n}")
    return n


def random_regular_edges(n: int, degree: int | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Edges of the random `degree`-regular graph `nx.random_regular_graph(degree, n, seed)`; must be connected."""
    n = check_n(n)
    seed = _check_seed(seed)
    degree = check_degree(n, degree)
    src, dst = _edge_arrays(nx.random_regular_graph(int(degree), n, seed=seed))
    _require_connected(adjacency(n, src, dst, directed=False),
                       f"random-regular graph (n={n}, degree={degree}, seed={seed})", "raise degree or change seed")
    return src, dst


def random_regular(n: int, degree: int | None = None, seed: int = 0) -> nx.Graph:
    """Random `degree`-regular graph (`nx.random_regular_graph`); must come out connected."""
    n = check_n(n)
    return _with_nodes(n, _pairs(*random_regular_edges(n, degree, seed)))


def erdos_renyi_edges(n: int, p: float | None = None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Edges of the Erdős–Rényi graph `nx.erdos_renyi_graph(n, p, seed)` (O(n^2) draws); must be connected."""
    n = check_n(n)
    seed = _check_seed(seed)
    p = check_probability(p)
    src, dst = _edge_arrays(nx.erdos_renyi_graph(n, p, seed=seed))
    _require_connected(adjacency(n, src, dst, directed=False), f"erdos-renyi graph G(n={n}, p={p}, seed={seed})",
                       "raise p (connected w.h.p. when p > ln(n)/n) or change seed")
    return src, dst


def erdos_renyi(n: int, p: float | None = None, seed: int = 0) -> nx.Graph:
    """Erdős–Rényi G(n, p) (`nx.erdos_renyi_graph`); must come out connected."""
    n = check_n(n)
    return _with_nodes(n, _pairs(*erdos_renyi_edges(n, p, seed)))


# receive adjacency (CSR) and directedness of each static built-in topology except `full`, from index
# arithmetic (networkx only for the random graphs): name -> f(n, **options) -> (A, directed)
def _undirected(edges: tuple[np.ndarray, np.ndarray], n: int) -> tuple[sp.csr_array, bool]:
    return adjacency(n, *edges, directed=False), False


def exponential_adjacency(n: int, symmetric: bool = False, exponent_base: int = 2) -> tuple[sp.csr_array, bool]:
    """(receive adjacency, directed) of the static exponential graph: i -> i + b^k (mod n), b^k < n.

    Directed unless `symmetric` (see `exponential`); A[(i + b^k) mod n, i] = 1.
    """
    n = check_n(n)
    directed = not _check_symmetric(symmetric)
    return adjacency(n, *exponential_edges(n, exponent_base), directed=directed), directed


def directed_ring_adjacency(n: int) -> tuple[sp.csr_array, bool]:
    """(receive adjacency, directed) of the directed ring: A[(i + 1) mod n, i] = 1; undirected for n <= 2."""
    n = check_n(n)
    return adjacency(n, *ring_edges(n), directed=n > 2), n > 2


ADJACENCY: dict[str, Callable[..., tuple[sp.csr_array, bool]]] = {
    "ring": lambda n: _undirected(ring_edges(n), n),
    "directed-ring": directed_ring_adjacency,
    "grid": lambda n, shape=None, periodic=False: _undirected(grid_edges(n, shape, periodic), n),
    "exponential": exponential_adjacency,
    "star": lambda n, centre=0: _undirected(star_edges(n, centre), n),
    "hypercube": lambda n: _undirected(hypercube_edges(n), n),
    "random-regular": lambda n, degree=None, seed=0: _undirected(random_regular_edges(n, degree, seed), n),
    "erdos-renyi": lambda n, p=None, seed=0: _undirected(erdos_renyi_edges(n, p, seed), n),
}


def from_networkx(graph: nx.Graph, n: int | None = None) -> nx.Graph:
    """Copy of `graph` relabelled 0..n-1 in sorted node order (insertion order if nodes do not sort).

    Self-loops are dropped (self weights come from the weight scheme); directedness is kept.
    """
    if not isinstance(graph, nx.Graph):
        raise TopologyError(f"graph must be a networkx Graph or DiGraph, got {type(graph).__name__}")
    if isinstance(graph, nx.MultiGraph):
        raise TopologyError("graph must be a simple networkx Graph or DiGraph, not a multigraph")
    nodes = list(graph)
    try:
        nodes = sorted(nodes)
    except TypeError:
        pass
    if n is not None and check_n(n) != len(nodes):
        raise TopologyError(f"n = {n} does not match the {len(nodes)} nodes of the given graph")
    check_n(len(nodes))
    index = {v: i for i, v in enumerate(nodes)}
    edges = ((index[u], index[v]) for u, v in graph.edges())
    return _with_nodes(len(nodes), edges, directed=graph.is_directed())


def check_file(path: str | Path, label: str) -> Path:
    """`path` as a Path if it is a regular file that can be opened (following links).

    Raises:
        ValueError: one line naming it (`label`, e.g. "matrix file 'W.npy'"): missing, a directory, a device or
            pipe (never opened: a pipe would block), or unreadable.
    """
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ValueError(f"{label} does not exist") from None
    except OSError as err:
        raise ValueError(f"{label} could not be read: {err.strerror or err}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{label} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{label} is not a regular file (a device, pipe or socket)")
    return path


def from_edge_list(path: str | Path, n: int | None = None, option: str = "path", directed: bool = False) -> nx.Graph:
    """Graph from a text file with one edge `u v` per line (integers in 0..n-1); `directed=True`: u sends to v.

    Undirected by default (a digraph's `u v` is u -> v, networkx's and BlueFog's convention). Blank lines and `#`
    comments are ignored, and so is anything after the two node ids (the edge data that
    `networkx.write_edgelist` writes, e.g. `0 1 {}` or a weight: the weights come from the scheme). n defaults
    to the largest node + 1. `option` names the option in error messages (path or edges). The graph must be
    connected, so n is at most the number of edge lines + 1: a larger n (given, or implied by a node id such as
    10^12) is refused before any node is made.
    """
    directed = _check_flag("directed", directed)
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"{option}: the path of an edge-list file (one 'u v' per line), got {type(path).__name__}; "
                         "give a networkx graph as graph= instead")
    path = check_file(path, f"{option}: edge-list file {str(path)!r}")
    try:
        text = _utf8(path, f"{option}: edge-list file {str(path)!r}")
    except _Refused as err:
        raise ValueError(str(err)) from None
    except OSError as err:
        raise ValueError(f"{option}: edge-list file {str(path)!r} could not be read: {err.strerror or err}") from None
    edges = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split(maxsplit=2)
        if not fields:
            continue
        try:
            u, v = (int(f) for f in fields[:2])
        except ValueError:
            raise ValueError(f"{path}:{lineno}: expected two integer node ids 'u v', got {line.strip()[:80]!r}") \
                from None
        if u < 0 or v < 0:
            raise ValueError(f"{path}:{lineno}: node ids must be >= 0, got {line.strip()[:80]!r}")
        edges.append((u, v))
    if not edges and n is None:
        raise ValueError(f"{option}: edge-list file {str(path)!r} holds no edges ('u v' lines)")
    biggest = max((max(e) for e in edges), default=-1)
    reach = len(edges) + 1  # a connected graph on k nodes has >= k - 1 edges
    if n is None:
        if biggest + 1 > reach:
            raise ValueError(f"{path}: node id {biggest} makes n = {biggest + 1} clients, but {len(edges)} edge(s) "
                             f"connect at most {reach}: the graph would be disconnected (ids must be 0..n-1)")
        n = biggest + 1
    n = check_n(n)
    if biggest >= n:
        raise ValueError(f"{path}: node id {biggest} is out of range for n = {n} (ids must be 0..n-1)")
    if n > reach:
        raise ValueError(f"{path}: {len(edges)} edge(s) connect at most {reach} clients, not n = {n}: the graph "
                         "would be disconnected")
    return _with_nodes(n, edges, directed=directed)


MATRIX_FORMATS = (".npy", ".csv", ".mtx")
MTX_FIELDS = ("real", "double", "integer")


def load_matrix(path: str | Path) -> np.ndarray | sp.csr_array:
    """A gossip matrix W from a file: `.npy` (numpy), `.csv` (comma-separated rows) or `.mtx` (Matrix Market).

    `.npy` and `.csv` give a dense float64 array, `.mtx` a sparse float64 CSR array (it stays sparse, so
    100,000 clients load in a fraction of a second). The file must hold a square [n, n] matrix of numbers;
    every failure (missing, unreadable, wrong extension, not square, truncated, a pattern or complex .mtx) is a
    one-line ValueError naming the file. Sizes come from the file's header and are checked against the file's
    length before anything is allocated: a header claiming 10^9 x 10^9 in a few bytes is refused at once.
    Entries are not checked here: `topologies.validation` does that.
    """
    name = str(path)
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in MATRIX_FORMATS:
        raise ValueError(f"matrix file {name!r}: unsupported extension {path.suffix or '(none)'!r}; "
                         f"use one of {', '.join(MATRIX_FORMATS)}")
    check_file(path, f"matrix file {name!r}")
    if path.stat().st_size == 0:
        raise ValueError(f"matrix file {name!r} is empty")
    try:
        if suffix == ".npy":
            W = _load_npy(path, name)
        elif suffix == ".csv":
            text = _utf8(path, f"matrix file {name!r}")
            with warnings.catch_warnings():  # an input of blank lines: numpy warns, then returns nothing
                warnings.simplefilter("ignore", UserWarning)
                W = np.loadtxt(io.StringIO(text), delimiter=",", dtype=np.float64, ndmin=2)
        else:
            import scipy.io

            _check_mtx_header(path, name)
            W = scipy.io.mmread(path)
    except _Refused as err:
        raise ValueError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - any parser failure is reported as one line naming the file
        detail = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"matrix file {name!r} could not be read as {suffix}: {detail}") from None
    if sp.issparse(W):
        W = sp.csr_array(W)
    else:
        W = np.asarray(W)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        shape = " × ".join(map(str, W.shape)) or "a scalar"
        raise ValueError(f"matrix in {name} must be square, got {shape}")
    if W.dtype.kind not in "biuf":
        raise ValueError(f"matrix in {name} must hold real numbers, got dtype {W.dtype}")
    return W.astype(np.float64)


class _Refused(ValueError):
    """A matrix file refused with its own message (not a parser's)."""


def _utf8(path: Path, label: str) -> str:
    """The file's text (UTF-8, a byte-order mark dropped).

    Raises:
        _Refused: one line naming `label` (e.g. "matrix file 'W.csv'") for UTF-16 or another encoding, with the
            line and column of the first bad byte.
    """
    data = path.read_bytes()
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise _Refused(f"{label} is UTF-16 text; save it as UTF-8")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise _Refused(f"{label} is not UTF-8 text (byte 0x{data[err.start]:02x} at line {line}, column {column}); "
                       "save it as UTF-8") from None


def _load_npy(path: Path, name: str) -> np.ndarray:
    """The array of a .npy file, as float64.

    Memory-mapped first, so that a header promising more than the file holds is refused before anything is
    allocated.
    """
    with open(path, "rb") as fh:
        if fh.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
            raise _Refused(f"matrix file {name!r} is not a .npy file (it does not start with numpy's magic "
                           "bytes \\x93NUMPY)")
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as err:
        if "mmap length" in str(err):
            raise _Refused(f"matrix file {name!r} is truncated: its header promises more data than the file's "
                           f"{path.stat().st_size} bytes") from None
        raise
    if not isinstance(mapped, np.ndarray):
        raise _Refused(f"matrix file {name!r} holds no array")
    if mapped.ndim != 2 or mapped.shape[0] != mapped.shape[1] or mapped.shape[0] < 1:
        raise _Refused(f"matrix in {name} must be square, got {' × '.join(map(str, mapped.shape)) or 'a scalar'}")
    if mapped.dtype.kind not in "biuf":
        raise _Refused(f"matrix in {name} must hold real numbers, got dtype {mapped.dtype}")
    return np.array(mapped, dtype=np.float64)


def _check_mtx_header(path: Path, name: str) -> None:
    """Refuse a Matrix Market file whose banner or size line cannot give W.

    Refused: not a matrix, a pattern (no weights) or complex field, not square, or more entries than the rest of
    the file can hold (each entry line of a coordinate file has at least 6 bytes, `i j v`; each of an array file
    at least 2), or fewer entries than rows (each row of a stochastic W has a nonzero; a symmetric file stores one
    entry for two).
    """
    label = f"matrix file {name!r}"
    size = path.stat().st_size
    with open(path, "rb") as fh:
        banner = fh.readline(1024).decode("ascii", errors="replace").split()
        if len(banner) != 5 or banner[0].lower() != "%%matrixmarket" or banner[1].lower() != "matrix":
            raise _Refused(f"{label} is not a Matrix Market matrix: its first line must be '%%MatrixMarket matrix "
                           "coordinate real general' (or array, symmetric, ...)")
        layout, field, symmetry = (t.lower() for t in banner[2:])
        if field == "pattern":
            raise _Refused(f"{label} is a pattern matrix (no values): W needs its weights; write the file with "
                           "field real, or give the graph as an edge list (path=) to be weighted by a scheme")
        if field not in MTX_FIELDS or symmetry not in ("general", "symmetric", "skew-symmetric"):
            raise _Refused(f"{label}: field {field!r} and symmetry {symmetry!r}; W must be real (field real or "
                           "integer, symmetry general or symmetric)")
        line = fh.readline(1024)
        while line.startswith(b"%") or (line and not line.strip()):
            line = fh.readline(1 << 16)
        rest = size - fh.tell()
    try:
        dims = [int(t) for t in line.split()]
    except ValueError:
        dims = []
    want = 3 if layout == "coordinate" else 2
    if len(dims) != want or min(dims) < 0:
        raise _Refused(f"{label}: expected the size line '{'rows cols entries' if want == 3 else 'rows cols'}', "
                       f"got {line.decode('ascii', errors='replace').strip()[:80]!r}")
    rows, cols = dims[:2]
    if rows != cols or rows < 1:
        raise _Refused(f"matrix in {name} must be square, got {rows} × {cols}")
    stored = {"general": rows * cols, "symmetric": rows * (rows + 1) // 2, "skew-symmetric": rows * (rows - 1) // 2}
    entries, per_line = (dims[2], 6) if layout == "coordinate" else (stored[symmetry], 2)
    if entries > rest // per_line:
        raise _Refused(f"{label}: its header promises {rows} × {cols} with {entries} entries, but the rest of the "
                       f"file ({rest} bytes) holds at most {rest // per_line}: truncated or a wrong header")
    if layout == "coordinate" and rows > entries * (1 if symmetry == "general" else 2):
        raise _Refused(f"{label}: {entries} entries cannot fill the {rows} rows of a {rows} × {rows} W (every row "
                       "of a stochastic matrix has a nonzero)")


def support(W: object) -> nx.Graph:
    """Communication graph of a weight matrix (dense or sparse): edge j -> i wherever W[i, j] != 0 (i != j).

    Undirected when W's support is symmetric, directed otherwise.
    """
    coo = sp.coo_array(W)
    keep = (coo.data != 0) & (coo.row != coo.col)
    A = adjacency(coo.shape[0], coo.col[keep], coo.row[keep], directed=True)  # W[i, j] != 0: edge j -> i
    directed = (A != A.T).nnz > 0
    return from_adjacency(A, directed)
