"""Gossip: X ← W_t X for each gossip step t, sparse by default, never an [m, m] matrix for large m.

Four ways to apply Q steps W_{s+Q−1} ⋯ W_s, all equal to the float64 product to fp32 rounding
(docs/concepts/gossip.md#the-spectral-gap; tests/test_gossip.py checks every built-in topology, static and
time-varying):

- averaging (the complete graph, W = a·I + (1 − a)·J): X ← aᵠ X + (1 − aᵠ) x̄, one mean, O(m·d);
- circulant steps (ring, exponential, one-peer exponential, full torus-free circulants): x_i ← Σ_k c_k
  x_{i+k mod m} as shifted row-block adds, O(offsets·m·d), no index arrays, no gathers. A product of
  circulants is the circulant of the cyclic convolution of their first rows, so the Q steps of a round are
  applied as one such pass when that has few offsets (a ring's Q = 4 steps: 9 offsets in one pass instead
  of 3 offsets in each of 4 passes, `compose_circulants`);
- other sparse steps: one CSR × dense product per step (`torch.sparse.mm`), O(nnz·d);
- dense: the float64 product of the Q step matrices applied with one matmul, O(m²·d) — chosen only when
  that is cheaper, by the cost rule in `use_dense`.

A multi-process communicator (one with `mix_steps`) gets the step matrices themselves, so it can exchange
only the rows each step needs (`dfl.engine.distributed`). Gossip step s is global: round t of an algorithm with Q
steps per round uses steps tQ, …, tQ+Q−1, so time-varying schedules advance the same way whatever the
algorithm.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import OrderedDict
from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp
import torch

from dfl.models.kernels import ieee_matmuls
from topologies import spectral

# Dense wins when m² ≤ DENSE_FACTOR · Σ_steps (nnz + m): a dense matmul does 2m² flops per column of X and
# runs near the matmul peak, a sparse step moves (nnz + m) rows per column and is bound by memory bandwidth;
# on CPUs and GPUs alike a flop is ~10-20× cheaper than a byte of traffic. Measured on the 2-core CPU with
# d = 50,000 (ring, Q = 4): m = 64 dense 7.0 ms vs sparse 7.6 ms; m = 256 dense 64 ms vs 130 ms; m = 1,000 dense
# 0.96 s vs 0.37 s — the rule puts the switch between 256 and 1,000 for Q = 4.
DENSE_FACTOR = 20
# Dense products are formed in float64 on the CPU; beyond this many clients they are never considered.
DENSE_MAX_CLIENTS = 2048
_CACHE_SIZE = 64


# Circulant steps composed into one pass of K offsets: the pass's output tile stays in cache while its K shifted
# inputs are added, so an offset costs far less than a pass over memory. Measured on the 2-core CPU with d = 50,000
# and the engine's kept heap (`dfl.training.memory.keep_freed_memory`), ring, Q = 4 (K = 9), per gossip round:
# m = 32 dense 1.9 ms, composed 2.5 ms; m = 48 5.2 vs 4.2 ms; m = 100 dense 13.6, 4 passes 17.6, composed 9.5 ms;
# m = 256 86.6 / 46.1 / 21.3 ms; m = 1,000 1,031 / 219 / 101 ms. One-peer exponential (K = 16): m = 1,000 4 passes
# 177 ms, composed 147 ms. Dense wins below m ≈ 4·(K + 1). A composition with many more offsets than its steps
# together (exponential: 386 offsets from 4 × 11 at m = 1,000, 4.8 s against 0.67 s step by step) is not used.
CIRCULANT_DENSE_FACTOR = 4
COMPOSED_OFFSETS_FACTOR = 2


def use_dense(m: int, nnz_per_step: list[int], time_varying: bool, composed_offsets: int | None = None) -> bool:
    """The cost rule.

    Apply the float64 product densely iff m² · (1 + product cost) ≤ 20 · Σ_s (nnz_s + m), or, when the steps compose
    into one circulant pass of K = `composed_offsets` offsets, iff m² · (1 + product cost) ≤ 4 · (K + 1) · m.

    For a time-varying schedule the product must be formed every call (Q − 1 products of [m, m] matrices,
    m³ flops each), which is charged relative to the m²·d matmul as if d = m (so only small m qualify).
    """
    if m > DENSE_MAX_CLIENTS:
        return False
    dense = m * m * (1 + (len(nnz_per_step) - 1 if time_varying else 0))
    if composed_offsets is not None:
        return dense <= CIRCULANT_DENSE_FACTOR * (composed_offsets + 1) * m
    return dense <= DENSE_FACTOR * sum(nnz + m for nnz in nnz_per_step)


def circulant_offsets(W: sp.csr_array) -> list[tuple[int, float]] | None:
    """[(k, c_k)] when W is exactly circulant (W[i, (i+k) mod m] = c_k for every i), else None."""
    found = spectral.circulant_offsets(W, atol=0.0)  # exact: the shifts must apply W itself
    return None if found is None else [(int(k), float(c)) for k, c in zip(*found)]


def compose_circulants(steps: list[list[tuple[int, float]]], m: int) -> list[tuple[int, float]]:
    """[(k, c_k)] of the product W_Q ⋯ W_1 of circulant steps given by their offsets (first W_1).

    Circulants commute and (AB)[i, i + n] = Σ_k a_k b_{n−k mod m}, so the product's first row is the cyclic convolution
    c = c_1 ⊛ ⋯ ⊛ c_Q (float64, the same numbers the dense product holds, to float64 rounding).
    """
    row = np.zeros(m)
    row[0] = 1.0
    for offsets in steps:
        product = np.zeros(m)
        for k, c in offsets:  # in the offsets' order, from 0: the sum the builtin sum() made
            product = product + c * np.roll(row, k)
        row = product
    return [(int(k), float(row[k])) for k in np.flatnonzero(row)]


# Devices whose gossip method is chosen by timing the candidates on the run's own stack (`Gossip.calibrate`), once per
# device, sizes and matrices in a process; on the others (the CPU) the rule above, measured on the CPU, decides.
CALIBRATED_DEVICES = ("cuda",)
CALIBRATION_REPEATS = 3
_CALIBRATION: dict[tuple, dict] = {}  # key -> {"method", "seconds"}: the process's calibrations (`Gossip.method`)


def calibrations() -> dict[tuple, dict]:
    """The calibrations made in this process so far (key: device, GPU name, m, row shape, dtype, topology, steps)."""
    return dict(_CALIBRATION)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _clock() -> float:
    return time.perf_counter()


# On CPU a circulant step runs row block by row block, each block's output small enough to stay in cache
# while its offsets are added: the stack is then read once and written once (as a copy would), instead of
# once more per offset. Measured on the 2-core CPU, ring, m = 1,000, d = 50,000: see docs/benchmarks.md.
TILE_BYTES = 1 << 20


def _segments(a: int, b: int, k: int, m: int):
    """(out_lo, out_hi, in_lo) pieces of rows a..b-1 receiving rows (i + k) mod m: at most two (the wrap)."""
    lo, hi = a + k, b + k
    if hi <= m:
        return [(a, b, lo)]
    if lo >= m:
        return [(a, b, lo - m)]
    return [(a, m - k, lo), (m - k, b, 0)]


def shifted_sum(X: torch.Tensor, offsets: list[tuple[int, float]]) -> torch.Tensor:
    """out_i = Σ_k c_k x_{(i+k) mod m}, as in-place row-block adds (no index arrays, no gathers)."""
    m = X.shape[0]
    out = torch.empty_like(X)
    row_bytes = max(1, X[0].numel() * X.element_size()) if m else 1
    rows = max(1, TILE_BYTES // row_bytes) if X.device.type == "cpu" else max(m, 1)
    for a in range(0, m, rows):
        b = min(a + rows, m)
        for j, (k, c) in enumerate(offsets):
            for o0, o1, i0 in _segments(a, b, k, m):
                if j == 0:
                    torch.mul(X[i0 : i0 + o1 - o0], c, out=out[o0:o1])
                else:
                    out[o0:o1].add_(X[i0 : i0 + o1 - o0], alpha=c)
    return out


@contextmanager
def ieee_fp32(device: torch.device):
    """fp32 matmuls in full fp32 (no TF32) on a CUDA device while inside, outside autocast.

    Gossip averages exactly in the stack's precision whatever precision training uses (`precision = "tf32"` or "bf16"
    change local training only). The legacy and per-backend TF32 settings are changed together and PyTorch's own
    setting is put back on the way out (`dfl.models.kernels.ieee_matmuls`: torch 2.9–2.11 refuse a cuBLAS call when
    the two disagree). A no-op on the CPU, whose fp32 matmuls are IEEE.
    """
    if device.type != "cuda":
        yield
        return
    with torch.autocast("cuda", enabled=False), ieee_matmuls():
        yield


def exact_matmul(A: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """A @ X for a gossip operator A (dense or CSR): in IEEE fp32/fp64, never TF32 or autocast (`ieee_fp32`)."""
    with ieee_fp32(X.device):
        return torch.sparse.mm(A, X) if A.layout == torch.sparse_csr else A @ X


def csr_tensor(W, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A torch CSR tensor of a scipy sparse matrix (built from scipy's valid CSR, so unchecked)."""
    W = sp.csr_array(W)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the product used here is long-standing
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(
            torch.as_tensor(W.indptr, dtype=torch.int64, device=device),
            torch.as_tensor(W.indices, dtype=torch.int64, device=device),
            torch.as_tensor(W.data, dtype=dtype, device=device), size=W.shape, device=device, check_invariants=False,
        )


# Rows of output a `RowsOperator` tile computes at once on CUDA (on the CPU: TILE_BYTES, to stay in cache).
DEVICE_TILE_BYTES = 256 * 2**20


class RowsOperator:
    """out = A @ [X; R] for the local rows A ([n, n + r], scipy CSR) of a gossip step in a multi-process run.

    X the [n, ...] rows this process holds, R the [r, ...] rows received from its neighbours' processes.

    A sparse product on the whole stack (`torch.sparse.mm` on the CPU) needs [X; R] concatenated and makes two
    stack-sized temporaries (the heap of a rank grew by 5 stacks over a round of 4 steps, mlp × 1,500 clients per
    rank), and a tridiagonal product of 1,500 × 50,410 took 2.6 s on one core. Here A is kept as K = (most nonzeros
    of a row) slots per row, and each tile of output rows is K gathers of X's rows, multiplied and added in the
    tile (every row sums its terms in CSR order); the few terms on received rows are added at the end, the j-th
    received term of every row in the j-th `index_add_` (a row appears at most once per call: on CUDA no two atomic
    adds race for one row, so the sums are the same every run, and on the CPU, whose `index_add_` adds in index order,
    the same as one call with every term). The output is the only stack-sized allocation; temporaries are one tile
    (TILE_BYTES on the CPU, DEVICE_TILE_BYTES on a GPU). Index and weight tables are built once per step matrix and
    sent to the device in one copy each.
    """

    def __init__(self, A, n: int, dtype: torch.dtype, device: torch.device, sort: bool = True):
        """`sort=False` keeps each row's terms in the order A stores them (the asynchronous mode's canonical order)."""
        A = sp.csr_array(A)
        if sort:
            A.sort_indices()
        rows, width = A.shape
        counts = np.diff(A.indptr)
        K = max(int(counts.max()) if rows else 0, 1)
        row_of = np.repeat(np.arange(rows), counts)
        slot = np.arange(A.nnz) - np.repeat(A.indptr[:-1], counts)
        cols = np.zeros((rows, K), dtype=np.int64)
        vals = np.zeros((rows, K), dtype=np.float64)
        cols[row_of, slot] = A.indices
        vals[row_of, slot] = A.data
        remote = cols >= n
        self.remote = bool(remote.any())
        r_rows, r_slots = np.nonzero(remote)  # row-major: each row's received terms in CSR order
        r_src, r_vals = cols[r_rows, r_slots] - n, vals[r_rows, r_slots]
        # the rank of each received term within its row: the call of `__call__` that adds it
        rank = np.arange(len(r_rows)) - np.searchsorted(r_rows, r_rows)
        order = np.argsort(rank, kind="stable")
        r_rows, r_src, r_vals = r_rows[order], r_src[order], r_vals[order]
        self.remote_calls = np.bincount(rank, minlength=1).tolist() if len(rank) else []
        cols[remote], vals[remote] = 0, 0.0  # a received row's term: added at the end
        self.rows, self.K = rows, K
        index = torch.from_numpy(np.concatenate([cols.reshape(-1), r_rows, r_src])).to(device, non_blocking=True)
        self.cols, self.remote_rows, self.remote_src = torch.split(index, [cols.size, len(r_rows), len(r_src)])
        self.cols = self.cols.view(rows, K)
        weights = torch.from_numpy(np.concatenate([vals.reshape(-1), r_vals])).to(device=device, dtype=dtype,
                                                                                    non_blocking=True)
        self.vals, self.remote_vals = torch.split(weights, [vals.size, len(r_vals)])
        self.vals = self.vals.view(rows, K, 1)
        self.remote_vals = self.remote_vals.view(-1, 1)

    def __call__(self, X: torch.Tensor, R: torch.Tensor | None = None) -> torch.Tensor:
        """A @ [X; R], tile by tile (the class docstring)."""
        out = torch.empty((self.rows, *X.shape[1:]), dtype=X.dtype, device=X.device)
        row_bytes = max(1, X[0].numel() * X.element_size()) if X.shape[0] else 1
        budget = TILE_BYTES if X.device.type == "cpu" else DEVICE_TILE_BYTES
        tile = max(1, budget // row_bytes)
        flat = X.reshape(X.shape[0], -1)
        view = out.reshape(self.rows, -1)
        for a in range(0, self.rows, tile):
            b = min(a + tile, self.rows)
            part = view[a:b]
            torch.mul(flat[self.cols[a:b, 0]], self.vals[a:b, 0], out=part)
            for k in range(1, self.K):
                part.addcmul_(flat[self.cols[a:b, k]], self.vals[a:b, k])
        if self.remote:
            assert R is not None, "an operator with received rows is applied with them"
            received = R.reshape(R.shape[0], -1)
            for rows, src, vals in zip(*(torch.split(t, self.remote_calls) for t in (
                    self.remote_rows, self.remote_src, self.remote_vals))):
                view.index_add_(0, rows, received[src] * vals)  # rows distinct within a call
        return out


class SparseStep:
    """x ← W x for one step matrix W (scipy CSR, float64): shifted adds if circulant, else CSR × dense."""

    def __init__(self, W: sp.csr_array, dtype: torch.dtype, device: torch.device):
        self.nnz = int(W.nnz)
        self.offsets = circulant_offsets(W)
        self.matrix: torch.Tensor | None = None
        if self.offsets is None:
            self.matrix = csr_tensor(W, dtype, device)

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        """W X: shifted adds for a circulant W, else the CSR product."""
        if self.offsets is not None:
            return shifted_sum(X, self.offsets)
        assert self.matrix is not None  # not circulant: built in __init__
        return exact_matmul(self.matrix, X)


class Gossip:
    """Gossip steps X ← W_s X of a topology over the run's communicator: the `Mixer` an algorithm's `ctx.gossip` is."""
    def __init__(self, topology, comm, dtype: torch.dtype, device: torch.device):
        self.topology = topology
        self.comm = comm
        self.dtype = dtype
        self.device = device
        self._cache: OrderedDict[tuple, object] = OrderedDict()

    # ------------------------------------------------------------------ step matrices
    def step_key(self, step: int) -> int:
        """Steps with the same key have the same matrix: 0 for static, step mod period when periodic."""
        period = self.topology.period
        if not self.topology.is_time_varying:
            return 0
        return step if period is None else step % period

    def _cached(self, key: tuple, build):
        if key not in self._cache:
            self._cache[key] = build()
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return self._cache[key]

    def step_operator(self, step: int) -> SparseStep:
        """The operator of step `step`'s matrix W_s, built once per distinct matrix."""
        return self._cached(("step", self.step_key(step)),
                            lambda: SparseStep(self.topology.sparse(step), self.dtype, self.device))

    # ------------------------------------------------------------------ dense product (small m)
    def product(self, first_step: int, steps: int) -> np.ndarray:
        """W_{first+steps−1} ⋯ W_{first} in float64 (dense; for small m and for tests)."""
        P = self.topology.matrix(first_step)
        for s in range(first_step + 1, first_step + steps):
            P = self.topology.matrix(s) @ P
        return np.array(P)

    def operator(self, first_step: int, steps: int) -> torch.Tensor:
        """The dense product as a tensor (cached for static and periodic topologies)."""
        key = ("dense", steps, *(self.step_key(s) for s in range(first_step, first_step + steps)))
        if self.topology.is_time_varying and self.topology.period is None:
            return self._tensor(self.product(first_step, steps))
        return self._cached(key, lambda: self._tensor(self.product(first_step, steps)))

    def dense_is_cheaper(self, first_step: int, steps: int) -> bool:
        """Whether one dense product of these steps costs less than applying them one by one."""
        if self.topology.n > DENSE_MAX_CLIENTS:  # before building step operators only to count their nonzeros
            return False
        nnz = [self.step_operator(s).nnz for s in range(first_step, first_step + steps)]
        composed = self.circulant_product(first_step, steps)
        return use_dense(self.topology.n, nnz, self.topology.is_time_varying,
                         None if composed is None else len(composed))

    # ------------------------------------------------------------------ circulant steps as one pass
    def circulant_product(self, first_step: int, steps: int) -> list[tuple[int, float]] | None:
        """The offsets of a product of circulant steps, or None when it is not compact.

        The offsets of W_{first+steps−1} ⋯ W_first when every step is circulant and the product has at most
        2 × as many offsets as the steps together (`compose_circulants`), else None.
        """
        keys = tuple(self.step_key(s) for s in range(first_step, first_step + steps))

        def build():
            every = [self.step_operator(s).offsets for s in range(first_step, first_step + steps)]
            parts = [offsets for offsets in every if offsets is not None]
            if len(parts) < len(every):  # a step that is not circulant
                return None
            composed = compose_circulants(parts, self.topology.n)
            return composed if len(composed) <= COMPOSED_OFFSETS_FACTOR * sum(map(len, parts)) else None

        if self.topology.is_time_varying and self.topology.period is None:
            return build()
        return self._cached(("circulant", *keys), build)

    # ------------------------------------------------------------------ how: dense, circulant pass, or step by step
    def candidates(self, first_step: int, steps: int) -> list[str]:
        """The ways these steps can be applied in one process.

        "dense" (the float64 product, one matmul; m <= DENSE_MAX_CLIENTS), "circulant" (every step circulant and their
        composition compact: one shifted-add pass), "steps" (one shifted-add pass or CSR product per step; always
        possible).
        """
        out = ["dense"] if self.topology.n <= DENSE_MAX_CLIENTS else []
        if self.circulant_product(first_step, steps) is not None:
            out.append("circulant")
        return [*out, "steps"]

    def method(self, first_step: int, steps: int, X: torch.Tensor) -> str:
        """How these steps are applied to X (`candidates`).

        On the CPU, by the cost rule measured on it (`use_dense`, CIRCULANT_DENSE_FACTOR); on other devices (CUDA:
        cuBLAS matmuls run far nearer their peak than bandwidth-bound shifted adds, and `shifted_sum` does not tile
        there), by timing each candidate on this stack once (`calibrate`), cached per device, m, d, dtype and step
        matrices for the process.
        """
        if X.device.type not in CALIBRATED_DEVICES:
            if self.dense_is_cheaper(first_step, steps):
                return "dense"
            return "circulant" if self.circulant_product(first_step, steps) is not None else "steps"
        options = self.candidates(first_step, steps)
        if len(options) == 1:
            return options[0]
        static = not self.topology.is_time_varying or self.topology.period is not None
        keys = tuple(self.step_key(s) for s in range(first_step, first_step + steps)) if static else "varying"
        key = (str(X.device), torch.cuda.get_device_name(X.device) if X.device.type == "cuda" else "",
               self.topology.n, tuple(X.shape[1:]), X.dtype, self.topology.name, steps, keys, tuple(options))
        if key not in _CALIBRATION:
            _CALIBRATION[key] = self.calibrate(first_step, steps, X, options)
        return _CALIBRATION[key]["method"]

    def calibrate(self, first_step: int, steps: int, X: torch.Tensor, options: list[str]) -> dict:
        """Time each way of applying these gossip steps to X and name the fastest.

        One warm-up, then the best of CALIBRATION_REPEATS, the device synchronised around each; returns
        {"method": the fastest, "seconds": {method: seconds}}.
        """
        seconds = {}
        for name in options:
            self._apply(name, X, first_step, steps)  # warm-up: operators built, kernels loaded
            best = math.inf
            for _ in range(CALIBRATION_REPEATS):
                _synchronize(X.device)
                tic = _clock()
                self._apply(name, X, first_step, steps)
                _synchronize(X.device)
                best = min(best, _clock() - tic)
            seconds[name] = best
        return {"method": min(seconds, key=lambda name: seconds[name]), "seconds": seconds}

    def _apply(self, method: str, X: torch.Tensor, first_step: int, steps: int) -> torch.Tensor:
        if method == "dense":
            return self.comm.mix(self.operator(first_step, steps), X)
        if method == "circulant":
            offsets = self.circulant_product(first_step, steps)
            assert offsets is not None, "circulant is offered only when the steps compose to a circulant"
            return shifted_sum(X, offsets)
        for s in range(first_step, first_step + steps):
            X = self.step_operator(s)(X)
        return X

    # ------------------------------------------------------------------ mixing
    def mix(self, X: torch.Tensor, first_step: int, steps: int) -> torch.Tensor:
        """Apply gossip steps first_step … first_step+steps−1 to the local rows X."""
        averaging = getattr(self.topology, "averaging", None)
        if averaging is not None:  # W = aI + (1−a)J, and J x̄ = x̄: Q steps are aᵠ X + (1 − aᵠ) x̄
            keep = averaging**steps
            mean = self.comm.mean_rows(X)
            return mean.expand_as(X).clone() if keep == 0 else torch.lerp(mean.expand_as(X), X, keep)
        mix_steps = getattr(self.comm, "mix_steps", None)
        if mix_steps is not None:
            return mix_steps([self._exchange_matrix(s) for s in range(first_step, first_step + steps)], X)
        return self._apply(self.method(first_step, steps, X), X, first_step, steps)

    def _exchange_matrix(self, step: int):
        """What a multi-process communicator gets per step: the dense matrix for small m, else scipy CSR.

        A random schedule (time-varying without a period) always gets CSR: each of its steps is a new matrix, so
        its exchange plan is built every step from the nonzeros alone, and no dense [m, m] is made per step.
        """
        random = self.topology.is_time_varying and self.topology.period is None
        if self.topology.n <= DENSE_MAX_CLIENTS and not random:
            return self.topology.matrix(step)
        return self.topology.sparse(step)

    def sends(self, first_step: int, steps: int) -> np.ndarray:
        """Models each client sends over these steps: Σ_s out-degree of client j in W_s (self excluded)."""
        out = np.zeros(self.topology.n, dtype=np.int64)
        for s in range(first_step, first_step + steps):
            out += self._cached(("sends", self.step_key(s)), lambda s=s: self.topology.out_degrees(s))
        return out

    def message_bytes(self, dim: int, itemsize: int) -> int:
        """Bytes of one message: a model-sized vector (a compressed gossip, `dfl.network.choco`, sends less)."""
        return dim * itemsize

    def _tensor(self, M: np.ndarray) -> torch.Tensor:
        return torch.tensor(np.asarray(M), dtype=self.dtype, device=self.device)
