"""The communicator of a multi-process run: the collectives that move client rows between processes.

One process per GPU (NCCL) or per CPU worker (gloo). Rank r hosts the contiguous client block
`even_blocks(m, P)[r]` (`dfl.network.comm`). Every method of `DistributedCommunicator` is a collective: all
ranks call it, in the same order, which the engine guarantees by running the same code on every rank.

Gossip (`mix_steps`), for the step matrices W_s, …, W_{s+Q−1}:
- gossip_mode "p2p": per step, one `all_to_all_single` carries exactly the rows that other ranks need
  (`dfl.network.comm.exchange_plan` of W_s; zero-size splits where two ranks share no edge), then
  X_local ← W_s[local, cols] @ [X_local; received]. A step with W_s = J (the complete graph with
  uniform weights) is one all_reduce mean instead.
- gossip_mode "allgather": one all_gather of the stack, then X_local ← (W_{s+Q−1}⋯W_s)[local, :] @ X_all,
  so Q steps cost one exchange; a product equal to J is one all_reduce mean.
Both equal the single-process X ← (W_{s+Q−1}⋯W_s) X up to float rounding.

`bytes_moved` counts the bytes sent between processes by ALL processes together, cumulatively; it is the
same number on every rank (each rank knows the global exchange plan). Counting rules: p2p = rows in the
plan × bytes per row; an all_gather of B bytes per rank = P(P−1)·B; an all_reduce of B bytes =
2(P−1)·B (what a ring all-reduce sends); `assemble_rows` = the rows the other ranks send to rank 0. Every
collective of the communicator is counted (metrics too); checkpoints (`dfl.engine.checkpoint`, every rank writes
its own rows) move none.

Devices. Every tensor handed to a method of the communicator must be on its `device` (the run's: cuda:LOCAL_RANK
under NCCL, the CPU under gloo): the boundary (`_check`) raises `DeviceMismatch` naming the operation otherwise,
so an engine path that would hand NCCL a CPU tensor fails on the CPU too, with gloo (tests/test_device.py).
The communicator alone puts tensors on the wire: gloo moves CPU tensors only, so CUDA data is staged through the
host; NCCL gets the device tensors themselves. Index tensors of the exchange plans are built once per plan, on
the device.

Failures. Every collective runs through the communicator's `FailureWatch` (`dfl.engine.distributed.failures`): a
failure on another rank stops this one with `PeerFailure` naming that rank, under gloo and NCCL alike.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import scipy.sparse as sp
import torch
import torch.distributed as dist

from dfl.engine.distributed.failures import FailureWatch
from dfl.errors import ConfigError, DeviceMismatch
from dfl.network.comm import even_blocks, exchange_plan
from dfl.network.gossip import COMPOSED_OFFSETS_FACTOR, RowsOperator, exact_matmul
from dfl.training.evaluate import row_blocks

GOSSIP_MODES = ("p2p", "allgather")
# Backends whose ranks do not notice a dead peer by themselves, so that the heartbeat thread watches (and aborts the
# group): NCCL. Tests add "gloo" to run the NCCL-only watch on the CPU.
WATCHED_BACKENDS = ("nccl",)
_CACHE_SIZE = 64  # exchange plans / products kept (static and periodic topologies reuse a few) ...
# ... in at most this many bytes, the step matrices they keep alive included (one entry at least): a random
# time-varying topology makes a new plan every gossip step, and 64 dense [m, m] float64 matrices were 2 GiB per rank
# at m = 2,048. The memory planner sets it aside (`dfl.engine.setup.client_chunk`).
CACHE_BYTES = 256 * 2**20
DENSE_PRODUCT_LIMIT = 20_000  # allgather mode: largest m whose [m, m] product is formed
# all_gather_into_tensor under its torch 2.13 name (the old one warns FutureWarning at every call); older torch
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class DistributedCommunicator:
    """This process's block of clients in a multi-process run (see the module docstring).

    `device`: where the run's tensors live (default: the CPU under gloo, the current CUDA device under NCCL); every
    tensor handed to a method must be there.
    """

    cache_limit = CACHE_BYTES  # what the exchange plans and operators it keeps may hold (the memory planner's)

    def __init__(self, num_clients: int, gossip_mode: str = "p2p", device: torch.device | None = None,
                 owns_group: bool = False):
        if gossip_mode not in GOSSIP_MODES:
            raise ConfigError(f"gossip_mode must be one of {', '.join(GOSSIP_MODES)}; got {gossip_mode!r}")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.blocks = even_blocks(num_clients, self.world_size)
        self.num_clients = num_clients
        self.client_ids = list(self.blocks[self.rank])
        self.gossip_mode = gossip_mode
        self.backend = dist.get_backend()
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else \
                torch.device("cpu")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        # gloo moves CPU tensors only (its all_to_all has no CUDA path): CUDA data is staged through the host
        self.wire = torch.device("cpu") if self.backend == "gloo" else device
        self.owns_group = owns_group
        self.bytes_moved = 0
        self._cache: OrderedDict[tuple, tuple] = OrderedDict()
        self.cache_bytes = 0  # what `_cache` holds (`nbytes`), at most CACHE_BYTES beyond its newest entry
        # the heartbeat, and whose failure stopped this rank; under NCCL it also watches the peers
        self._failures = FailureWatch(self.rank, self.world_size, watch=self.backend in WATCHED_BACKENDS)

    @property
    def is_main(self) -> bool:
        """Whether this is the main process (rank 0)."""
        return self.rank == 0

    # ------------------------------------------------------------------ the boundary
    def _check(self, op: str, *tensors: torch.Tensor) -> None:
        """Every tensor handed to the communicator is on its device (module docstring)."""
        for t in tensors:
            if t.device != self.device:
                raise DeviceMismatch(
                    f"{op}: a {tuple(t.shape)} tensor on {t.device} was handed to the communicator, whose device is "
                    f"{self.device}; the engine must create it on the run's device (NCCL refuses it, gloo hides it "
                    "behind a copy)")

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        """`t` as the backend moves it: on the host for gloo, the device tensor itself for NCCL (contiguous)."""
        return t.to(self.wire).contiguous() if t.device != self.wire else t.contiguous()

    def _back(self, t: torch.Tensor) -> torch.Tensor:
        """A received tensor on the communicator's device (host to device may overlap: non_blocking is legal)."""
        return t if t.device == self.device else t.to(self.device, non_blocking=True)

    def _collective(self, fn, *args, **kwargs):
        """Run one torch.distributed call through the failure watch (`FailureWatch.collective`)."""
        return self._failures.collective(fn, *args, **kwargs)

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        if self.backend == "nccl":
            self._collective(dist.barrier, device_ids=[self.device.index])
        else:
            self._collective(dist.barrier)

    # ------------------------------------------------------------------ gossip
    def mix_steps(self, matrices: list[np.ndarray], X: torch.Tensor) -> torch.Tensor:
        """X_local ← (W_{Q−1} ⋯ W_0)[local, :] X for the global float64 step matrices W_q (rows = receivers)."""
        self._check("mix_steps", X)
        if self.gossip_mode == "allgather":
            is_mean, M = self._cached(("product", *map(id, matrices)), matrices, self._product, X)
            return self._mean_everywhere(X) if is_mean else exact_matmul(M, self._gather_padded(X))
        if len(matrices) > 1:  # the Q steps as one product, when it stays sparse: one exchange, one pass
            composed = self._cached(("composed", *map(id, matrices)), matrices, self._composed, X)
            if composed is not None:
                is_mean, plan, A, index = composed
                return self._mean_everywhere(X) if is_mean else self._exchange(plan, A, index, X)
        previous_mean = False
        for W in matrices:
            is_mean, plan, A, index = self._cached(("step", id(W)), [W], self._step_operator, X)
            if is_mean:
                if not previous_mean:  # J·J = J: consecutive complete steps are one mean
                    X = self._mean_everywhere(X)
            else:
                X = self._exchange(plan, A, index, X)
            previous_mean = is_mean
        return X

    def mix(self, M: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """X_local ← M[local, :] X for any global [m, m] matrix M: one all_gather, then a local matmul."""
        self._check("mix", X)
        rows = M[self.blocks[self.rank].start : self.blocks[self.rank].stop]
        return exact_matmul(rows.to(device=X.device, dtype=X.dtype), self.gather_rows(X))

    def _exchange(self, plan, A, index: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """One gossip step over the network: a neighbour-only exchange, then the local product.

        One neighbour-only exchange (all_to_all_single), then the local rows of W_s times the held rows (`A`, a
        `dfl.network.gossip.RowsOperator`: no concatenation, temporaries of one tile). The send index is the
        plan's, built once on the device (`_step_operator`).
        """
        if plan.rows_sent() == 0:
            return A(X)
        recv_counts = [len(plan.send[q][self.rank]) for q in range(self.world_size)]
        send_counts = [len(plan.send[self.rank][r]) for r in range(self.world_size)]
        inp = self._wire(X.index_select(0, index))
        out = inp.new_empty((sum(recv_counts), *X.shape[1:]))
        self._collective(dist.all_to_all_single, out, inp, recv_counts, send_counts)
        self.bytes_moved += plan.rows_sent() * self._row_bytes(X)
        return A(X, self._back(out))

    def exchange_rows(self, X: torch.Tensor, send: torch.Tensor, send_counts: list[int], recv_counts: list[int],
                      total_rows: int) -> torch.Tensor:
        """Send and receive rows between the ranks in one all_to_all_single.

        Rows X[send] to the ranks in order (send_counts[r] of them to rank r, none to itself) and, concatenated
        by source rank, the recv_counts[q] rows each rank q sends here: one all_to_all_single, for plans every
        rank knows (`dfl.engine.asynchronous`). `send` is one index tensor on the device; `total_rows` = rows
        sent by all ranks together (counted in `bytes_moved`).
        """
        self._check("exchange_rows", X, send)
        inp = self._wire(X.index_select(0, send))
        out = inp.new_empty((sum(recv_counts), *X.shape[1:]))
        self._collective(dist.all_to_all_single, out, inp, recv_counts, send_counts)
        self.bytes_moved += total_rows * self._row_bytes(X)
        return self._back(out)

    def _step_operator(self, matrices, X):
        (W,) = matrices
        if _is_mean(W):
            return True, None, None, None
        plan = exchange_plan(W, self.blocks)
        block = self.blocks[self.rank]
        columns = plan.columns(self.rank)
        if sp.issparse(W):  # large m: the local rows stay sparse ([m_local, held] CSR)
            local = sp.csr_array(W)[block.start : block.stop][:, columns]
        else:
            local = sp.csr_array(W[np.ix_(np.arange(block.start, block.stop), columns)])
        A = RowsOperator(local, len(block), X.dtype, X.device)
        sends = [plan.send[self.rank][r] - block.start for r in range(self.world_size)]
        index = torch.as_tensor(np.concatenate(sends), dtype=torch.long, device=X.device)
        return False, plan, A, index

    def _composed(self, matrices, X):
        """The p2p operator of the product of Q gossip steps, when it is sparse enough.

        The product W_{Q−1} ⋯ W_0 is formed in float64 and used when it has at most COMPOSED_OFFSETS_FACTOR × as
        many nonzeros as the steps together (a ring's Q = 4 steps: 9 diagonals against 4 × 3), else None (step
        by step). One exchange of the rows the product needs, then one pass: Q − 1 fewer collectives and one
        output stack instead of two alive at once.
        """
        product = matrices[0]
        for W in matrices[1:]:
            product = W @ product

        def nnz(M) -> int:
            return M.nnz if sp.issparse(M) else int(np.count_nonzero(M))

        if nnz(product) > COMPOSED_OFFSETS_FACTOR * sum(nnz(W) for W in matrices):
            return None
        return self._step_operator([product], X)

    def _product(self, matrices, X):
        """The local rows of the product, its columns in the padded layout of `_gather_padded` (zeros on padding)."""
        P = matrices[0]
        for W in matrices[1:]:
            P = W @ P
        if sp.issparse(P):
            P = P.toarray() if P.shape[0] <= DENSE_PRODUCT_LIMIT else P
            if sp.issparse(P):
                raise ValueError(f"gossip_mode = allgather forms the product of the step matrices densely; with "
                                 f"{P.shape[0]} clients use gossip_mode = p2p")
        if _is_mean(P):
            return True, None
        block = self.blocks[self.rank]
        size = max(len(b) for b in self.blocks)
        padded = np.zeros((len(block), self.world_size * size))
        for q, b in enumerate(self.blocks):
            padded[:, q * size : q * size + len(b)] = P[block.start : block.stop, b.start : b.stop]
        return False, torch.tensor(padded, dtype=X.dtype, device=X.device)

    def _cached(self, key, matrices, build, X):
        """Plans and operators per matrix object (kept alive here, so ids are not reused) and dtype/device.

        At most _CACHE_SIZE entries in CACHE_BYTES (`nbytes` of the matrices and of what was built), the least
        recently used going first; the newest always stays.
        """
        key = (*key, X.dtype, X.device)
        if key not in self._cache:
            built = build(matrices, X)
            size = nbytes((matrices, built))
            self._cache[key] = (matrices, built, size)
            self.cache_bytes += size
            while len(self._cache) > 1 and (len(self._cache) > _CACHE_SIZE or self.cache_bytes > CACHE_BYTES):
                self.cache_bytes -= self._cache.popitem(last=False)[1][2]
        self._cache.move_to_end(key)
        return self._cache[key][1]

    def _mean_everywhere(self, X: torch.Tensor) -> torch.Tensor:
        """J X: every local row becomes the mean of all rows (one all_reduce)."""
        return self.mean_rows(X).expand_as(X).clone()

    # ------------------------------------------------------------------ reductions and gathers
    def mean_rows(self, X: torch.Tensor) -> torch.Tensor:
        """The average model over every client of every process.

        x̄ = (1/m) Σ_i x_i over every client of every process (summed in float64, block of rows by block of
        rows: `X.sum(dim=0, dtype=torch.float64)` on the whole stack makes a float64 copy of it, two stacks'
        worth).
        """
        self._check("mean_rows", X)
        local = torch.zeros(X.shape[1:], dtype=torch.float64, device=X.device)
        for rows in row_blocks(X):
            local += X[rows].sum(dim=0, dtype=torch.float64)
        return (self.sum(local) / self.num_clients).to(X.dtype)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """Σ over processes (all_reduce), returned on every rank."""
        self._check("sum", value)
        out = self._wire(value.clone())
        self._collective(dist.all_reduce, out, op=dist.ReduceOp.SUM)
        self.bytes_moved += 2 * (self.world_size - 1) * out.numel() * out.element_size()
        return self._back(out)

    def _gather_padded(self, X: torch.Tensor) -> torch.Tensor:
        """[P · size, ...].

        Every rank's block padded to size = the largest block's rows, in rank order (one all_gather_single;
        no concatenation, so one buffer of the population, not two).
        """
        size = max(len(b) for b in self.blocks)
        buf = self._wire(X).new_zeros((size, *X.shape[1:]))
        buf[: X.shape[0]] = self._wire(X)
        out = buf.new_empty((self.world_size * size, *X.shape[1:]))
        self._collective(_ALL_GATHER, out, buf)
        self.bytes_moved += self.world_size * (self.world_size - 1) * buf.numel() * buf.element_size()
        return self._back(out)

    def gather_rows(self, X: torch.Tensor) -> torch.Tensor:
        """All clients' rows in client order, on every rank (all_gather of the blocks, padded to equal size).

        For per-client metrics ([m] vectors); a stack of models goes to the host with `assemble_rows`.
        """
        self._check("gather_rows", X)
        size = max(len(b) for b in self.blocks)
        padded = self._gather_padded(X)
        if all(len(b) == size for b in self.blocks):
            return padded
        keep = torch.cat([torch.arange(q * size, q * size + len(b), device=padded.device)
                          for q, b in enumerate(self.blocks)])
        return padded.index_select(0, keep)

    def assemble_rows(self, X: torch.Tensor) -> torch.Tensor:
        """Every client's rows on the main process's host; this process's rows elsewhere.

        On the main process: [m, ...] in client order, received block by block from the other ranks
        (point-to-point; one block in flight at a time), so no rank but the main one ever holds more than its own rows.
        Elsewhere: this process's rows, on the host. A collective.
        """
        self._check("assemble_rows", X)
        self.bytes_moved += sum(len(b) for b in self.blocks[1:]) * self._row_bytes(X)
        if not self.is_main:
            self._collective(dist.send, self._wire(X), dst=0)
            return X.detach().cpu()
        out = torch.empty((self.num_clients, *X.shape[1:]), dtype=X.dtype, device="cpu")
        out[: X.shape[0]] = X.detach()
        for q in range(1, self.world_size):
            block = self.blocks[q]
            if self.wire.type == "cpu":  # straight into its rows of the result
                self._collective(dist.recv, out[block.start : block.stop], src=q)
                continue
            part = torch.empty((len(block), *X.shape[1:]), dtype=X.dtype, device=self.wire)  # one block in flight
            self._collective(dist.recv, part, src=q)
            out[block.start : block.stop] = part  # NCCL: the host waits here for the receive, not in recv
        self._failures.check()  # an abort during those waits leaves garbage rows: never returned as a result
        return out

    @staticmethod
    def _row_bytes(X: torch.Tensor) -> int:
        return X[0].numel() * X.element_size() if X.shape[0] else 0

    # ------------------------------------------------------------------ failures and shutdown
    def report_failure(self, exc: BaseException) -> None:
        """Record this rank's failure for the other ranks (`FailureWatch.report`)."""
        self._failures.report(exc)

    def peer_failure(self, exc: BaseException) -> BaseException | None:
        """A `PeerFailure` naming the rank that caused `exc`, or None when the error is this rank's own.

        See `FailureWatch.peer_failure`.
        """
        return self._failures.peer_failure(exc)

    def check_peers(self) -> None:
        """Raise `PeerFailure` if another rank's failure already aborted this rank's group (`FailureWatch.check`).

        No collective: under NCCL the results of the collectives in flight when the group was aborted are garbage,
        so the engine calls this before such results leave the process (metrics, checkpoints, the result).
        """
        self._failures.check()

    def finish(self) -> None:
        """This rank has done its last collective of the run (`FailureWatch.finish`).

        From here on no rank watches it, so its end-of-run work (rank 0: summary.json, loggers) may take any time
        without being reported as a silent peer. The engine calls it after the closing barrier of the final
        parameters (`dfl.engine.runner`).
        """
        self._failures.finish()

    def close(self) -> None:
        """Stop the heartbeat; destroy the process group if this communicator created it.

        After a completed run there is no closing collective: every rank has finished (`finish`, after the last
        collective), rank 0 keeps the rendezvous store up until the others have marked it
        (`FailureWatch.wait_for_peers_to_finish`), and each rank destroys its group when its own end-of-run work is
        done. After a failure, rank 0 keeps the store alive for a while so that every rank can read which rank failed
        and why (`FailureWatch.destroy_group_after_failure`).
        """
        failures = self._failures
        if self.owns_group and not (failures.stopping or failures.aborted) and dist.is_initialized():
            failures.finish()  # a run that ended without the engine's finish (it raised nothing, but returned early)
            failures.wait_for_peers_to_finish()
        failures.stop()
        if self.owns_group:
            if failures.stopping or failures.aborted:  # aborted: torch already dropped the group
                failures.destroy_group_after_failure()
            elif dist.is_initialized():
                dist.destroy_process_group()
        self.owns_group = False


def nbytes(obj, seen: set[object] | None = None) -> int:
    """Bytes held by `obj` (the communicator's cache counts its entries with it).

    Numpy arrays, scipy sparse matrices, torch tensors (each storage once: RowsOperator's tables are views of one
    copy), and what containers and plain objects (an exchange plan, a `RowsOperator`) hold of them.
    """
    seen = set() if seen is None else seen
    if id(obj) in seen or obj is None or isinstance(obj, (bool, int, float, str, torch.dtype, torch.device)):
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        key = ("storage", storage.data_ptr() or id(storage))
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if sp.issparse(obj):
        return sum(getattr(obj, name).nbytes for name in ("data", "indices", "indptr") if hasattr(obj, name))
    if isinstance(obj, dict):
        return sum(nbytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v, seen) for v in obj)
    return sum(nbytes(v, seen) for v in getattr(obj, "__dict__", {}).values())


def _is_mean(W) -> bool:
    """W = J = 11ᵀ/n (to float64 rounding): the complete graph with uniform weights (never a sparse W)."""
    return not sp.issparse(W) and bool(np.allclose(W, 1.0 / W.shape[0], rtol=0.0, atol=1e-12))
