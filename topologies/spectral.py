"""Spectral quantities of gossip matrices (TOPOLOGIES.md A1, A3). J = 11^T/n throughout.

- lambda = ||W - J||_2: for a symmetric doubly stochastic W this is max(|lambda_2|, |lambda_n|), the lambda of
  DFedSAM / DFedSAM-MGS (Shi et al. 2023); for a non-symmetric W it is the largest singular value, the
  contraction factor of one gossip step on the disagreement x - Jx.
- Q gossip steps contract by ||W^Q - J||_2 (= lambda^Q for symmetric W); a time-varying schedule by the norm
  of the product of its step matrices minus J.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.linalg import solve_discrete_lyapunov


def _square(W: object, name: str = "W") -> np.ndarray:
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        raise ValueError(f"{name} must be a square [n, n] matrix with n >= 1, got shape {W.shape}")
    return W


def is_symmetric(W: np.ndarray) -> bool:
    return np.allclose(W, W.T, rtol=0.0, atol=1e-12)


def _centred_eigenvalues(W: np.ndarray) -> np.ndarray:
    """Eigenvalues of W - J for symmetric W (the eigenvalue 1 of W becomes 0)."""
    return np.linalg.eigvalsh(W - 1.0 / len(W))


ROUNDOFF = 1e-12


def _clean(lam: float) -> float:
    # exact averaging (W = J, or a one-peer product) leaves ~1e-16 of round-off: report it as 0
    return 0.0 if lam < ROUNDOFF else lam


def disagreement_norm(M: np.ndarray) -> float:
    """||M - J||_2, by a symmetric eigensolver when possible (faster and more accurate than an SVD)."""
    if is_symmetric(M):
        return _clean(float(np.abs(_centred_eigenvalues(M)).max()))
    return _clean(float(np.linalg.norm(M - 1.0 / len(M), 2)))


def check_steps(Q: object) -> int:
    if isinstance(Q, bool) or not isinstance(Q, (int, np.integer)) or Q < 1:
        raise ValueError(f"Q (gossip steps) must be an integer >= 1, got {Q!r}")
    return int(Q)


def second_eigenvalue(W: object) -> float:
    """lambda = ||W - J||_2 (max |eigenvalue| of W other than the eigenvalue 1, for symmetric W)."""
    return disagreement_norm(_square(W))


def spectral_gap(W: object) -> float:
    """1 - lambda."""
    return 1.0 - second_eigenvalue(W)


def gossip_lambda(topology_or_W: object, Q: int) -> float:
    """Contraction of Q gossip steps: ||W^Q - J||_2 for a static W (= lambda^Q when W is symmetric).

    For a time-varying topology (an object with `is_time_varying` and `matrix(step)`, e.g. `Topology`), the
    contraction ||W_{Q-1} ... W_1 W_0 - J||_2 of the product of the Q step matrices starting at step 0.
    """
    Q = check_steps(Q)
    if getattr(topology_or_W, "is_time_varying", False):
        P = topology_or_W.matrix(0)
        for step in range(1, Q):
            P = topology_or_W.matrix(step) @ P
        return disagreement_norm(P)
    W = _square(topology_or_W.W if hasattr(topology_or_W, "matrix") else topology_or_W)
    if is_symmetric(W):
        return _clean(float(np.abs(_centred_eigenvalues(W)).max() ** Q))
    return disagreement_norm(np.linalg.matrix_power(W, Q))


def phi(lam: float, m: int, Q: int) -> float:
    """Phi(lambda, m, Q) = (lam^Q + 1)/((1 - lam)^2 m^(2(Q-1))) + (lam^Q + 1)/(1 - lam^Q)^2.

    The topology term of the DFedSAM-MGS bound (m clients, Q gossip steps); inf when lambda = 1.
    """
    Q = check_steps(Q)
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m (number of clients) must be an integer >= 1, got {m!r}")
    if not 0.0 <= lam <= 1.0 + 1e-9:
        raise ValueError(f"lam must be in [0, 1], got {lam!r}")
    if lam >= 1.0:
        return math.inf
    lq = lam**Q
    return (lq + 1.0) / ((1.0 - lam) ** 2 * float(m) ** (2 * (Q - 1))) + (lq + 1.0) / (1.0 - lq) ** 2


def check_gamma(gamma: object) -> float:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma must be a number with 0 <= gamma < 1, got {gamma!r}")
    return float(gamma)


def _periodic_covariances(Ws: list[np.ndarray], gamma: float) -> list[np.ndarray]:
    """Stationary covariances S_0..S_{tau-1} of x <- W_t (sqrt(gamma) x + xi), t cycling through Ws.

    S_{t+1} = gamma W_t S_t W_t^T + W_t W_t^T. One period composes to S_0 = gamma^tau A S_0 A^T + C with
    A = W_{tau-1}...W_0 and C the period's image of S = 0, a discrete Lyapunov equation for S_0.
    """
    n = len(Ws[0])
    A, C = np.eye(n), np.zeros((n, n))
    for W in Ws:
        A = W @ A
        C = gamma * W @ C @ W.T + W @ W.T
    S = solve_discrete_lyapunov(math.sqrt(gamma ** len(Ws)) * A, C)
    covariances = []
    for W in Ws:
        covariances.append(S)
        S = gamma * W @ S @ W.T + W @ W.T
    return covariances


def effective_neighbors(W: object, gamma: float = 0.951) -> float:
    """Effective number of neighbours n_W(gamma) (Vogels, Hendrikx & Jaggi 2022), in [1, n].

    For the random walk x <- W (sqrt(gamma) x + xi), xi ~ N(0, I), n_W = 1/((1 - gamma) mean_i Var_i) with
    Var_i the stationary variance of worker i. Symmetric W (eigenvalues lambda_k):
    n_W = n / [(1 - gamma) sum_k lambda_k^2 / (1 - gamma lambda_k^2)]. Non-symmetric W: the stationary
    covariance solves S = gamma W S W^T + W W^T (`scipy.linalg.solve_discrete_lyapunov`). A list of matrices
    is a periodic schedule W_0, W_1, ... applied in turn; Var_i is then averaged over the period's phases.
    gamma -> 0 gives n / ||W||_F^2; gamma -> 1 gives n for every connected W.
    """
    gamma = check_gamma(gamma)
    if isinstance(W, Sequence) and not isinstance(W, np.ndarray) and len(W) > 0 \
            and np.ndim(W[0]) == 2:
        Ws = [_square(M, "each matrix of the schedule") for M in W]
        if len({M.shape for M in Ws}) != 1:
            raise ValueError("the matrices of a periodic schedule must all have the same shape")
        n = len(Ws[0])
        mean_var = float(np.mean([np.trace(S) / n for S in _periodic_covariances(Ws, gamma)]))
        return 1.0 / ((1.0 - gamma) * mean_var)
    W = _square(W)
    n = len(W)
    if is_symmetric(W):
        lam2 = np.linalg.eigvalsh(W) ** 2
        return n / ((1.0 - gamma) * float(np.sum(lam2 / (1.0 - gamma * lam2))))
    S = solve_discrete_lyapunov(math.sqrt(gamma) * W, W @ W.T)
    return 1.0 / ((1.0 - gamma) * float(np.trace(S)) / n)


def check_eps(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not 0.0 < eps < 1.0:
        raise ValueError(f"eps must be a number with 0 < eps < 1, got {eps!r}")
    return float(eps)


def consensus_steps_for(lam: float, eps: float) -> int | float:
    """ceil(ln(1/eps) / ln(1/lam)): steps of contraction lam to shrink disagreement by eps.

    0 when lam = 0 and inf when lam = 1.
    """
    eps = check_eps(eps)
    if lam <= 0.0:
        return 0
    if lam >= 1.0:
        return math.inf
    ratio = math.log(eps) / math.log(lam)
    # an exact integer ratio (eps = lam^k) must not round up to k + 1 through float error
    return int(round(ratio)) if abs(ratio - round(ratio)) < 1e-9 else math.ceil(ratio)


def consensus_steps(W: object, eps: float = 0.1) -> int | float:
    """Steps to shrink disagreement by eps: ceil(ln(1/eps) / ln(1/lambda)); 0 if lambda = 0, inf if 1."""
    return consensus_steps_for(second_eigenvalue(W), eps)
