"""Base-(k+1) graphs: finite-time exact consensus for any number of clients n and any maximum degree k.

Takezawa, Sato, Bao, Niwa & Yamada, "Beyond Exponential Graph: Communication-Efficient Topologies for
Decentralized Learning via Finite-time Convergence", NeurIPS 2023 (arXiv 2305.11420; the authors' code:
yukiTakezawa/BaseGraph). A sequence of symmetric, doubly stochastic W_0, ..., W_{tau-1} in which every client
talks to at most k peers per step and whose product W_{tau-1} ... W_0 is exactly J = 11^T/n. With b = k + 1:

- k-peer hyper-hypercube (the paper's Alg. 1; n = f_1 ... f_L with every f_l <= b): write client i in the mixed
  radix (f_1, ..., f_L); at step l it averages with the f_l - 1 clients that differ from it in digit l alone,
  weight 1/f_l each. After the L steps every client holds the average. The factors are taken greedily, as many b
  as divide n, then b - 1, ..., 2, and used in ascending order (as the authors' code does).
- simple Base-(k+1) graph (Alg. 2), for n with a prime factor > b: n = sum_l a_l b^(p_l) in base b (digits
  a_l in 1..k, p_0 > p_1 > ...) splits the clients into contiguous groups V_l of a_l b^(p_l) clients, each
  made of a_l contiguous subgroups of b^(p_l). (1) Every group runs its own hyper-hypercube (V_0's sequence is
  the longest; shorter ones repeat theirs). (2) At step r of the second phase every client of the smaller
  groups V_{>r} exchanges with one client of each of V_r's a_r subgroups (weight beta_r / a_r, beta_r =
  |V_r| / |V_{>=r}|, self-weights 1 - beta_r and 1 - beta_r / a_r), V_r's other clients form cliques of at most
  b (averaging equal values then: no effect on the product, but they mix the gradient noise of the steps
  between), and the groups before V_r run their subgroups' hyper-hypercubes, which spreads what their exchanged
  clients received over their subgroup. The sequence ends when V_0's subgroups have finished.
- Base-(k+1) graph (Alg. 3): n = n_smooth * n_rest with n_smooth the largest divisor of n whose prime factors
  are all <= b. Either the simple Base-(k+1) graph on n, or the simple one on each of the n_smooth contiguous
  blocks of n_rest clients followed by the hyper-hypercube across the blocks (client j of every block), whichever
  is shorter (the simple graph when both are equally long, as the authors' code decides).

Exactness: every size, digit, power and divisor here is integer arithmetic. The authors' code takes
int(math.log(n, k + 1)), which is 4 for log_3(243) = 4.999...; it then gives some clients 3 peers for k = 2 and
n = 244..324 and fails for n = 325..485. Here the digits of n in base b come from repeated integer division.
The weights are floats, so the product equals J to rounding (about 1e-15).

The sequences are computed once per (n, k) as "templates": for each step, the entries (row, column, weight) of
W_t on local indices 0..N-1, placed onto any set of clients by index arrays, vectorised over equal-sized blocks.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import scipy.sparse as sp

from topologies.errors import TopologyError
from topologies.graphs import check_n
from topologies.schedules import WeightedSchedule

Entries = tuple[np.ndarray, np.ndarray, np.ndarray]  # rows, columns, weights of one step on local indices
Template = tuple[Entries, ...]  # one Entries per step
TEMPLATE_CACHE = 64  # (N, b) templates kept: the recursion asks for a few sizes per n


def check_k(k: object, n: int, name: str) -> int:
    """The maximum number of peers per step: an integer k >= 1 (k >= n - 1 averages everything in one step)."""
    if k is None:
        raise TopologyError(f"{name} needs option k (the peers per client per step, an integer >= 1)")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise TopologyError(f"{name} option k (the peers per client per step) must be an integer >= 1, got {k!r}")
    return int(k)


def digits(n: int, base: int) -> list[tuple[int, int]]:
    """[(a_l, p_l)] with n = sum_l a_l base^(p_l), a_l in 1..base-1, p_l decreasing: n's nonzero digits."""
    out, power = [], 0
    while n:
        n, digit = divmod(n, base)
        if digit:
            out.append((digit, power))
        power += 1
    return out[::-1]


def smooth_part(n: int, bound: int) -> int:
    """The largest divisor of n whose prime factors are all <= bound (the authors' gcd(n, prod_m m^log_m n))."""
    part, rest = 1, n
    for q in range(2, bound + 1):
        while rest % q == 0:
            rest //= q
            part *= q
    return part


def factors(n: int, b: int) -> list[int]:
    """N = f_1 ... f_L with every f_l <= b, taken greedily from b down to 2 and returned ascending.

    Raises:
        ValueError: n has a prime factor > b (not a hyper-hypercube size).
    """
    out, rest = [], n
    for f in range(b, 1, -1):
        while rest % f == 0:
            out.append(f)
            rest //= f
    if rest != 1:
        raise ValueError(f"{n} has a prime factor > {b}")
    return out[::-1]


def _cliques(members: np.ndarray) -> Entries:
    """Every client of each row of `members` ([groups, size]) averages with its row: weight 1/size."""
    groups, size = members.shape
    rows = np.repeat(members, size, axis=1).ravel()
    cols = np.tile(members, (1, size)).ravel()
    return rows, cols, np.full(rows.shape, 1.0 / size)


def _concat(parts: list[Entries]) -> Entries:
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


def _place(entries: Entries, nodes: np.ndarray) -> Entries:
    """Local entries of one step put on each row of `nodes` ([blocks, N] client indices)."""
    rows, cols, vals = entries
    nodes = np.atleast_2d(nodes)
    return nodes[:, rows].ravel(), nodes[:, cols].ravel(), np.tile(vals, nodes.shape[0])


@lru_cache(maxsize=TEMPLATE_CACHE)
def hyper_hypercube(n: int, b: int) -> Template:
    """The k-peer hyper-hypercube on n clients (every prime factor of n <= b = k + 1); [I] for n = 1."""
    if n == 1:
        return ((np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.ones(1)),)
    steps, stride, local = [], 1, np.arange(n, dtype=np.int64)
    for f in factors(n, b):
        base = local - ((local // stride) % f) * stride  # the client with digit 0 in this position
        members = np.unique(base)[:, None] + stride * np.arange(f, dtype=np.int64)[None, :]
        steps.append(_cliques(members))
        stride *= f
    return tuple(steps)


@lru_cache(maxsize=TEMPLATE_CACHE)
def simple_base(n: int, b: int, inner_edges: bool = True) -> Template:
    """The simple Base-(k+1) graph on n clients (b = k + 1), as the module docstring describes."""
    if n == 1 or smooth_part(n, b) == n:
        return hyper_hypercube(n, b)
    groups = digits(n, b)  # [(a_l, p_l)], largest first
    sizes = [a * b**p for a, p in groups]
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    L = len(groups)
    whole = [hyper_hypercube(size, b) for size in sizes]
    sub = [hyper_hypercube(b**p, b) for _, p in groups]

    def nodes(l: int, split: bool = False) -> np.ndarray:  # V_l as one row, or its subgroups as rows
        a, p = groups[l]
        return np.arange(starts[l], starts[l + 1], dtype=np.int64).reshape(a if split else 1, -1)

    steps: list[Entries] = []
    first = len(whole[0])  # phase 1: every group's own hyper-hypercube, V_0's being the longest
    for m in range(first):
        steps.append(_concat([_place(whole[l][m % len(whole[l])], nodes(l)) for l in range(L)]))
    done = [0] * L  # phase-3 steps each group has taken
    r = 0
    while True:
        parts = []
        for l in range(L):
            if l > r and r < L - 1:
                continue  # receivers: handled with V_r below
            if l == r and r < L - 1:
                parts.append(_pair(groups, sizes, starts, r, b, inner_edges))
                continue
            a, p = groups[l]  # phase 3: spread what V_l's exchanged clients received over their subgroups
            if p == 0:
                parts.append(_place(whole[l][done[l] % len(whole[l])], nodes(l)))
            else:
                parts.append(_place(sub[l][done[l] % len(sub[l])], nodes(l, split=True)))
            done[l] += 1
        steps.append(_concat(parts))
        r += 1
        if done[0] == len(sub[0]):
            return tuple(steps)


def _pair(groups: list[tuple[int, int]], sizes: list[int], starts: np.ndarray, r: int, b: int,
          inner_edges: bool) -> Entries:
    """Step r of phase 2: each client of V_{>r} with one client of each of V_r's subgroups; V_r's rest in cliques.

    The receivers go smallest group first, each group's clients ascending; subgroup q gives them its clients
    from its last one down (the authors' order).
    """
    a, p = groups[r]
    block = b**p
    receivers = np.concatenate([np.arange(starts[l], starts[l + 1], dtype=np.int64) for l in range(len(groups) - 1,
                                                                                                      r, -1)])
    u = len(receivers)  # < b^p_r: the lower digits of n sum to less than b^p_r
    beta = sizes[r] / sum(sizes[r:])
    subgroup_starts = starts[r] + block * np.arange(a, dtype=np.int64)
    partners = (subgroup_starts[:, None] + block - 1 - np.arange(u, dtype=np.int64)[None, :])  # [a, u]
    i = np.broadcast_to(receivers[None, :], partners.shape).ravel()
    j = partners.ravel()
    w = beta / a
    rows = [i, j, receivers, j]
    cols = [j, i, receivers, j]
    vals = [np.full(i.shape, w), np.full(i.shape, w), np.full(u, 1.0 - beta), np.full(j.shape, 1.0 - w)]
    if inner_edges:
        rest = (subgroup_starts[:, None] + np.arange(block - u, dtype=np.int64)[None, :]).ravel()
        full = len(rest) // b
        cliques = [rest[: full * b].reshape(full, b)] if full else []
        tail = rest[full * b:]
        if len(tail) > 1:  # a last clique smaller than b; a single client left over stays alone
            cliques.append(tail[None, :])
        for members in cliques:
            rows_, cols_, vals_ = _cliques(members)
            rows.append(rows_)
            cols.append(cols_)
            vals.append(vals_)
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals)


@lru_cache(maxsize=TEMPLATE_CACHE)
def base(n: int, b: int) -> Template:
    """The Base-(k+1) graph on n clients (b = k + 1): the shorter of the two constructions (module docstring)."""
    simple = simple_base(n, b)
    smooth = smooth_part(n, b)
    rest = n // smooth
    if smooth == 1 or rest == 1:
        return simple
    blocks = simple_base(rest, b)
    across = hyper_hypercube(smooth, b)
    if len(simple) < len(blocks) + len(across):
        return simple
    grid = np.arange(n, dtype=np.int64).reshape(smooth, rest)  # row: a block of rest consecutive clients
    return tuple([_place(step, grid) for step in blocks] + [_place(step, grid.T) for step in across])


def step_matrix(n: int, entries: Entries) -> sp.csr_array:
    """W of one step on n clients: its entries, and self-weight 1 for every client the step leaves out."""
    rows, cols, vals = entries
    touched = np.zeros(n, dtype=bool)
    touched[rows] = True
    idle = np.flatnonzero(~touched)
    W = sp.csr_array((np.concatenate([vals, np.ones(len(idle))]),
                      (np.concatenate([rows, idle]), np.concatenate([cols, idle]))), shape=(n, n))
    W.sum_duplicates()
    return W


class BaseGraph(WeightedSchedule):
    """The Base-(k+1) graph (or, with `simple=True`, the simple Base-(k+1) graph) as a periodic schedule.

    `period` is the sequence length tau; step t uses W_(t mod tau), so the consensus is exact again after every
    further tau steps. `step_matrix(step)` is W_t (canonical CSR, symmetric, doubly stochastic, at most k peers
    per client).
    """

    directed = False

    def __init__(self, n: int, k: int | None = 1, simple: bool = False):
        self.n = check_n(n)
        self.name = "simple-base-graph" if simple else "base-graph"
        self.k = check_k(k, n, self.name)
        b = min(self.k, max(n - 1, 1)) + 1  # k >= n - 1: one step of the whole clique (n is then b-smooth)
        self._template = simple_base(n, b) if simple else base(n, b)
        self.period = self.length = len(self._template)

    def step_matrix(self, step: int) -> sp.csr_array:
        """W of gossip step `step` (period `period`)."""
        return step_matrix(self.n, self._template[step % self.length])


class SimpleBaseGraph(BaseGraph):
    """The simple Base-(k+1) graph (the paper's Alg. 2) on its own: `BaseGraph(n, k, simple=True)`."""

    def __init__(self, n: int, k: int | None = 1):
        super().__init__(n, k, simple=True)
