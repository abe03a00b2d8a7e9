"""Fastest-mixing symmetric weights by projected subgradient (Boyd, Diaconis & Xiao 2004, §5).

Minimise f(w) = ||W(w) - J||_2 over edge weights w >= 0 with W(w) = I - sum_e w_e (e_i - e_j)(e_i - e_j)^T
and weighted degree sum_{e ∋ i} w_e <= 1 (so W is nonnegative). If mu is the eigenvalue of W - J of largest
modulus and u its unit eigenvector, -sign(mu) (u_i - u_j)^2 is a subgradient in w_e; on a tie (the top
eigenvalue of a ring or grid is repeated) the tied eigenvectors' subgradients are averaged (still one).
Steps are alpha_k = STEP / sqrt(k + 1) along the normalised subgradient, projected back onto the constraints,
starting from Metropolis weights and keeping the best iterate — so the result is never worse than Metropolis.
Pure numpy and deterministic; each iteration is one symmetric eigendecomposition (O(n^3)).
"""

from __future__ import annotations

import numpy as np

STEP = 0.2
ITERATIONS = 2000


def edge_matrix(n: int, edges: np.ndarray, w: np.ndarray) -> np.ndarray:
    """W = I - L(w): w_e off the diagonal, 1 - (weighted degree) on it."""
    W = np.zeros((n, n))
    W[edges[:, 0], edges[:, 1]] = w
    W[edges[:, 1], edges[:, 0]] = w
    W[np.diag_indices(n)] = 1.0 - W.sum(axis=1)
    return W


def _project_capped_simplex(z: np.ndarray) -> np.ndarray:
    """Euclidean projection of z >= 0 onto {z >= 0, sum z <= 1} (sort-based, Duchi et al. 2008)."""
    if z.sum() <= 1.0:
        return z
    u = np.sort(z)[::-1]
    css = np.cumsum(u)
    rho = np.nonzero(u - (css - 1.0) / np.arange(1, len(u) + 1) > 0)[0][-1]
    return np.maximum(z - (css[rho] - 1.0) / (rho + 1), 0.0)


def project(n: int, edges: np.ndarray, w: np.ndarray, incident: list[np.ndarray]) -> np.ndarray:
    """Clip to w >= 0, then cap each overloaded node's incident weights to sum 1, node by node.

    Capping only lowers weights, so nodes already fixed stay feasible: the result is feasible (the
    sequential projection of BDX §5, not the exact Euclidean one).
    """
    w = np.maximum(w, 0.0)
    load = np.bincount(edges.ravel(), weights=np.repeat(w, 2), minlength=n)
    for i in np.nonzero(load > 1.0)[0]:
        inc = incident[i]
        w[inc] = _project_capped_simplex(w[inc])
    return w


def fastest_mixing(n: int, edges: np.ndarray, w0: np.ndarray, iterations: int = ITERATIONS) -> np.ndarray:
    """Best W = I - L(w) found by projected subgradient from feasible weights w0 (one per edge i < j)."""
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if len(edges) == 0:
        return np.eye(n)
    incident = [np.nonzero((edges[:, 0] == i) | (edges[:, 1] == i))[0] for i in range(n)]
    J = np.full((n, n), 1.0 / n)
    w = np.asarray(w0, dtype=np.float64).copy()
    best_f, best_w = np.inf, w.copy()
    for k in range(iterations):
        vals, vecs = np.linalg.eigh(edge_matrix(n, edges, w) - J)
        mags = np.abs(vals)
        f = mags.max()
        if f < best_f:
            best_f, best_w = f, w.copy()
        top = np.nonzero(mags >= f - 1e-9)[0]
        diffs = vecs[edges[:, 0]][:, top] - vecs[edges[:, 1]][:, top]
        g = -(np.sign(vals[top]) * diffs**2).mean(axis=1)
        norm = np.linalg.norm(g)
        if norm == 0.0:  # f = 0 already (e.g. W = J on two nodes)
            break
        w = project(n, edges, w - STEP / np.sqrt(k + 1.0) * g / norm, incident)
    return edge_matrix(n, edges, best_w)
