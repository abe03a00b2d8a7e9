"""The two Dirichlet label-skew samplers.

See docs/reference/update-rules.md#dirichlet-partition, and Flower's DirichletPartitioner for the per-class one.

Both take a numpy Generator and integer labels [N] and return one index array per client.
"""

from __future__ import annotations

import numpy as np

from dfl.errors import DataError

WINDOW = 8192  # steps drawn at once by the vectorized popping loop


def balanced_sizes(n_total: int, num_clients: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """n_i = floor(N / m).

    With sigma > 0, n_i ~ LogNormal(log(N/m), sigma) rescaled to sum to N, cast to int, and the rounding excess (sum
    - N, <= 0) subtracted from the first client with more than it (FedDyn).
    """
    per_client = n_total // num_clients
    if sigma == 0:
        return np.full(num_clients, per_client, dtype=np.int64)
    sizes = rng.lognormal(np.log(per_client), sigma, num_clients)
    sizes = (sizes / sizes.sum() * n_total).astype(np.int64)
    diff = int(sizes.sum()) - n_total
    if diff != 0:
        first = int(np.flatnonzero(sizes > diff)[0])
        sizes[first] -= diff
    return sizes


def dirichlet_balanced(labels: np.ndarray, num_clients: int, alpha: float, sigma: float,
                       rng: np.random.Generator) -> list[np.ndarray]:
    """Hsu et al. / FedDyn sampler.

    q_i ~ Dir(alpha 1_C); sizes from `balanced_sizes`; then, until every client is full, pick a non-full client i
    uniformly, draw a class c ~ q_i among the classes not yet exhausted, and pop one index of class c from the
    (shuffled) pool.

    "Redraw while full/exhausted" is implemented exactly in distribution: client picks are a uniform
    stream with full clients rejected, and a class redraw is a draw from q_i restricted to the available
    classes and renormalized. q_i is kept as log q_i, so this stays exact for tiny alpha, where q_i's
    small entries underflow to 0 in floating point and the reference loop would never terminate.
    With sigma = 0, m * floor(N/m) samples are used; the N mod m left over are not assigned (as in FedDyn).
    """
    n_total = labels.shape[0]
    num_classes = int(labels.max()) + 1
    perm = rng.permutation(n_total)
    sizes = balanced_sizes(n_total, num_clients, sigma, rng)
    empty = np.flatnonzero(sizes < 1)
    if empty.size:
        raise DataError(
            f"dirichlet with sigma={sigma} gives client(s) {format_ids(empty)} 0 samples; every client needs at least "
            "1: lower sigma or use fewer clients"
        )
    log_priors = log_dirichlet(alpha, num_clients, num_classes, rng)
    shuffled = labels[perm]
    pools = [perm[shuffled == c] for c in range(num_classes)]
    clients = _client_stream(sizes, rng)
    classes = _class_stream(clients, log_priors, np.array([len(p) for p in pools]), rng)
    picked = np.empty(clients.shape[0], dtype=np.int64)
    for c in range(num_classes):
        steps = np.flatnonzero(classes == c)
        picked[steps] = pools[c][: steps.size]
    order = np.argsort(clients, kind="stable")
    return [np.sort(p) for p in np.split(picked[order], np.cumsum(sizes)[:-1])]


def _ranks(values: np.ndarray) -> np.ndarray:
    """rank[j] = #{k < j : values[k] == values[j]} (occurrence number of each entry among equal ones)."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    rank = np.empty_like(order)
    rank[order] = np.arange(values.size) - np.searchsorted(sorted_values, sorted_values, side="left")
    return rank


def _client_stream(sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The sequence of client picks: uniform over clients, picks of full clients rejected (= redrawn)."""
    remaining = sizes.copy()
    out = []
    while remaining.sum() > 0:
        active = np.flatnonzero(remaining > 0)  # drawing only among these is the same as rejecting the full
        draws = active[rng.integers(0, active.size, int(remaining.sum()))]
        keep = draws[_ranks(draws) < remaining[draws]]
        out.append(keep)
        remaining -= np.bincount(keep, minlength=sizes.size)
    return np.concatenate(out)


def log_dirichlet(alpha: float, rows: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """The logarithm of q ~ Dir(alpha 1_dim), one row per client, without underflow for tiny alpha.

    q = g / sum g with g_c ~ Gamma(alpha), and Gamma(alpha) = Gamma(alpha + 1) * U^(1/alpha) in distribution, so log
    g_c = log Gamma(alpha + 1) + log(U) / alpha stays finite where q_c itself would round to 0.
    """
    log_gamma = np.log(rng.standard_gamma(alpha + 1.0, (rows, dim)))
    log_u = np.log1p(-rng.random((rows, dim)))
    with np.errstate(over="ignore", divide="ignore"):
        log_g = log_gamma + log_u / alpha
    overflow = ~np.isfinite(log_g).all(axis=1)
    if overflow.any():
        # alpha so small (1e-320) that log(U) / alpha overflows: the classes are then infinitely far apart, in the
        # order of their log U; keep that order at finite (1e300) distances, so that a client whose class runs out
        # draws the next one (exp of the distances is 0 or 1) instead of nothing at all
        rank = np.argsort(np.argsort(-log_u[overflow], axis=1), axis=1)
        log_g[overflow] = -1e300 * rank
    return log_g - np.logaddexp.reduce(log_g, axis=1, keepdims=True)


def _class_stream(clients: np.ndarray, log_priors: np.ndarray, available: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """Class of each step.

    c ~ q_client restricted to the non-exhausted classes and renormalized (computed from log q, so it is exact even
    when q_c underflows), by inverse CDF with u in (0, mass].
    """
    total = clients.shape[0]
    available = available.copy()
    out = np.empty(total, dtype=np.int64)
    pos = 0
    while pos < total:
        cl = clients[pos: pos + WINDOW]
        logw = np.where(available > 0, log_priors[cl], -np.inf)
        cdf = np.cumsum(np.exp(logw - logw.max(axis=1, keepdims=True)), axis=1)
        u = (1.0 - rng.random(cl.size)) * cdf[:, -1]
        c = np.minimum((cdf < u[:, None]).sum(axis=1), log_priors.shape[1] - 1)
        over = np.flatnonzero(_ranks(c) >= available[c])
        t = int(over[0]) if over.size else cl.size
        if t == 0:  # a closed class drawn first: the weights were not finite (no progress would ever be made)
            raise DataError("dirichlet: the class draws of a client are not finite numbers; raise alpha")
        out[pos: pos + t] = c[:t]
        available -= np.bincount(c[:t], minlength=available.size)
        pos += t  # at step t class c[t] ran out; it is redrawn with that class closed
    return out


def dirichlet_per_class(labels: np.ndarray, num_clients: int, alpha: float, min_size: int, max_retries: int,
                        self_balancing: bool, rng: np.random.Generator) -> list[np.ndarray]:
    """Flower's DirichletPartitioner (Yurochkin et al. / NIID-Bench).

    For every class c, p ~ Dir(alpha 1_m) and the shuffled indices of c are cut at floor(cumsum(p) * n_c). With
    `self_balancing`, clients already holding >= N/m samples get p_i = 0 for the next classes. Sizes are unbalanced.
    The whole draw is repeated until every client has >= min_size samples, at most `max_retries` extra times.
    """
    n_total = labels.shape[0]
    classes = np.unique(labels)
    for _ in range(max_retries + 1):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = np.exp(log_dirichlet(alpha, 1, num_clients, rng)[0])
            if self_balancing:
                q = np.where(sizes < n_total / num_clients, p, 0.0)
                p = q if q.sum() > 0 else p
            if not p.sum() > 0:
                p = np.full(num_clients, 1.0)
            cuts = np.minimum((np.cumsum(p / p.sum()) * idx.size).astype(np.int64)[:-1], idx.size)
            for i, chunk in enumerate(np.split(idx, cuts)):
                parts[i].append(chunk)
                sizes[i] += chunk.size
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)) for p in parts]
    raise DataError(
        f"dirichlet-class could not reach min_size={min_size} samples on every client after {max_retries} retries "
        f"(the smallest got {int(sizes.min())}); lower min_size or raise alpha (or use fewer clients, or raise "
        "max_retries)"
    )


def format_ids(ids: np.ndarray, limit: int = 10) -> str:
    """The ids as "3, 7, 9", the first `limit` of them and the count when there are more."""
    shown = ", ".join(str(int(i)) for i in ids[:limit])
    return shown + (f", ... ({ids.size} in all)" if ids.size > limit else "")
