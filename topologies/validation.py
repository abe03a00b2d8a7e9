"""Checks that a gossip matrix can be used: each failure is a ValueError that names the problem."""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import connected_components

from topologies.spectral import second_eigenvalue

TOL = 1e-9


def check_stochastic(W: np.ndarray, symmetric: bool, label: str = "W") -> np.ndarray:
    """W must be a finite float64 [n, n] matrix, nonnegative, with rows and columns summing to 1.

    With `symmetric=True` (the scheme promises it) W must also equal its transpose.
    """
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        raise ValueError(f"{label} must be a square [n, n] matrix with n >= 1, got shape {W.shape}")
    if not np.all(np.isfinite(W)):
        i, j = np.argwhere(~np.isfinite(W))[0]
        raise ValueError(f"{label} has a non-finite entry: {label}[{i}, {j}] = {W[i, j]}")
    if W.min() < -TOL:
        i, j = np.unravel_index(np.argmin(W), W.shape)
        raise ValueError(f"{label} is not nonnegative: {label}[{i}, {j}] = {W[i, j]:.6g}")
    for axis, kind, what in ((1, "row", "row-stochastic"), (0, "column", "column-stochastic")):
        sums = W.sum(axis=axis)
        bad = np.nonzero(np.abs(sums - 1.0) > TOL)[0]
        if len(bad):
            raise ValueError(f"{label} is not {what}: {kind} {bad[0]} sums to {sums[bad[0]]:.6g}")
    if symmetric:
        diff = np.abs(W - W.T)
        if diff.max() > TOL:
            i, j = np.unravel_index(np.argmax(diff), W.shape)
            raise ValueError(f"{label} is not symmetric: {label}[{i}, {j}] = {W[i, j]:.6g} but "
                             f"{label}[{j}, {i}] = {W[j, i]:.6g}")
    return W


def check_connected(W: np.ndarray, label: str = "W") -> None:
    """The graph of W's nonzeros must be strongly connected (every client reaches every other)."""
    k, labels = connected_components(csr_array(W != 0), directed=True, connection="strong")
    if k > 1:
        lonely = int(np.nonzero(labels != labels[0])[0][0])
        raise ValueError(f"{label} is disconnected: its graph has {k} (strongly) connected components "
                         f"(client 0 and client {lonely} never exchange information)")


def _contraction_is_guaranteed(W: np.ndarray) -> bool:
    # connected + positive diagonal makes W primitive (|lambda_i| < 1 for i >= 2), and for a normal W the
    # norm ||W - J||_2 is that largest |lambda_i|: no eigen-solve needed for the built-in schemes
    if not np.all(np.diag(W) > 0.0):
        return False
    return bool(np.array_equal(W, W.T) or np.allclose(W @ W.T, W.T @ W, rtol=0.0, atol=1e-12))


def check_contraction(W: np.ndarray, label: str = "W", force: bool = False) -> None:
    """lambda = ||W - J||_2 must be < 1, or the disagreement never shrinks."""
    if not force and _contraction_is_guaranteed(W):
        return
    lam = second_eigenvalue(W)
    if lam >= 1.0 - TOL:
        raise ValueError(f"{label} does not contract: lambda = ||{label} - J||_2 = {lam:.6g} (must be < 1; "
                         "e.g. a bipartite graph with no self weight, use weights 'lazy')")


def check_gossip_matrix(W: np.ndarray, symmetric: bool, label: str = "W") -> np.ndarray:
    """All checks for a static W: stochastic, (symmetric), connected, contracting."""
    W = check_stochastic(W, symmetric, label)
    check_connected(W, label)
    check_contraction(W, label)
    return W
