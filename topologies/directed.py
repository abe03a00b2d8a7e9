"""Spectral quantities of row- and column-stochastic gossip matrices (directed graphs, push-sum).

A doubly stochastic W keeps the average: x <- W x converges to x̄ 1 and ||W - J||_2 (`topologies.spectral`) is its
contraction. Once only one side sums to 1 that is no longer the whole story:

- **row-stochastic** (W 1 = 1; each client averages what it receives, e.g. the DisPFL `random` topology):
  W^t -> 1 pi^T with pi the left Perron vector (pi^T W = pi^T, sum pi = 1), so x <- W x reaches consensus on
  pi^T x_0, a weighted average that is biased unless pi = 1/n. Client i's influence on it is n pi_i.
- **column-stochastic** (1^T W = 1^T; each client splits what it sends, e.g. push-sum on a directed graph):
  W^t -> pi 1^T with pi the right Perron vector (W pi = pi), so x <- W x keeps the sum but the iterates
  tend to n pi_i x̄, not x̄. Push-sum (Kempe et al., FOCS 2003; Nedić & Olshevsky, IEEE TAC 2015; Stochastic
  Gradient Push, Assran et al., ICML 2019) also runs the weights y <- W y from y_0 = 1 and reads z_i = x_i / y_i,
  which tends to x̄ exactly: after t steps z_t = diag(P 1)^{-1} P x_0 with P = W^t. The push-sum weights y_t tend
  to n pi; their spread (min_i y_i, max_i y_i) enters the convergence bounds as 1/delta with delta = min y.

What applies to every kind (`consensus_error`), reducing to ||P - J||_2 for a doubly stochastic P:

- doubly: ||P - J||_2;
- row: ||(I - J) P||_2, the contraction of the disagreement around the plain mean (x - x̄ 1 -> (I - J) P x,
  since P J = J), which is what the consensus distance measures;
- column: ||diag(P 1)^{-1} P - J||_2, the error of push-sum's de-biased z after the steps of P (from y_0 = 1).

And per static matrix: the second largest singular value sigma_2(W) (= ||W - J||_2 when W is doubly stochastic),
and the second largest eigenvalue modulus |lambda_2(W)| (the asymptotic per-step rate of W^t -> its limit for
any primitive stochastic W; ||.||_2 of a non-normal W can stay above 1 for a few steps while W^t converges).
All of it is dense math (O(n^3)), refused above topologies.limits.DENSE_SPECTRAL_LIMIT clients, except the
Perron vector, which is one sparse linear solve.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence, Sized

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from topologies import spectral
from topologies.errors import TopologyError

# What a gossip matrix promises (`Topology.stochastic`): rows and columns sum to 1 ("doubly", the default: gossip
# keeps the average), only its rows ("row") or only its columns ("column")
KINDS = ("doubly", "row", "column")
# consensus_steps of a one-sided W multiplies dense matrices step by step and takes a norm each time: bounded here
MAX_STEPS = 10_000


def check_kind(kind: object) -> str:
    """Return `kind` if it is one of KINDS, else raise naming the allowed values."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise TopologyError(f"stochastic must be one of {', '.join(KINDS)}; got {kind!r}")
    return kind


def _dense(W: object, what: str) -> np.ndarray:
    M = spectral.as_csr(W) if sp.issparse(W) else np.asarray(W, dtype=np.float64)
    n = M.shape[0]
    if n > spectral.dense_spectral_limit():
        raise TopologyError(f"{what} uses dense O(n^3) math, refused for n = {n} > "
                            f"topologies.limits.DENSE_SPECTRAL_LIMIT = {spectral.dense_spectral_limit()}")
    return M if isinstance(M, np.ndarray) else M.toarray()


def _size(M: object) -> int:
    """The n of an [n, n] step matrix, dense (its length, not converted) or sparse (canonical CSR's rows)."""
    if sp.issparse(M):
        return spectral.as_csr(M).shape[0]
    if not isinstance(M, Sized):
        raise TopologyError(f"a step matrix must be an [n, n] array or scipy sparse matrix, got {type(M).__name__}")
    return len(M)


def stationary(W: object, kind: str) -> np.ndarray:
    """The Perron vector pi of a stochastic W, normalised to sum pi = 1.

    The left one (pi^T W = pi^T) for "row", the right one (W pi = pi) for "column", 1/n for "doubly". One sparse
    linear solve of (M - I) pi = 0 with the last equation replaced by sum pi = 1 (M = W^T for row, W for column):
    unique when W's graph is strongly connected. ValueError when the solve fails (a disconnected W).
    """
    kind = check_kind(kind)
    S = spectral.as_csr(W)
    n = S.shape[0]
    if kind == "doubly" or n == 1:
        return np.full(n, 1.0 / n)
    M = sp.lil_array((S.T if kind == "row" else S) - sp.eye_array(n, format="csr"))
    M[n - 1, :] = np.ones(n)
    b = np.zeros(n)
    b[-1] = 1.0
    with np.errstate(all="ignore"):
        pi = spla.spsolve(sp.csc_array(M), b)
    residual = (S.T @ pi if kind == "row" else S @ pi) - pi if np.all(np.isfinite(pi)) else None
    if residual is None or np.abs(residual).max() > 1e-8:
        raise TopologyError("W has no unique stationary vector (its graph is not strongly connected)")
    return np.clip(pi, 0.0, None) / np.clip(pi, 0.0, None).sum()


def influence(W: object, kind: str) -> tuple[float, float]:
    """(min_i n pi_i, max_i n pi_i): 1 and 1 for a doubly stochastic W.

    Row-stochastic: each client's weight in the consensus value pi^T x_0 relative to the plain mean. Column-
    stochastic: the limit of push-sum's weights y_t = W^t 1 (n pi), whose minimum is the delta of the bounds.
    """
    pi = stationary(W, kind) * spectral.as_csr(W).shape[0]
    return float(pi.min()), float(pi.max())


def second_singular_value(W: object) -> float:
    """sigma_2(W), the second largest singular value (0 for n = 1); = ||W - J||_2 for a doubly stochastic W."""
    D = _dense(W, "second_singular_value")
    if len(D) == 1:
        return 0.0
    return spectral._clean(float(np.linalg.svd(D, compute_uv=False)[1]))


def second_eigenvalue_modulus(W: object) -> float:
    """|lambda_2(W)|: the second largest eigenvalue modulus (W's eigenvalue 1 removed once; 0 for n = 1).

    For a primitive stochastic W, W^t converges to its rank-one limit at this rate per step; 1 when W is not
    primitive (disconnected, or periodic such as a directed ring without self-weights).
    """
    D = _dense(W, "second_eigenvalue_modulus")
    if len(D) == 1:
        return 0.0
    moduli = np.sort(np.abs(np.linalg.eigvals(D)))[::-1]
    return spectral._clean(float(min(moduli[1], 1.0)))


def consensus_error(P: object, kind: str) -> float:
    """The kind's disagreement after the steps of P (a product of step matrices, dense or sparse; module doc).

    ||P - J||_2 (doubly), ||(I - J) P||_2 (row), ||diag(P 1)^{-1} P - J||_2 (column; inf if some P 1 is 0).
    A list of step matrices [W_0, W_1, ...] (W_0 acts first) stands for their product; above
    topologies.limits.DENSE_SPECTRAL_LIMIT clients it is never formed: the norm is the square root of the largest
    eigenvalue of A^T A by Lanczos (`spectral.lanczos_extremes`), A applied step by step.
    """
    kind = check_kind(kind)
    mats = list(P) if isinstance(P, (list, tuple)) else [P]
    n = _size(mats[0])
    if n > spectral.dense_spectral_limit():
        return _iterative_error([spectral.as_csr(M) for M in mats], kind)
    D = product(mats)
    if kind == "doubly":
        return spectral.disagreement_norm(D)
    if kind == "row":
        return spectral._clean(float(np.linalg.norm(D - D.mean(axis=0), 2)))
    y = D.sum(axis=1)
    if np.any(y <= 0):
        return math.inf
    return spectral._clean(float(np.linalg.norm(D / y[:, None] - 1.0 / len(D), 2)))


def _iterative_error(mats: list[sp.csr_array], kind: str) -> float:
    transposed = [M.T.tocsr() for M in reversed(mats)]
    n = mats[0].shape[0]

    def forward(x: np.ndarray) -> np.ndarray:
        for M in mats:
            x = M @ x
        return x

    def backward(x: np.ndarray) -> np.ndarray:
        for M in transposed:
            x = M @ x
        return x

    y = forward(np.ones(n)) if kind == "column" else None
    if y is not None and np.any(y <= 0):
        return math.inf

    def normal(x: np.ndarray) -> np.ndarray:  # A^T A x
        if kind == "row":  # A = (I - J) P
            a = forward(x)
            return backward(a - a.mean())
        if kind == "column":  # A = diag(1/y) P - J
            a = forward(x) / y - x.mean()
            return backward(a / y) - a.mean()
        a = forward(x) - x.mean()  # A = P - J
        return backward(a) - a.mean()

    _, hi = spectral.lanczos_extremes(normal, n)
    return spectral._clean(math.sqrt(max(hi, 0.0)))


def product(mats: Sequence[object]) -> np.ndarray:
    """M_{k-1} ... M_0 (M_0 acts first), dense; refused above DENSE_SPECTRAL_LIMIT."""
    P = _dense(mats[0], "the product of step matrices")
    for M in mats[1:]:
        P = (spectral.as_csr(M) @ P) if sp.issparse(M) else np.asarray(M) @ P
    return np.asarray(P)


def pushsum_weights(mats: Sequence[object]) -> np.ndarray:
    """[T, n]: push-sum's weights y_t = W_{t-1} ... W_0 1 after each of the T = len(mats) steps (O(T nnz))."""
    y = np.ones(spectral.as_csr(mats[0]).shape[0])
    rows = []
    for M in mats:
        y = spectral.as_csr(M) @ y
        rows.append(y)
    return np.stack(rows)


def consensus_steps(step: Callable[[int], np.ndarray | sp.spmatrix], kind: str, eps: float,
                    max_steps: int) -> int | float:
    """First T <= max_steps with consensus_error(W_{T-1} ... W_0, kind) <= eps (`step(t)` gives W_t), else inf."""
    eps = spectral.check_eps(eps)
    P = None
    for T in range(1, max_steps + 1):
        M = step(T - 1)
        P = _dense(M, "consensus_steps") if P is None else (
            spectral.as_csr(M) @ P if sp.issparse(M) else np.asarray(M) @ P)
        if consensus_error(P, kind) <= eps:
            return T
    return math.inf
