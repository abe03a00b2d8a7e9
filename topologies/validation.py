"""Checks that a gossip matrix can be used: each failure is a ValueError that names the problem.

Dense arrays and scipy sparse matrices get the same checks and the same messages; the work is O(nnz) on the
sparse form (a dense input is converted), so matrices on 100,000 clients validate in milliseconds. Positions
in messages are the first offending entry in row-major order, as `np.argmin` / `np.argmax` would report;
messages give the amount (a row's sum and how far it is from 1, the two sides of an asymmetry and their
difference) and start with `label` (the file name for a matrix read from a file).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from topologies import directed, spectral
from topologies.directed import check_kind
from topologies.errors import TopologyError

TOL = 1e-9
NORMAL_CHECK_NNZ = 50_000_000  # largest estimated nnz of W W^T for the sparse normality test


def _position(W: sp.csr_array, k: int) -> tuple[int, int]:
    """(row, column) of the k-th stored entry of a CSR matrix."""
    return int(np.searchsorted(W.indptr, k, side="right") - 1), int(W.indices[k])


def _first_max(D: sp.sparray) -> tuple[int, int, float]:
    """Row-major first position of the largest stored value of D (and that value)."""
    coo = sp.coo_array(D)
    top = coo.data.max()
    at = np.nonzero(coo.data == top)[0]
    k = at[np.lexsort((coo.col[at], coo.row[at]))[0]]
    return int(coo.row[k]), int(coo.col[k]), float(top)


def check_stochastic(W: object, symmetric: bool, label: str = "W", kind: str = "doubly",
                     signed: bool = False) -> np.ndarray | sp.csr_array:
    """W must be a finite float64 [n, n] matrix, nonnegative, with rows and columns summing to 1.

    `kind` (one of `directed.KINDS`) relaxes the sums: "row" checks only the rows, "column" only the columns. With
    `symmetric=True` (the scheme promises it) W must also equal its transpose. `signed=True` allows negative
    entries (MATCHA's I - alpha L_t, `topologies.matcha`). Returns W as float64: a dense array for dense input,
    canonical CSR for sparse input.
    """
    check_kind(kind)
    dense = not sp.issparse(W)
    if dense:
        W = np.asarray(W, dtype=np.float64)
        if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
            raise TopologyError(f"{label} must be a square [n, n] matrix with n >= 1, got shape {W.shape}")
    S = spectral.as_csr(W, label)
    bad = np.nonzero(~np.isfinite(S.data))[0]
    if len(bad):
        i, j = _position(S, bad[0])
        raise TopologyError(f"{label} has a non-finite entry at [{i}, {j}]: W[{i}, {j}] = {S.data[bad[0]]}")
    if not signed and S.nnz and S.data.min() < -TOL:
        i, j = _position(S, int(np.argmin(S.data)))
        raise TopologyError(f"{label} is not nonnegative: W[{i}, {j}] = {S[i, j]:.6g}")
    for axis, line, what in ((1, "row", "row-stochastic"), (0, "column", "column-stochastic")):
        if kind not in ("doubly", line):
            continue
        sums = np.asarray(S.sum(axis=axis)).ravel()
        bad = np.nonzero(np.abs(sums - 1.0) > TOL)[0]
        if len(bad):
            total = sums[bad[0]]
            raise TopologyError(f"{label} is not {what}: {line} {bad[0]} sums to {total:.6g} "
                                f"(off by {total - 1.0:+.3g})")
    if symmetric:
        diff = abs(S - S.T)
        if diff.nnz and diff.max() > TOL:
            i, j, gap = _first_max(diff)
            raise TopologyError(f"{label} is not symmetric: W[{i}, {j}] = {S[i, j]:.6g} but "
                                f"W[{j}, {i}] = {S[j, i]:.6g} (difference {gap:.3g})")
    return W if dense else S


def check_connected(W: object, label: str = "W") -> None:
    """The graph of W's nonzeros must be strongly connected (every client reaches every other)."""
    S = spectral.as_csr(W, label)
    k, labels = connected_components(S, directed=True, connection="strong")
    if k > 1:
        lonely = int(np.nonzero(labels != labels[0])[0][0])
        raise TopologyError(f"{label} is disconnected: its graph has {k} (strongly) connected components "
                            f"(client 0 and client {lonely} never exchange information)")


def _is_normal(W: sp.csr_array) -> bool:
    """W W^T = W^T W to 1e-12, by sparse products (skipped, False, when they would be too large)."""
    row_nnz = int(np.diff(W.indptr).max())
    if W.nnz * row_nnz > NORMAL_CHECK_NNZ:
        return False
    D = W @ W.T - W.T @ W
    return D.nnz == 0 or float(abs(D).max()) <= 1e-12


def _contraction_is_guaranteed(W: sp.csr_array) -> bool:
    # connected + positive diagonal makes W primitive (|lambda_i| < 1 for i >= 2), and for a normal W the
    # norm ||W - J||_2 is that largest |lambda_i|: no eigen-solve needed for the built-in schemes
    if not np.all(W.diagonal() > 0.0):
        return False
    return (W != W.T).nnz == 0 or spectral.circulant_row(W) is not None or _is_normal(W)


def require_contraction(lam: float, label: str = "W") -> None:
    """Raise unless lambda = ||label - J||_2 < 1."""
    if lam >= 1.0 - TOL:
        raise TopologyError(f"{label} does not contract: lambda = ||{label} - J||_2 = {lam:.6g} (must be < 1; "
                            "e.g. a bipartite graph with no self weight, use weights 'lazy')")


def check_contraction(W: object, label: str = "W", force: bool = False) -> None:
    """Raise unless lambda = ||W - J||_2 < 1: otherwise the disagreement never shrinks.

    `force` runs the eigen-solve even when the structure of W already guarantees a contraction.
    """
    S = spectral.as_csr(W, label)
    if not force and _contraction_is_guaranteed(S):
        return
    require_contraction(spectral.second_eigenvalue(S), label)


def check_primitive(W: object, label: str = "W") -> None:
    """Raise unless a row- or column-stochastic W is primitive (W^t converges to a rank-one limit).

    Primitive: strongly connected (`check_connected`) and aperiodic. A positive diagonal makes it aperiodic
    without an eigen-solve; otherwise |lambda_2(W)| < 1 is checked densely, up to
    topologies.limits.DENSE_SPECTRAL_LIMIT clients.
    """
    check_connected(W, label)
    S = spectral.as_csr(W, label)
    if np.all(S.diagonal() > 0.0):
        return
    if S.shape[0] > spectral.dense_spectral_limit():
        raise TopologyError(f"{label} has a zero self-weight and n = {S.shape[0]} > topologies.limits."
                            f"DENSE_SPECTRAL_LIMIT = {spectral.dense_spectral_limit()}, so whether W^t converges is "
                            "not checked: give every client a positive self-weight")
    slem = directed.second_eigenvalue_modulus(S)
    if slem >= 1.0 - TOL:
        raise TopologyError(f"{label} does not converge: |lambda_2(W)| = {slem:.6g} (must be < 1; e.g. a directed ring "
                            "with no self weight is periodic: give every client a positive self-weight)")


def check_gossip_matrix(W: object, symmetric: bool, label: str = "W",
                        kind: str = "doubly") -> np.ndarray | sp.csr_array:
    """All checks for a static W; returns W as `check_stochastic` does (dense, or canonical CSR when sparse).

    Checked: stochastic (of `kind`), symmetric when `symmetric`, connected, and contracting (doubly: lambda =
    ||W - J||_2 < 1) or primitive (row, column: `check_primitive`).
    """
    W = check_stochastic(W, symmetric, label, kind)
    if kind != "doubly":
        check_primitive(W, label)
        return W
    check_connected(W, label)
    check_contraction(W, label)
    return W
