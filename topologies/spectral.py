"""Spectral quantities of gossip matrices (docs/concepts/topologies.md#spectral-facts). J = 11^T/n throughout.

- lambda = ||W - J||_2: for a symmetric doubly stochastic W this is max(|lambda_2|, |lambda_n|), the lambda of
  DFedSAM / DFedSAM-MGS (Shi et al. 2023); for a non-symmetric W it is the largest singular value, the
  contraction factor of one gossip step on the disagreement x - Jx.
- Q gossip steps contract by ||W^Q - J||_2 (= lambda^Q for symmetric W); a time-varying schedule by the norm
  of the product of its step matrices minus J.

Matrices may be dense arrays or scipy sparse. Three ways to get a norm, chosen by `product_lambda`:
- dense (n <= topologies.limits.DENSE_SPECTRAL_LIMIT): exact LAPACK eigen/singular values, as for any small W;
- circulant (W[i, j] = c[(j - i) mod n], e.g. ring, exponential, one-peer exponential steps): W = F^* diag(fft(c)) F
  is normal and all circulants share the Fourier basis, so the eigenvalues of a product of circulants are the
  products of the FFTs of their first rows, and ||P - J||_2 = max_{m != 0} |prod_t fft(c_t)[m]|: O(n log n);
- iterative (anything else): Lanczos (`lanczos_extremes`) on W - J for a symmetric W, or on (P - J)^T (P - J)
  for a non-symmetric W or a product P of steps; J is applied as x -> mean(x) 1, so nothing is dense.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeGuard

import numpy as np
import scipy.sparse as sp
from scipy.linalg import eigvalsh_tridiagonal, solve_discrete_lyapunov
from scipy.sparse.csgraph import connected_components

from topologies import limits
from topologies.errors import TopologyError

ROUNDOFF = 1e-12
CIRCULANT_ATOL = 1e-13  # rows of a circulant built from the same weights agree to round-off
TIE_RTOL = 1e-9  # a disagreement this close to its target is a tie the FFT's rounding cannot settle
LANCZOS_TOL = 1e-11  # stop when the estimate grew by less than this (relative) over LANCZOS_CHECK steps
LANCZOS_CHECK = 20
LANCZOS_MAXITER = 20_000
METHODS = ("auto", "dense", "circulant", "iterative")


def dense_spectral_limit() -> int:
    """Largest n handled by the exact dense solvers (`topologies.limits.DENSE_SPECTRAL_LIMIT`, read at call time)."""
    return limits.DENSE_SPECTRAL_LIMIT


# --- matrix plumbing ----------------------------------------------------------------------------------------

def _is_sparse(W: object) -> TypeGuard[sp.sparray | sp.spmatrix]:
    """`scipy.sparse.issparse`, telling the type checker that W is then a scipy sparse array or matrix."""
    return sp.issparse(W)


def as_csr(W: object, name: str = "W") -> sp.csr_array:
    """W as a canonical float64 CSR array (sorted indices, no duplicates, no stored zeros); square n >= 1.

    A canonical float64 CSR input shares its arrays with the result (no copy); anything else is converted.
    """
    if _is_sparse(W):
        M = sp.csr_array(W.tocsr(), dtype=np.float64)
    else:
        D = _square_dense(W, name)
        M = sp.csr_array(D)
    if M.ndim != 2 or M.shape[0] != M.shape[1] or M.shape[0] < 1:
        raise TopologyError(f"{name} must be a square [n, n] matrix with n >= 1, got shape {M.shape}")
    if not M.has_canonical_format or (M.nnz and not np.all(M.data != 0)):
        M = M.copy()  # never re-sort or prune the caller's arrays in place
        M.sum_duplicates()
        M.eliminate_zeros()
    return M


def _square_dense(W: object, name: str = "W") -> np.ndarray:
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1] or W.shape[0] < 1:
        raise TopologyError(f"{name} must be a square [n, n] matrix with n >= 1, got shape {W.shape}")
    return W


def _square(W: object, name: str = "W") -> np.ndarray | sp.csr_array:
    """Dense float64 array, or canonical CSR for sparse input; square with n >= 1."""
    return as_csr(W, name) if sp.issparse(W) else _square_dense(W, name)


def _dense(W: np.ndarray | sp.sparray) -> np.ndarray:
    return W.toarray() if _is_sparse(W) else W


def is_symmetric(W: np.ndarray | sp.sparray) -> bool:
    """W equals its transpose to 1e-12 (entrywise)."""
    if sp.issparse(W):
        D = abs(sp.csr_array(W) - sp.csr_array(W).T)
        return D.nnz == 0 or float(D.max()) <= 1e-12
    return np.allclose(W, W.T, rtol=0.0, atol=1e-12)


def _centred_eigenvalues(W: np.ndarray) -> np.ndarray:
    """Eigenvalues of W - J for symmetric W (the eigenvalue 1 of W becomes 0)."""
    return np.linalg.eigvalsh(W - 1.0 / len(W))


def _clean(lam: float) -> float:
    # exact averaging (W = J, or a one-peer product) leaves ~1e-16 of round-off: report it as 0
    return 0.0 if lam < ROUNDOFF else lam


def disagreement_norm(M: np.ndarray) -> float:
    """||M - J||_2 of a dense M, by a symmetric eigensolver when possible (faster and more accurate than an SVD)."""
    if is_symmetric(M):
        return _clean(float(np.abs(_centred_eigenvalues(M)).max()))
    return _clean(float(np.linalg.norm(M - 1.0 / len(M), 2)))


def check_steps(Q: object) -> int:
    """Return Q, the number of gossip steps, as an int; TopologyError unless it is an integer >= 1."""
    if isinstance(Q, bool) or not isinstance(Q, (int, np.integer)) or Q < 1:
        raise TopologyError(f"Q (gossip steps) must be an integer >= 1, got {Q!r}")
    return int(Q)


# --- circulant matrices -------------------------------------------------------------------------------------

def circulant_offsets(W: object, atol: float = CIRCULANT_ATOL) -> tuple[np.ndarray, np.ndarray] | None:
    """The offsets and values (k, c_k) of a circulant W, else None.

    W is circulant when W[i, (i + k) mod n] = c_k for every row i (values to `atol`): row i is row 0 rolled by i.
    Read off the sparse structure in O(nnz log k).

    Returns:
        (the offsets k, sorted; the values c_k at them), or None when W is not circulant.
    """
    M = as_csr(W)
    n = M.shape[0]
    counts = np.diff(M.indptr)
    k = int(counts[0])
    if k == 0 or not np.all(counts == k):
        return None
    rows = np.repeat(np.arange(n, dtype=np.int64), k)
    offsets = ((M.indices.astype(np.int64) - rows) % n).reshape(n, k)
    order = np.argsort(offsets, axis=1, kind="stable")
    offsets = np.take_along_axis(offsets, order, axis=1)
    values = np.take_along_axis(M.data.reshape(n, k), order, axis=1)
    if not np.array_equal(offsets, np.broadcast_to(offsets[0], offsets.shape)):
        return None
    if np.abs(values - values[0]).max() > atol:
        return None
    return offsets[0], values[0]


def circulant_row(W: object) -> np.ndarray | None:
    """First row c of a circulant W (W[i, j] = c[(j - i) mod n]; values to CIRCULANT_ATOL), else None."""
    found = circulant_offsets(W)
    if found is None:
        return None
    c = np.zeros(as_csr(W).shape[0])
    c[found[0]] = found[1]
    return c


def circulant_spectrum(c: np.ndarray) -> np.ndarray:
    """Eigenvalues of the circulant with first row c: fft(c)[m] = sum_o c_o e^(-2 pi i m o / n) (m = 0: the row sum)."""
    return np.fft.fft(np.asarray(c, dtype=np.float64))


def circulant_lambda(spectra: Sequence[np.ndarray]) -> float:
    """||W_{k-1} ... W_0 - J||_2 for circulant steps with the given spectra: max_{m != 0} |prod_t spectra_t[m]|."""
    prod = np.prod(np.stack(spectra), axis=0)
    return _clean(float(np.abs(prod[1:]).max())) if len(prod) > 1 else 0.0


def circulant_neighbors(spectra: Sequence[np.ndarray], gamma: float) -> float:
    """n_W(gamma) of a periodic schedule of circulant steps (one step: a static circulant W), per Fourier mode.

    In the shared Fourier basis the covariance recursion S <- gamma W_t S W_t^* + W_t W_t^* is diagonal:
    s <- gamma a_t s + a_t with a_t = |fft(c_t)|^2 per mode. One period maps s to gamma^tau A s + C
    (A = prod_t a_t, C the image of 0), so the stationary s_0 = C / (1 - gamma^tau A); trace S_t = sum of s_t.
    """
    a = [np.abs(s) ** 2 for s in spectra]
    n = len(a[0])
    A, C = np.ones(n), np.zeros(n)
    for a_t in a:
        A = a_t * A
        C = gamma * a_t * C + a_t
    s = C / (1.0 - gamma ** len(a) * A)
    traces = []
    for a_t in a:
        traces.append(float(s.sum()))
        s = gamma * a_t * s + a_t
    return 1.0 / ((1.0 - gamma) * float(np.mean(traces)) / n)


def circulant_consensus_steps(spectra: Sequence[np.ndarray], eps: float, max_steps: int) -> int | float:
    """First T <= max_steps with ||W_{T-1} ... W_0 - J||_2 <= eps for the periodic circulant schedule, else inf.

    T = j tau + r (1 <= r <= tau): the norm is max_{m != 0} |pre_r[m]| |p[m]|^j with pre_r the product of the
    first r spectra and p = pre_tau; it never grows with j (|p| <= 1), so each r is a binary search over j.
    """
    tau = len(spectra)
    if len(spectra[0]) == 1:
        return 1
    pre = np.cumprod(np.stack(spectra), axis=0)[:, 1:]
    with np.errstate(divide="ignore"):  # an exactly averaged mode has log 0 = -inf
        log_pre = np.log(np.abs(pre))
    log_p = log_pre[-1]
    # reached when the norm is <= eps, or below ROUNDOFF (reported as 0, as `disagreement_norm` does)
    threshold = max(math.log(eps), math.log(ROUNDOFF) - 1e-9)

    def norm_below(r: int, j: int) -> bool:
        logs = log_pre[r - 1] + (j * log_p if j > 0 else 0.0)  # -inf + finite stays -inf: no nan
        return float(logs.max()) <= threshold

    return _first_periodic_step(tau, max_steps, norm_below)


def circulant_disagreement_steps(spectra: Sequence[np.ndarray], X: np.ndarray, eps: float,
                                 max_steps: int) -> int | float | None:
    """First T <= max_steps with ||X_T - mean(X_T)|| <= eps ||X - mean(X)||, X_T = W_{T-1} ... W_0 X, else inf.

    The periodic circulant schedule of the given spectra (one period; one spectrum: a static W) applied to the
    columns of X ([n, k]). In the Fourier basis each mode m of a column is scaled by the product of the steps'
    spectra, so by Parseval ||X_T - mean||^2 = (1/n) sum_{m != 0} |pre_T[m]|^2 e_m with e_m = sum over the columns
    of |fft(X)[m]|^2: one FFT, then O(n) per T. With T = j tau + r the norm never grows with j (|p[m]| <= 1 for the
    period's product p), so each r is a binary search over j, as in `circulant_consensus_steps`. None where a step
    it looked at lies within TIE_RTOL of the target (eps a power of an eigenvalue, say): there only the rounding of
    the steps themselves decides, so the caller applies them one by one.
    """
    n = X.shape[0]
    energy = (np.abs(np.fft.fft(X, axis=0)) ** 2).sum(axis=1)[1:] / n  # the mean (m = 0) is not disagreement
    target = eps * disagreement(X)
    pre = np.abs(np.cumprod(np.stack(spectra), axis=0)[:, 1:]) ** 2  # |pre_r[m]|^2, r = 1 ... tau
    period = pre[-1]

    tie = False

    def norm_below(r: int, j: int) -> bool:
        nonlocal tie
        norm = math.sqrt(float((energy * pre[r - 1] * period ** j).sum()))
        tie = tie or abs(norm - target) <= TIE_RTOL * target
        return norm <= target

    steps = _first_periodic_step(len(spectra), max_steps, norm_below)
    return None if tie else steps


def _first_periodic_step(tau: int, max_steps: int, below: Callable[[int, int], bool]) -> int | float:
    """The first T = j tau + r <= max_steps (1 <= r <= tau, j >= 0) with below(r, j), else inf.

    below(r, j) must stay true for every larger j once it holds, so each r is a binary search over j.
    """
    best: float = math.inf
    for r in range(1, tau + 1):
        j_max = (max_steps - r) // tau
        if j_max < 0 or not below(r, j_max):
            continue
        lo, hi = 0, j_max  # below(r, hi) holds; find the smallest such j
        while lo < hi:
            mid = (lo + hi) // 2
            if below(r, mid):
                hi = mid
            else:
                lo = mid + 1
        best = min(best, lo * tau + r)
    return int(best) if best != math.inf else math.inf


def disagreement(X: np.ndarray) -> float:
    """||X - mean(X)||_F, the columns' distance from consensus (numpy's own reduction: `_dot`)."""
    D = X - X.mean(axis=0)
    return math.sqrt(_dot(D, D))


# --- Lanczos ------------------------------------------------------------------------------------------------

def _dot(a: np.ndarray, b: np.ndarray) -> float:
    # numpy's own reduction, not BLAS: threaded BLAS on length-1e5 vectors thrashes a busy 2-core machine
    return float(np.multiply(a, b).sum())


def lanczos_extremes(apply: Callable[[np.ndarray], np.ndarray], n: int, tol: float = LANCZOS_TOL,
                     maxiter: int = LANCZOS_MAXITER) -> tuple[float, float]:
    """Smallest and largest eigenvalue of the symmetric linear operator `apply` on R^n.

    Plain Lanczos, without reorthogonalisation: lost orthogonality only repeats converged Ritz values, and the
    extreme Ritz values of the tridiagonal T_m move monotonically towards the extreme eigenvalues (Cauchy
    interlacing), needing only the eigenvalue, not its eigenvector, to converge (far fewer steps than ARPACK's
    residual test on clustered spectra, e.g. 4-regular n = 100,000: ~400 steps against eigsh's ~1200
    matrix-vector products and 8 s). Converged when max(|lo|, |hi|) grew by at most tol * max(|lo|, |hi|) over
    the last LANCZOS_CHECK steps (typically leaving an error near 1e-10 relative); an invariant subspace ends
    it exactly. Raises ValueError if not converged after `maxiter` steps. Deterministic (fixed start vector).
    """
    q = np.random.default_rng(0).standard_normal(n)
    q /= math.sqrt(_dot(q, q))
    q_prev = np.zeros(n)
    alphas: list[float] = []
    betas: list[float] = []
    beta = 0.0
    last = -math.inf

    def extremes() -> tuple[float, float]:
        d, e = np.array(alphas), np.array(betas[: len(alphas) - 1])
        if len(d) == 1:
            return float(d[0]), float(d[0])
        lo = eigvalsh_tridiagonal(d, e, select="i", select_range=(0, 0))[0]
        hi = eigvalsh_tridiagonal(d, e, select="i", select_range=(len(d) - 1, len(d) - 1))[0]
        return float(lo), float(hi)

    for m in range(1, maxiter + 1):
        w = apply(q)
        alpha = _dot(q, w)
        w -= alpha * q
        w -= beta * q_prev
        alphas.append(alpha)
        beta = math.sqrt(_dot(w, w))
        betas.append(beta)
        if beta <= 1e-13 * max(1.0, abs(alpha)) or m >= n:  # invariant subspace: Ritz values are eigenvalues
            return extremes()
        q_prev, q = q, w / beta
        if m % LANCZOS_CHECK == 0:
            lo, hi = extremes()
            estimate = max(abs(lo), abs(hi))
            if estimate - last <= tol * max(estimate, 1e-300):
                return lo, hi
            last = estimate
    lo, hi = extremes()
    raise TopologyError(f"the Lanczos eigensolver did not converge in {maxiter} iterations (n = {n}; last estimate "
                        f"{max(abs(lo), abs(hi)):.12g}): lambda is unknown")


def _is_doubly_stochastic(W: sp.csr_array) -> bool:
    return bool(W.nnz and W.data.min() >= 0.0 and np.allclose(W.sum(axis=0), 1.0, rtol=0.0, atol=1e-9)
                and np.allclose(W.sum(axis=1), 1.0, rtol=0.0, atol=1e-9))


def iterative_lambda(mats: Sequence[object], maxiter: int = LANCZOS_MAXITER) -> float:
    """||M_{k-1} ... M_0 - J||_2 by Lanczos (see `lanczos_extremes`), touching the M_t only through products.

    One symmetric M: the extreme eigenvalues of M - J. Otherwise the largest eigenvalue of (P - J)^T (P - J),
    whose square root is the largest singular value of P - J. J is applied as x -> mean(x) 1, never stored.
    A single doubly stochastic M whose graph is not strongly connected has lambda = 1 exactly (block diagonal
    up to a permutation: eigenvalue 1 twice), returned without iterating (Lanczos converges slowly there).
    """
    ops = [as_csr(M) for M in mats]
    n = ops[0].shape[0]
    if len(ops) == 1 and _is_doubly_stochastic(ops[0]) \
            and connected_components(ops[0], directed=True, connection="strong")[0] > 1:
        return 1.0
    if len(ops) == 1 and is_symmetric(ops[0]):
        W = ops[0]
        lo, hi = lanczos_extremes(lambda x: W @ x - x.mean(), n, maxiter=maxiter)
        return _clean(max(abs(lo), abs(hi)))
    transposed = [M.T.tocsr() for M in reversed(ops)]

    def normal(x: np.ndarray) -> np.ndarray:
        y = x
        for M in ops:
            y = M @ y
        y = y - x.mean()  # (P - J) x
        z = y
        for M in transposed:
            z = M @ z
        return z - y.mean()  # (P - J)^T y

    _, hi = lanczos_extremes(normal, n, maxiter=maxiter)
    return _clean(math.sqrt(max(hi, 0.0)))


# --- lambda -------------------------------------------------------------------------------------------------

def product_lambda(mats: Sequence[object], method: str = "auto") -> float:
    """||M_{k-1} ... M_1 M_0 - J||_2 (mats in application order: M_0 acts first).

    method: 'dense' (exact, O(n^3)), 'circulant' (FFT; ValueError unless every M is circulant), 'iterative'
    (Lanczos), or 'auto': dense for n <= topologies.limits.DENSE_SPECTRAL_LIMIT, else circulant when every M is,
    else iterative.
    """
    if method not in METHODS:
        raise TopologyError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if len(mats) == 0:
        raise TopologyError("product_lambda needs at least one matrix")
    squares = [_square(M) for M in mats]
    if len({M.shape for M in squares}) != 1:
        raise TopologyError("the matrices of a product must all have the same shape")
    n = squares[0].shape[0]
    if method == "dense" or (method == "auto" and n <= dense_spectral_limit()):
        P = _dense(squares[0])
        for M in squares[1:]:
            P = _dense(M) @ P
        return disagreement_norm(P)
    if method in ("auto", "circulant"):
        spectra = circulant_spectra(squares)
        if spectra is not None:
            return circulant_lambda(spectra)
        if method == "circulant":
            raise TopologyError("method 'circulant' needs every matrix to be circulant (row i = row 0 rolled by i)")
    return iterative_lambda(squares)


def circulant_spectra(mats: Sequence[object]) -> list[np.ndarray] | None:
    """The spectra fft(c) of the matrices when every one is circulant (first row c), else None."""
    rows = [circulant_row(M) for M in mats]
    known = [c for c in rows if c is not None]
    if len(known) < len(rows):
        return None
    return [circulant_spectrum(c) for c in known]


def second_eigenvalue(W: object) -> float:
    """The contraction lambda = ||W - J||_2 (max |eigenvalue| of W other than the eigenvalue 1, for symmetric W).

    Dense or sparse W; exact for n <= topologies.limits.DENSE_SPECTRAL_LIMIT, FFT or Lanczos above (`product_lambda`).
    """
    return product_lambda([_square(W)])


def spectral_gap(W: object) -> float:
    """1 - lambda."""
    return 1.0 - second_eigenvalue(W)


def _static_matrix(obj: object) -> object:
    """The matrix of a static topology-like object (its `sparse(0)`, else its `W`), or `obj` itself (a matrix)."""
    if hasattr(obj, "sparse"):
        return obj.sparse(0)
    if hasattr(obj, "matrix") and hasattr(obj, "W"):
        return obj.W
    return obj


def gossip_lambda(topology_or_W: object, Q: int) -> float:
    """Contraction of Q gossip steps: ||W^Q - J||_2 for a static W (= lambda^Q when W is symmetric).

    For a time-varying topology (an object with `is_time_varying` and `matrix(step)` or `sparse(step)`, e.g.
    `Topology`), the contraction ||W_{Q-1} ... W_1 W_0 - J||_2 of the product of the Q step matrices from step 0.
    """
    Q = check_steps(Q)
    if getattr(topology_or_W, "is_time_varying", False):
        if hasattr(topology_or_W, "sparse"):
            return product_lambda([topology_or_W.sparse(t) for t in range(Q)])
        if hasattr(topology_or_W, "matrix"):
            return product_lambda([topology_or_W.matrix(t) for t in range(Q)])
        raise TopologyError(f"a time-varying {type(topology_or_W).__name__} needs sparse(step) or matrix(step)")
    averaging = getattr(topology_or_W, "averaging", None)
    # W = a I + (1 - a) J: (W - J)^Q = a^Q (I - J)
    if averaging is not None and hasattr(topology_or_W, "second_eigenvalue"):
        return _clean(topology_or_W.second_eigenvalue() ** Q)
    W = _square(_static_matrix(topology_or_W))
    if W.shape[0] <= dense_spectral_limit():
        W = _dense(W)
        if is_symmetric(W):
            return _clean(float(np.abs(_centred_eigenvalues(W)).max() ** Q))
        return disagreement_norm(np.linalg.matrix_power(W, Q))
    if is_symmetric(W):
        return _clean(product_lambda([W]) ** Q)
    c = circulant_row(W)
    if c is not None:
        return circulant_lambda([circulant_spectrum(c)] * Q)
    return product_lambda([W] * Q, "iterative")


def phi(lam: float, m: int, Q: int) -> float:
    """Phi(lambda, m, Q) = (lam^Q + 1)/((1 - lam)^2 m^(2(Q-1))) + (lam^Q + 1)/(1 - lam^Q)^2.

    The topology term of the DFedSAM-MGS bound (m clients, Q gossip steps); inf when lambda = 1.
    """
    Q = check_steps(Q)
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise TopologyError(f"m (number of clients) must be an integer >= 1, got {m!r}")
    if not 0.0 <= lam <= 1.0 + 1e-9:
        raise TopologyError(f"lam must be in [0, 1], got {lam!r}")
    if lam >= 1.0:
        return math.inf
    lq = lam**Q
    return (lq + 1.0) / ((1.0 - lam) ** 2 * float(m) ** (2 * (Q - 1))) + (lq + 1.0) / (1.0 - lq) ** 2


# --- effective number of neighbours -------------------------------------------------------------------------

def check_gamma(gamma: object) -> float:
    """Return gamma, the discount of `effective_neighbors`, as a float; TopologyError unless 0 <= gamma < 1."""
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float, np.floating)) or not 0.0 <= gamma < 1.0:
        raise TopologyError(f"gamma must be a number with 0 <= gamma < 1, got {gamma!r}")
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


def _too_large(what: str, n: int) -> ValueError:
    return ValueError(f"{what} needs dense O(n^3) math for a non-circulant W and n = {n} > "
                      f"topologies.limits.DENSE_SPECTRAL_LIMIT = {dense_spectral_limit()} (closed forms exist only for "
                      "circulant matrices and the complete graph)")


def averaging_neighbors(a: float, n: int, gamma: float) -> float:
    """n_W(gamma) of W = a I + (1 - a) J: eigenvalue 1 once and a (n - 1 times) in the symmetric formula."""
    a2 = a * a
    return n / ((1.0 - gamma) * (1.0 / (1.0 - gamma) + (n - 1) * a2 / (1.0 - gamma * a2)))


def effective_neighbors(W: object, gamma: float = 0.951) -> float:
    """Effective number of neighbours n_W(gamma) (Vogels, Hendrikx & Jaggi 2022), in [1, n].

    For the random walk x <- W (sqrt(gamma) x + xi), xi ~ N(0, I), n_W = 1/((1 - gamma) mean_i Var_i) with
    Var_i the stationary variance of worker i. Symmetric W (eigenvalues lambda_k):
    n_W = n / [(1 - gamma) sum_k lambda_k^2 / (1 - gamma lambda_k^2)]. Non-symmetric W: the stationary
    covariance solves S = gamma W S W^T + W W^T (`scipy.linalg.solve_discrete_lyapunov`). A list of matrices
    is a periodic schedule W_0, W_1, ... applied in turn; Var_i is then averaged over the period's phases.
    gamma -> 0 gives n / ||W||_F^2; gamma -> 1 gives n for every connected W. Dense or sparse matrices; above
    topologies.limits.DENSE_SPECTRAL_LIMIT only circulant matrices (per Fourier mode) are supported.
    """
    gamma = check_gamma(gamma)
    if isinstance(W, Sequence) and not isinstance(W, np.ndarray) and len(W) > 0 \
            and (sp.issparse(W[0]) or np.ndim(W[0]) == 2):
        Ws = [_square(M, "each matrix of the schedule") for M in W]
        if len({M.shape for M in Ws}) != 1:
            raise TopologyError("the matrices of a periodic schedule must all have the same shape")
        n = Ws[0].shape[0]
        if n > dense_spectral_limit():
            spectra = circulant_spectra(Ws)
            if spectra is None:
                raise _too_large("effective_neighbors", n)
            return circulant_neighbors(spectra, gamma)
        Ws = [_dense(M) for M in Ws]
        mean_var = float(np.mean([np.trace(S) / n for S in _periodic_covariances(Ws, gamma)]))
        return 1.0 / ((1.0 - gamma) * mean_var)
    W = _square(W)
    n = W.shape[0]
    if n > dense_spectral_limit():
        c = circulant_row(W)
        if c is None:
            raise _too_large("effective_neighbors", n)
        return circulant_neighbors([circulant_spectrum(c)], gamma)
    W = _dense(W)
    if is_symmetric(W):
        lam2 = np.linalg.eigvalsh(W) ** 2
        return n / ((1.0 - gamma) * float(np.sum(lam2 / (1.0 - gamma * lam2))))
    S = solve_discrete_lyapunov(math.sqrt(gamma) * W, W @ W.T)
    return 1.0 / ((1.0 - gamma) * float(np.trace(S)) / n)


# --- consensus steps ----------------------------------------------------------------------------------------

def check_eps(eps: object) -> float:
    """Return eps, the factor disagreement must shrink by, as a float; TopologyError unless 0 < eps < 1."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)) or not 0.0 < eps < 1.0:
        raise TopologyError(f"eps must be a number with 0 < eps < 1, got {eps!r}")
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
