"""EquiTopo: topologies whose consensus rate does not depend on n (static degree O(ln n), or one peer per step).

Song, Li, Jin, Shi, Yan, Yin & Yuan, "Communication-Efficient Topologies for Decentralized Learning with O(1)
Consensus Rate", NeurIPS 2022 (the authors' code: kexinjinnn/EquiTopo). Everything is built from the basis
matrices of the n-cycle's powers: with P the cyclic shift,

    H_a = (1/n) I + ((n - 1)/n) P^a,    a in {1, ..., n - 1},

a circulant, doubly stochastic matrix in which each client exchanges with one other at distance a. The n - 1
basis matrices average to J = 11^T/n exactly, so a sample of them concentrates around J (matrix Bernstein):

- D-EquiStatic (directed, static): W = (1/M) sum_m H_{a_m} with a_1, ..., a_M drawn uniformly from {1, ..., n - 1},
  independently (with replacement). ||W - J||_2 <= epsilon with probability >= 1 - p once
  M >= 8 ln(2n/p) / (3 epsilon^2) (the paper's bound; dfl takes M as the ceiling of it, the authors' code its
  integer part). Each client receives from (and sends to) at most M others: degree O(ln(n)/epsilon^2), whatever n.
- U-EquiStatic (undirected, static): W = (1/(2M)) sum_m (H_{a_m} + H_{a_m}^T), symmetric, the same M.
- OD-EquiDyn (directed, one peer per step): W_t = (1 - eta) I + eta H_{a_t}, a_t drawn per step from the
  D-EquiStatic offsets a_1..a_M (or from all of 1..n-1, the paper's M = n - 1 case, when M is unset). With
  E[H_{a_t}] = J, E[W_t^T W_t] restricted to the disagreement space is (1 - eta)^2 + eta^2 (1 - 2/n) for the
  complete offset set: the expected squared contraction per step is at most (1 - eta)^2 + eta^2 whatever n
  (1/2 at eta = 1/2), while eta = 1 gives 1 - 2/n, which grows to 1 with n (the paper's eta < 1).
- OU-EquiDyn (undirected, one peer per step): draw a_t as above and a start s_t uniform in 0..n-1; visiting
  i = s_t, s_t + 1, ... (mod n), pair i with i + a_t when neither is paired yet. A pair averages with weights
  (1 - eta) + eta/n on itself and eta (n - 1)/n on the other; an unpaired client keeps its model.

Who talks to whom. The authors' graph code sets W[i, i + a] = (n - 1)/n, i.e. (row = receiver) client i pulls
from i + a. Their training code hands that matrix to BlueFog, which reads it as [sender, receiver], and their
dynamic code sends to rank + a and receives from rank - a: in training client i sends to i + a. dfl uses the
training convention, client i receives from i - a (W[i, (i - a) mod n] = (n - 1)/n), the transpose of the graph
code's matrix, as for dfl's exponential and one-peer exponential graphs (i sends to i + 2^k). Transposing changes
neither ||W - J||_2 nor the guarantee. The undirected variants are symmetric, so the two conventions agree.

Randomness: the static offsets come from `np.random.default_rng(seed)`, the draws of gossip step t from
`np.random.default_rng([seed, t])` alone, so every process of a run draws the same W_t whatever the world size
(the authors draw from one stream in sequence, so the realisations differ from theirs, not the distribution).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from topologies.errors import TopologyError
from topologies.graphs import _check_seed, check_n
from topologies.schedules import WeightedSchedule

NAMES = ("d-equistatic", "u-equistatic", "od-equidyn", "ou-equidyn")


def check_epsilon(epsilon: object) -> float:
    """The target bound on ||W - J||_2: a number with 0 < epsilon < 1."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.floating)) or not 0 < epsilon < 1:
        raise TopologyError(f"epsilon (the bound on ||W - J||_2) must be a number with 0 < epsilon < 1, got "
                            f"{epsilon!r}")
    return float(epsilon)


def check_delta(delta: object) -> float:
    """The probability that the bound fails (the paper's p): a number with 0 < delta < 1."""
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0 < delta < 1:
        raise TopologyError(f"delta (the paper's p: the probability that ||W - J||_2 > epsilon) must be a number "
                            f"with 0 < delta < 1, got {delta!r}")
    return float(delta)


def check_samples(M: object, name: str) -> int:
    """M, the number of basis matrices drawn: an integer >= 1."""
    if isinstance(M, bool) or not isinstance(M, (int, np.integer)) or M < 1:
        raise TopologyError(f"{name} option M (the basis matrices drawn) must be an integer >= 1, got {M!r}")
    return int(M)


def check_eta(eta: object) -> float:
    """The EquiDyn step weight: a number with 0 < eta <= 1 (the guarantee independent of n needs eta < 1)."""
    if isinstance(eta, bool) or not isinstance(eta, (int, float, np.floating)) or not 0 < eta <= 1:
        raise TopologyError(f"eta (the weight of the EquiDyn step, W_t = (1 - eta) I + eta H) must be a number with "
                            f"0 < eta <= 1, got {eta!r}")
    return float(eta)


def required_samples(n: int, epsilon: float, delta: float) -> int:
    """The paper's M for ||W - J||_2 <= epsilon with probability >= 1 - delta: ceil(8 ln(2n/delta) / (3 epsilon^2))."""
    return math.ceil(8.0 * math.log(2.0 * n / delta) / (3.0 * epsilon**2))


def samples(n: int, name: str, M: object = None, epsilon: object = None, delta: object = None) -> int:
    """M of a static EquiTopo from either M or (epsilon, delta) (both of the pair, and not with M)."""
    if M is not None:
        if epsilon is not None or delta is not None:
            raise TopologyError(f"{name} takes either M or epsilon with delta (which give M = ceil(8 ln(2n/delta) / "
                                "(3 epsilon^2))), not both")
        return check_samples(M, name)
    if epsilon is None or delta is None:
        raise TopologyError(f"{name} needs option M (the basis matrices drawn), or epsilon and delta (the bound "
                            "||W - J||_2 <= epsilon with probability >= 1 - delta, giving M = ceil(8 ln(2n/delta) / "
                            "(3 epsilon^2)))")
    return required_samples(n, check_epsilon(epsilon), check_delta(delta))


def offsets(n: int, M: int, seed: int) -> np.ndarray:
    """a_1..a_M, uniform on {1, ..., n - 1} with replacement, from `np.random.default_rng(seed)`."""
    return np.random.default_rng(seed).integers(1, n, size=M, dtype=np.int64)


def basis_sum(n: int, shifts: np.ndarray, weight: float) -> sp.csr_array:
    """Sum over a in `shifts` of weight * H_a, with H_a's client i receiving from i - a (module docstring)."""
    i = np.arange(n, dtype=np.int64)
    M = len(shifts)
    rows = np.concatenate([np.tile(i, M), i])
    cols = np.concatenate([((i[None, :] - shifts[:, None]) % n).ravel(), i])
    vals = np.concatenate([np.full(n * M, weight * (n - 1) / n), np.full(n, weight * M / n)])
    W = sp.csr_array((vals, (rows, cols)), shape=(n, n))
    W.sum_duplicates()
    return W


def d_equistatic(n: int, shifts: np.ndarray) -> sp.csr_array:
    """W = (1/M) sum_m H_{a_m}."""
    return basis_sum(n, shifts, 1.0 / len(shifts))


def u_equistatic(n: int, shifts: np.ndarray) -> sp.csr_array:
    """W = (1/(2M)) sum_m (H_{a_m} + H_{a_m}^T)."""
    W = basis_sum(n, shifts, 0.5 / len(shifts))
    return sp.csr_array(W + W.T)


class EquiStatic:
    """D-EquiStatic or U-EquiStatic on n clients (module docstring): its offsets and its W."""

    def __init__(self, n: int, M: int | None = None, epsilon: float | None = None, delta: float | None = None,
                 seed: int = 0, undirected: bool = False):
        self.name = "u-equistatic" if undirected else "d-equistatic"
        self.n = check_n(n, minimum=2)
        self.M = samples(self.n, self.name, M, epsilon, delta)
        self.seed = _check_seed(seed)
        self.undirected = undirected
        self.shifts = offsets(self.n, self.M, self.seed)
        common = math.gcd(self.n, *self.shifts.tolist())
        if common > 1:  # every hop a multiple of `common`: the clients split into `common` classes mod common
            drawn = ", ".join(map(str, sorted(set(self.shifts.tolist()))[:8]))
            raise TopologyError(f"{self.name}: the M = {self.M} offsets drawn with seed {self.seed} ({drawn}) are all "
                                f"multiples of {common}, a divisor of n = {self.n}, so W is disconnected; raise M "
                                "(or epsilon/delta's M) or change seed")

    def matrix(self) -> sp.csr_array:
        """The static W (canonical CSR)."""
        return u_equistatic(self.n, self.shifts) if self.undirected else d_equistatic(self.n, self.shifts)


class DEquiStatic(EquiStatic):
    """D-EquiStatic (module docstring): the builder's signature (n, M, epsilon, delta, seed)."""

    def __init__(self, n: int, M: int | None = None, epsilon: float | None = None, delta: float | None = None,
                 seed: int = 0):
        super().__init__(n, M, epsilon, delta, seed, undirected=False)


class UEquiStatic(EquiStatic):
    """U-EquiStatic (module docstring): the builder's signature (n, M, epsilon, delta, seed)."""

    def __init__(self, n: int, M: int | None = None, epsilon: float | None = None, delta: float | None = None,
                 seed: int = 0):
        super().__init__(n, M, epsilon, delta, seed, undirected=True)


class EquiDyn(WeightedSchedule):
    """OD-EquiDyn or OU-EquiDyn on n clients: one peer per gossip step, drawn from (seed, step) alone.

    `M` None draws each step's offset from all of 1..n-1 (the paper's M = n - 1 case); an integer M draws it
    from the M offsets of the static EquiTopo with the same seed. No period (`period` is None).
    """

    period = None

    def __init__(self, n: int, eta: float = 0.5, M: int | None = None, seed: int = 0, undirected: bool = False):
        self.name = "ou-equidyn" if undirected else "od-equidyn"
        self.n = check_n(n, minimum=2)
        self.eta = check_eta(eta)
        self.seed = _check_seed(seed)
        self.undirected = undirected
        self.directed = not undirected
        self.M = None if M is None else check_samples(M, self.name)
        self.shifts = None if self.M is None else offsets(self.n, self.M, self.seed)

    def draw(self, step: int) -> tuple[int, int]:
        """(a_t, s_t): step `step`'s offset and (OU-EquiDyn) start, from `np.random.default_rng([seed, step])`."""
        rng = np.random.default_rng([self.seed, step])
        a = int(rng.integers(1, self.n)) if self.shifts is None else int(self.shifts[rng.integers(len(self.shifts))])
        return a, int(rng.integers(0, self.n))

    def pairs(self, a: int, start: int) -> np.ndarray:
        """OU-EquiDyn's matching for offset a from client `start`: [pairs, 2] (i, i + a mod n), greedily in order."""
        n = self.n
        free = np.ones(n, dtype=bool)
        out = []
        for i in np.roll(np.arange(n), -start).tolist():
            j = (i + a) % n
            if free[i] and free[j]:
                free[i] = free[j] = False
                out.append((i, j))
        return np.array(out, dtype=np.int64).reshape(-1, 2)

    def step_matrix(self, step: int) -> sp.csr_array:
        """W_t of gossip step `step` (module docstring)."""
        n, eta = self.n, self.eta
        a, start = self.draw(step)
        i = np.arange(n, dtype=np.int64)
        if not self.undirected:  # (1 - eta) I + eta H_a: client i receives from i - a
            rows, cols = np.concatenate([i, i]), np.concatenate([i, (i - a) % n])
            vals = np.concatenate([np.full(n, 1.0 - eta + eta / n), np.full(n, eta * (n - 1) / n)])
        else:
            pairs = self.pairs(a, start)
            paired = np.zeros(n, dtype=bool)
            paired[pairs.ravel()] = True
            self_weight = np.where(paired, 1.0 - eta + eta / n, 1.0)
            rows = np.concatenate([i, pairs[:, 0], pairs[:, 1]])
            cols = np.concatenate([i, pairs[:, 1], pairs[:, 0]])
            vals = np.concatenate([self_weight, np.full(2 * len(pairs), eta * (n - 1) / n)])
        W = sp.csr_array((vals, (rows, cols)), shape=(n, n))
        W.sum_duplicates()
        return W


class ODEquiDyn(EquiDyn):
    """OD-EquiDyn (module docstring): the builder's signature (n, eta, M, seed)."""

    def __init__(self, n: int, eta: float = 0.5, M: int | None = None, seed: int = 0):
        super().__init__(n, eta, M, seed, undirected=False)


class OUEquiDyn(EquiDyn):
    """OU-EquiDyn (module docstring): the builder's signature (n, eta, M, seed)."""

    def __init__(self, n: int, eta: float = 0.5, M: int | None = None, seed: int = 0):
        super().__init__(n, eta, M, seed, undirected=True)
