"""Weight schemes: graph -> gossip matrix W (row = receiver, x_i <- sum_l W[i, l] x_l), float64.

d_i is the degree without self-loop. On undirected graphs:
- metropolis: w_ij = 1/(1 + max(d_i, d_j)) per edge, w_ii = 1 - sum_j w_ij (symmetric, doubly stochastic);
- uniform:    w_ij = 1/(d_i + 1) per edge and on the diagonal (doubly stochastic on regular graphs only,
              so irregular graphs are refused);
- max-degree: w_ij = 1/(1 + d_max) per edge, w_ii = 1 - d_i/(1 + d_max);
- lazy:       (I + W_base)/2 of another scheme (option `base`, default metropolis): eigenvalues >= 0;
- fastest:    fastest-mixing weights, see `topologies.fastest` (dense, n <= FASTEST_LIMIT).
Three schemes give up one of the two sums, on any graph, directed or not (`KIND` says which sum is kept):
- row-stochastic:    w_ij = 1/(d_in_i + 1) on each edge j -> i and on the diagonal: each client averages what it
                     receives (BlueFog's receive weights; the DisPFL `random` topology). W 1 = 1.
- column-stochastic: w_ij = 1/(d_out_j + 1) on each edge j -> i and w_jj = 1/(d_out_j + 1): each client splits what
                     it sends equally among its out-neighbours and itself (push-sum's weights, Kempe et al. 2003;
                     BlueFog's send weights). 1^T W = 1^T.
- sample-count:      w_ij = s_j / (s_i + sum_{l -> i} s_l) for j = i and each in-neighbour j, with s the clients'
                     sample counts (`sizes`): each client averages its neighbourhood weighted by sample count, as
                     FedAvg weights clients (da-dpfl's neighbour averaging). W 1 = 1.
On a regular digraph (in- = out-degree d everywhere) the first two are both 1/(d + 1): doubly stochastic.
On directed graphs (edge j -> i puts weight in W[i, j]) only what stays doubly stochastic is offered:
metropolis and uniform need a regular digraph (in-degree = out-degree = d at every node), where both are
1/(d + 1) — the natural weights of the static exponential graph; max-degree needs in-degree = out-degree at
every node; lazy works on top of those; fastest is refused (its method assumes a symmetric W).

The schemes work on a sparse receive adjacency A (CSR, A[i, j] = 1 when i receives from j, see
`topologies.graphs.adjacency`) and return canonical CSR matrices in O(nnz): `sparse_weights`. `weight_matrix`
takes a networkx graph and returns the same matrix dense.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import scipy.sparse as sp

from topologies.errors import TopologyError
from topologies.fastest import fastest_mixing
from topologies.graphs import adjacency_of

SCHEMES = ("metropolis", "uniform", "max-degree", "lazy", "fastest", "row-stochastic", "column-stochastic",
           "sample-count")
# the sums each scheme keeps (`topologies.directed.KINDS`); the others are doubly stochastic
KIND = {"row-stochastic": "row", "column-stochastic": "column", "sample-count": "row"}
LAZY_BASES = ("metropolis", "uniform", "max-degree", "fastest")
# the graphs a scheme needs, known before it is built where the topology says (`sparse_weights` refuses the others):
# uniform is doubly stochastic on a regular graph only, fastest optimises a symmetric W (an undirected graph)
NEEDS_REGULAR = ("uniform",)
NEEDS_UNDIRECTED = ("fastest",)
# the options a scheme takes besides the graph, each with the value it has when not given: lazy's base, and
# sample-count's sizes, which have none here (`check_sizes` asks for them; a dfl run passes its partition's)
OPTIONS: dict[str, dict[str, str | None]] = {"lazy": {"base": "metropolis"}, "sample-count": {"sizes": None}}
FASTEST_LIMIT = 2000  # one dense O(n^3) eigendecomposition per iteration, thousands of iterations


# --- sparse schemes on a receive adjacency ------------------------------------------------------------------

def _rows(A: sp.csr_array) -> np.ndarray:
    """Row index of every stored entry of a CSR matrix."""
    return np.repeat(np.arange(A.shape[0], dtype=np.int64), np.diff(A.indptr))


def _in_out_degrees(A: sp.csr_array) -> tuple[np.ndarray, np.ndarray]:
    # in-degree of i = entries of row i (whom i receives from); out-degree of j = entries of column j
    return np.diff(A.indptr).astype(np.float64), np.bincount(A.indices, minlength=A.shape[0]).astype(np.float64)


def _with_weights(A: sp.csr_array, offdiag: np.ndarray, columns: bool = False) -> sp.csr_array:
    """W with the off-diagonal values `offdiag` on A's pattern and w_ii = 1 - sum_j w_ij.

    With `columns`, w_ii = 1 - sum_j w_ji instead, so the columns sum to 1 rather than the rows. Canonical CSR
    without stored zeros (a zero diagonal is left out, so the pattern is the support).
    """
    n = A.shape[0]
    rows = _rows(A)
    diag = 1.0 - np.bincount(A.indices if columns else rows, weights=offdiag, minlength=n)
    idx = np.arange(n, dtype=np.int64)
    W = sp.csr_array((np.concatenate([offdiag, diag]),
                      (np.concatenate([rows, idx]), np.concatenate([A.indices.astype(np.int64), idx]))),
                     shape=(n, n))
    W.sum_duplicates()
    W.eliminate_zeros()
    return W


def _directed_regular_degree(A: sp.csr_array, scheme: str) -> int:
    indeg, outdeg = _in_out_degrees(A)
    if not (np.array_equal(indeg, outdeg) and np.all(indeg == indeg[0])):
        raise TopologyError(f"weights {scheme!r} on a directed graph need every node to have in-degree = "
                            "out-degree = d (a regular digraph); use 'max-degree' on a balanced digraph, or "
                            "'row-stochastic' / 'column-stochastic' (only one of W's sums is 1) on any digraph")
    return int(indeg[0]) if len(indeg) else 0


def sparse_metropolis(A: sp.csr_array, directed: bool) -> sp.csr_array:
    """Metropolis–Hastings: w_ij = 1/(1 + max(d_i, d_j)) on each edge, w_ii = 1 - sum_j w_ij."""
    if directed:
        d = _directed_regular_degree(A, "metropolis")
        return _with_weights(A, np.full(A.nnz, 1.0 / (d + 1.0)))
    deg, _ = _in_out_degrees(A)
    return _with_weights(A, 1.0 / (1.0 + np.maximum(deg[_rows(A)], deg[A.indices])))


def sparse_uniform(A: sp.csr_array, directed: bool, name: str = "graph") -> sp.csr_array:
    """w_ij = 1/(d_i + 1) on each edge and on the diagonal; refused on irregular graphs."""
    if directed:
        d = _directed_regular_degree(A, "uniform")
        return _with_weights(A, np.full(A.nnz, 1.0 / (d + 1.0)))
    deg, _ = _in_out_degrees(A)
    if len(deg) and deg.min() != deg.max():
        raise TopologyError(f"weights 'uniform' (1/(deg+1)) are not doubly stochastic on the irregular {name} "
                            f"(degrees {int(deg.min())}..{int(deg.max())}): use 'metropolis' or 'max-degree'")
    return _with_weights(A, 1.0 / (deg[_rows(A)] + 1.0))


def sparse_max_degree(A: sp.csr_array, directed: bool) -> sp.csr_array:
    """w_ij = 1/(1 + d_max) on each edge, w_ii = 1 - d_i/(1 + d_max) (d = in-degree on digraphs)."""
    indeg, outdeg = _in_out_degrees(A)
    if directed and not np.array_equal(indeg, outdeg):
        raise TopologyError("weights 'max-degree' on a directed graph need in-degree = out-degree at every node")
    dmax = indeg.max() if len(indeg) else 0.0
    return _with_weights(A, np.full(A.nnz, 1.0 / (1.0 + dmax)))


def sparse_row_stochastic(A: sp.csr_array) -> sp.csr_array:
    """w_ij = 1/(d_in_i + 1) on each edge j -> i and on the diagonal (rows sum to 1)."""
    indeg, _ = _in_out_degrees(A)
    return _with_weights(A, 1.0 / (indeg[_rows(A)] + 1.0))


def sparse_column_stochastic(A: sp.csr_array) -> sp.csr_array:
    """w_ij = 1/(d_out_j + 1) on each edge j -> i and w_jj = 1/(d_out_j + 1) (columns sum to 1)."""
    _, outdeg = _in_out_degrees(A)
    return _with_weights(A, 1.0 / (outdeg[A.indices] + 1.0), columns=True)


def check_sizes(sizes: object, n: int) -> np.ndarray:
    """The clients' sample counts as a float array: n numbers > 0 (ValueError naming `sizes` otherwise)."""
    if sizes is None:
        raise TopologyError("weights 'sample-count' need the clients' sample counts: option sizes = [n_1, ..., n_m]")
    try:
        s = np.asarray(sizes, dtype=np.float64)
    except (TypeError, ValueError):
        s = None
    if s is None or s.ndim != 1 or len(s) != n or not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise TopologyError(f"sizes must be {n} sample counts > 0 (one per client), got {sizes!r}")
    return s


def sparse_sample_count(A: sp.csr_array, sizes: object) -> sp.csr_array:
    """w_ij = s_j / (s_i + sum_{l -> i} s_l) for each in-neighbour j and for j = i (rows sum to 1)."""
    s = check_sizes(sizes, A.shape[0])
    rows = _rows(A)
    total = s + np.bincount(rows, weights=s[A.indices], minlength=A.shape[0])
    return _with_weights(A, s[A.indices] / total[rows])


def lazy(W: np.ndarray | sp.sparray) -> np.ndarray | sp.csr_array:
    """(I + W)/2: same consensus point, all eigenvalues of a symmetric W moved into [0, 1] (dense or sparse)."""
    if sp.issparse(W):
        L = sp.csr_array(0.5 * (sp.eye_array(W.shape[0], format="csr") + W))
        L.sum_duplicates()
        L.eliminate_zeros()
        return L
    return 0.5 * (np.eye(len(W)) + W)


def sparse_fastest(A: sp.csr_array, directed: bool) -> sp.csr_array:
    """Fastest-mixing symmetric weights (projected subgradient from Metropolis, `topologies.fastest`); dense inside."""
    n = A.shape[0]
    if directed:
        raise TopologyError("weights 'fastest' need an undirected graph (the method optimises a symmetric W); "
                            "use 'metropolis', 'uniform', 'max-degree' or 'lazy' on directed graphs")
    if n > FASTEST_LIMIT:
        raise TopologyError(f"weights 'fastest' optimise a dense n x n matrix (an O(n^3) eigendecomposition per "
                            f"iteration) and are limited to n <= {FASTEST_LIMIT} clients, got n = {n}: "
                            "use weights='metropolis'")
    W0 = sparse_metropolis(A, directed=False)
    upper = sp.triu(A, k=1, format="coo")  # edges i < j, in row-major order
    order = np.lexsort((upper.col, upper.row))
    i, j = upper.row[order].astype(np.int64), upper.col[order].astype(np.int64)
    edges = np.stack([i, j], axis=1)
    return sp.csr_array(fastest_mixing(n, edges, W0[i, j]))


def check_scheme(scheme: str, base: str | None) -> str | None:
    """Validate a scheme name and its `base`; return the base scheme under 'lazy' (None otherwise)."""
    if scheme not in SCHEMES:
        raise TopologyError(f"weights must be one of {', '.join(SCHEMES)}; got {scheme!r}")
    if base is not None and scheme != "lazy":
        raise TopologyError(f"option base only applies to weights='lazy', not to weights={scheme!r}")
    if scheme != "lazy":
        return None
    return lazy_base(base)


def lazy_base(base: str | None) -> str:
    """The scheme under 'lazy': `base`, or metropolis when None; TopologyError unless one of LAZY_BASES."""
    base = OPTIONS["lazy"]["base"] if base is None else base
    if base not in LAZY_BASES:
        raise TopologyError(f"base (the scheme under 'lazy') must be one of {', '.join(LAZY_BASES)}; got {base!r}")
    return base


def sparse_weights(A: sp.csr_array, directed: bool, scheme: str = "metropolis", base: str | None = None,
                   name: str = "graph", sizes: object = None) -> sp.csr_array:
    """The gossip matrix W of a weight scheme on the receive adjacency A, as canonical CSR.

    The schemes and their formulas are in the module docstring (metropolis: w_ij = 1/(1 + max(d_i, d_j)), ...).

    Args:
        A: receive adjacency, A[i, j] = 1 when i receives from j.
        directed: whether A is a digraph (then only the schemes that stay stochastic on it are offered).
        scheme: one of SCHEMES.
        base: the scheme under 'lazy' (default metropolis); only with 'lazy'.
        name: the graph's name in error messages.
        sizes: the clients' sample counts, for 'sample-count' only.

    Raises:
        TopologyError: an unknown scheme or base, sizes with another scheme, or a scheme the graph does not
            admit (e.g. uniform on an irregular graph).
    """
    check_scheme(scheme, base)
    if sizes is not None and scheme != "sample-count":
        raise TopologyError(f"option sizes (sample counts) applies to weights='sample-count' only, not to {scheme!r}")
    if scheme == "row-stochastic":
        return sparse_row_stochastic(A)
    if scheme == "column-stochastic":
        return sparse_column_stochastic(A)
    if scheme == "sample-count":
        return sparse_sample_count(A, sizes)
    if scheme == "lazy":
        return lazy(sparse_weights(A, directed, lazy_base(base), name=name))
    if scheme == "metropolis":
        return sparse_metropolis(A, directed)
    if scheme == "uniform":
        return sparse_uniform(A, directed, name=name)
    if scheme == "max-degree":
        return sparse_max_degree(A, directed)
    return sparse_fastest(A, directed)


def drop_links(W: sp.csr_array, keep: np.ndarray, scheme: str | None = None, base: str | None = None,
               name: str = "graph") -> sp.csr_array:
    """The gossip matrix of W's undirected graph without the links whose stored entries have keep = False.

    W: canonical CSR with a symmetric pattern; keep: bool per stored entry of W (CSR order), equal for (i, j) and
    (j, i); diagonal entries are kept whatever keep says. O(nnz).
    - scheme given (see SCHEMES; `base` under 'lazy'): that scheme on the surviving graph, e.g. metropolis
      recomputed from the surviving degrees: symmetric and doubly stochastic; a client without links gets w_ii = 1.
    - scheme None: the surviving entries keep their weight and a dropped w_ij moves onto w_ii (w'_ii = w_ii +
      sum of dropped w_ij): a symmetric doubly stochastic W stays so. Keeping all links returns W's values.
    """
    n = W.shape[0]
    rows = _rows(W)
    alive = np.asarray(keep, dtype=bool) | (rows == W.indices)
    off = alive & (rows != W.indices)
    if scheme is not None:  # the surviving receive adjacency, built directly as canonical CSR (W's order kept)
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows[off], minlength=n))]).astype(np.int64)
        A = sp.csr_array((np.ones(int(off.sum())), W.indices[off].astype(np.int64), indptr), shape=(n, n))
        return sparse_weights(A, False, scheme, base, name)
    lost = np.bincount(rows[~alive], weights=W.data[~alive], minlength=n)
    diag = W.diagonal() + lost
    idx = np.arange(n, dtype=np.int64)
    out = sp.csr_array((np.concatenate([W.data[off], diag]),
                        (np.concatenate([rows[off], idx]), np.concatenate([W.indices[off].astype(np.int64), idx]))),
                       shape=(n, n))
    out.sum_duplicates()
    out.eliminate_zeros()
    return out


# --- the same schemes on a networkx graph, dense ------------------------------------------------------------

def weight_matrix(G: nx.Graph, scheme: str = "metropolis", base: str | None = None,
                  name: str = "graph") -> np.ndarray:
    """Dispatch a scheme name (see SCHEMES) to its weights on a graph, dense; `base` is the scheme under 'lazy'."""
    return sparse_weights(*adjacency_of(G), scheme, base, name).toarray()
