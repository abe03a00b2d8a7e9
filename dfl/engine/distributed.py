"""Multi-process runs on torch.distributed.

Process-group set-up from the torchrun environment, and the communicator that moves client rows between processes.

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

Failures. A rank that fails records "rank r (host) failed: …" in the rendezvous store before it leaves the group
(`report_failure`); every rank's heartbeat thread bumps a counter in the store every HEARTBEAT_SECONDS. When a
collective fails, `peer_failure` names the cause: the recorded failure of another rank, or a rank whose heartbeat
stopped (SIGKILL, a lost node) — `PeerFailure: rank r stopped because rank k …` — and if no other rank failed, the
error is this rank's own and is reported as such (never blamed on "another rank"). gloo notices a dead peer at
once (its sockets close). NCCL does not: a rank blocked in a collective waits for the watchdog; so under NCCL the
heartbeat thread also watches, and on a recorded failure or a heartbeat silent for STALE_SECONDS it aborts the
process group, which ends the blocked collective, and the rank stops with PeerFailure within seconds.
`init_process_group` sets TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (unless set): on a timeout or an NCCL error the
watchdog aborts the communicators without killing the process, so the blocked rank raises and dfl reports why,
instead of the watchdog tearing the process down with a C++ abort (the default, 3, in torch 2.13).
`dist_timeout` stays the bound on any wait (a frozen rank: its heartbeat thread still runs).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import OrderedDict
from datetime import timedelta

import numpy as np
import scipy.sparse as sp
import torch

# torch.func (vmap/grad, used by local training) imports torch._dynamo lazily. Imported while a process
# group exists, it keeps references to the group, so destroy_process_group leaves gloo's threads running
# and the process may abort at exit ("terminate called without an active exception", torch 2.13).
# Importing it here, before any group (dfl imports this module), avoids that; training imports it anyway.
import torch._dynamo  # noqa: F401
import torch.distributed as dist

from dfl.errors import (
    ConfigError,
    DeviceMismatch,
    PeerFailure,  # noqa: F401 (re-exported)
)
from dfl.network.comm import LocalCommunicator, even_blocks, exchange_plan
from dfl.network.gossip import COMPOSED_OFFSETS_FACTOR, RowsOperator, exact_matmul
from dfl.training.evaluate import row_blocks

GOSSIP_MODES = ("p2p", "allgather")
FAILURE_KEY = "dfl/failure"
STOPPED_KEY = "dfl/stopped"  # ranks that have read or written the failure
STORE_GRACE_SECONDS = 10.0  # how long rank 0 keeps the store alive for the others to read the failure
HEARTBEAT_SECONDS = 1.0  # each rank bumps its heartbeat counter in the store this often (a daemon thread)
STALE_SECONDS = 10.0  # NCCL: a peer whose heartbeat has not moved for this long is gone; the group is aborted
DEAD_PEER_SECONDS = 3.0  # after a failed collective: how long heartbeats are watched to name a dead peer
# Set for NCCL groups unless the environment already sets them (module docstring): the watchdog aborts the
# communicators on a timeout or NCCL error without tearing the process down, so the rank can report why.
NCCL_ENVIRONMENT = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}
_CACHE_SIZE = 64  # exchange plans / products kept (static and periodic topologies reuse a few)
DENSE_PRODUCT_LIMIT = 20_000  # allgather mode: largest m whose [m, m] product is formed


def env_world_size() -> int:
    """WORLD_SIZE from the environment (torchrun sets it); 1 when unset."""
    return _env_int("WORLD_SIZE", 1, minimum=1)


def communicator_from_env(config, num_clients: int):
    """The communicator for this process.

    `LocalCommunicator` in a world of one, else a `DistributedCommunicator` on the process group (initialised here
    from the torchrun environment, or the one the caller already initialised).
    """
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() == 1:
            return LocalCommunicator(num_clients)
        device = _device(config, dist.get_backend(), _env_int("LOCAL_RANK", 0, minimum=0))
        return DistributedCommunicator(num_clients, config.gossip_mode, device, owns_group=False)
    world = env_world_size()
    if world == 1:
        return LocalCommunicator(num_clients)
    even_blocks(num_clients, world)  # fewer clients than processes: fail on every rank before connecting
    init_process_group(config)
    try:
        return DistributedCommunicator(num_clients, config.gossip_mode, _run_device(config), owns_group=True)
    except BaseException:
        dist.destroy_process_group()
        raise


def init_process_group(config) -> None:
    """Initialise the default process group from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT.

    NCCL when CUDA is available (and device is not "cpu"), gloo otherwise; `config.backend` overrides.
    With CUDA each process uses cuda:LOCAL_RANK (set before the group is created). The timeout is
    `config.dist_timeout`; an eager barrier makes every rank connect now rather than at the first
    gossip step, so a missing rank fails here.
    """
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build; run with one process")
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK"):
        if name not in os.environ:
            raise ConfigError(
                f"WORLD_SIZE={env_world_size()} but {name} is not set: launch multi-process runs with torchrun "
                "(see launch/torchrun.sh), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
            )
    rank = _env_int("RANK", 0, minimum=0)
    world = env_world_size()
    if rank >= world:
        raise ConfigError(f"RANK must be in 0..{world - 1} (WORLD_SIZE={world}), got {rank}")
    backend = choose_backend(config)
    device = _run_device(config)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before any NCCL call (docs/concepts/vectorized-clients.md#clients-on-processes)
    if backend == "nccl":
        for name, value in NCCL_ENVIRONMENT.items():  # read when the group is created
            os.environ.setdefault(name, value)
    timeout = timedelta(seconds=config.dist_timeout)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
    try:
        if backend == "nccl":
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise


def choose_backend(config) -> str:
    """`config.backend`, with "auto" = NCCL when CUDA is available and device is not "cpu", else gloo."""
    cuda = torch.cuda.is_available() and config.device != "cpu"
    backend = config.backend
    if backend == "auto":
        return "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise ConfigError(
            "backend = 'nccl' needs CUDA tensors: set device = 'auto' or 'cuda' on a machine with GPUs, "
            "or backend = 'gloo' (or 'auto') for CPU workers"
        )
    if backend not in ("nccl", "gloo"):
        raise ConfigError(f"backend must be one of auto, nccl, gloo; got {backend!r}")
    return backend


def _run_device(config) -> torch.device:
    return _device(config, choose_backend(config), _env_int("LOCAL_RANK", 0, minimum=0))


def _device(config, backend: str, local_rank: int) -> torch.device:
    """cuda:LOCAL_RANK when the run uses CUDA, else cpu.

    One process per GPU: NCCL refuses two ranks on one device, so an explicit "cuda:k" is rejected in a
    multi-process run.
    """
    name = config.device
    if name == "cpu":
        if backend == "nccl":
            raise ConfigError("backend = 'nccl' needs device = 'auto' or 'cuda'; use backend = 'gloo' with cpu")
        return torch.device("cpu")
    if name == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available; use device = 'cpu' or 'auto'")
    if name not in ("auto", "cuda"):
        raise ConfigError(
            f"device must be 'auto', 'cuda' or 'cpu' in a multi-process run (each process uses "
            f"cuda:LOCAL_RANK); got {name!r}"
        )
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise ConfigError(
            f"LOCAL_RANK={local_rank} but this node has {count} visible GPU(s): start at most {count} "
            "processes per node (torchrun --nproc_per_node), one per GPU"
        )
    return torch.device("cuda", local_rank)


def _env_int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"environment variable {name} must be an integer >= {minimum}, got {value}")
    return value


class DistributedCommunicator:
    """This process's block of clients in a multi-process run (see the module docstring).

    `device`: where the run's tensors live (default: the CPU under gloo, the current CUDA device under NCCL); every
    tensor handed to a method must be there.
    """

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
        self._stopping = False  # a failure on any rank: no more collectives
        self._cache: OrderedDict[tuple, tuple] = OrderedDict()
        self._collective_error: BaseException | None = None  # the latest exception raised inside a collective
        self._dead = 0  # peers found dead (their heartbeat stopped): they will not say they stopped
        self._monitor = _Monitor.start(self.rank, self.world_size, watch=self.backend == "nccl")

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
        """Run one torch.distributed call.

        An exception it raises is marked as a collective failure (`peer_failure` decides whose), and a failure
        the heartbeat thread saw stops the rank with PeerFailure.
        """
        if self._monitor is not None and self._monitor.failure is not None:
            raise PeerFailure(f"rank {self.rank} stopped because {self._monitor.failure}")
        try:
            out = fn(*args, **kwargs)
        except BaseException as exc:
            self._collective_error = exc
            raise
        if self._monitor is not None and self._monitor.failure is not None:  # aborted while we were blocked
            raise PeerFailure(f"rank {self.rank} stopped because {self._monitor.failure}")
        return out

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

        The p2p operator of the product W_{Q−1} ⋯ W_0 (float64) when it has at most COMPOSED_OFFSETS_FACTOR × as
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
        """Plans and operators per matrix object (kept alive here, so ids are not reused) and dtype/device."""
        key = (*key, X.dtype, X.device)
        if key not in self._cache:
            self._cache[key] = (matrices, build(matrices, X))
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
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

        Every rank's block padded to size = the largest block's rows, in rank order (one all_gather_into_tensor;
        no concatenation, so one buffer of the population, not two).
        """
        size = max(len(b) for b in self.blocks)
        buf = self._wire(X).new_zeros((size, *X.shape[1:]))
        buf[: X.shape[0]] = self._wire(X)
        out = buf.new_empty((self.world_size * size, *X.shape[1:]))
        self._collective(dist.all_gather_into_tensor, out, buf)
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

        Every client's rows on the main process's host, [m, ...] in client order, received block by block from
        the other ranks (point-to-point; one block in flight at a time): no rank but the main one ever holds
        more than its own rows. Elsewhere: this process's rows, on the host. A collective.
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
            out[block.start : block.stop] = part
        return out

    @staticmethod
    def _row_bytes(X: torch.Tensor) -> int:
        return X[0].numel() * X.element_size() if X.shape[0] else 0

    # ------------------------------------------------------------------ failures and shutdown
    def report_failure(self, exc: BaseException) -> None:
        """Record "rank r failed.

        …" in the rendezvous store so the other ranks can say why they stopped. Their blocked collectives fail
        when this process exits (gloo closes its sockets) or, under NCCL, when their heartbeat threads read the
        record and abort the group (module docstring).
        """
        if isinstance(exc, PeerFailure):
            return
        self._stopping = True
        store = _store()
        if store is None:
            return
        try:
            if not store.check([FAILURE_KEY]):
                store.set(FAILURE_KEY, f"rank {self.rank} ({socket.gethostname()}) failed: {_describe(exc)}")
            store.add(STOPPED_KEY, 1)
        except Exception:  # the store itself may be gone; the error still propagates on this rank
            pass

    def peer_failure(self, exc: BaseException) -> BaseException | None:
        """A `PeerFailure` naming the rank that caused `exc`, or None when the error is this rank's own.

        A `PeerFailure` naming the rank that caused `exc` here, when `exc` is a failed collective (one of the
        communicator's, or a plain RuntimeError: gloo's report of a dead peer in another library's collective,
        e.g. a checkpoint's) and another rank failed (recorded in the store, or its heartbeat stopped); None
        when the error is this rank's own, which is then reported as it is.
        """
        if isinstance(exc, PeerFailure) or not (self._from_collective(exc) or type(exc) is RuntimeError):
            return None
        message = self._monitor.failure if self._monitor is not None else None
        store = _store()
        if message is None and store is not None:
            try:
                if store.check([FAILURE_KEY]):
                    message = store.get(FAILURE_KEY).decode()
            except Exception:  # the store may have lived in the failed process
                message = "rank 0 (which hosts the rendezvous store) failed or was killed"
        if message is None and self._monitor is not None:
            dead = self._monitor.silent_peers(DEAD_PEER_SECONDS)
            self._dead = len(dead)
            if dead:
                message = (f"rank {dead[0]} stopped responding (killed, or its node was lost: its heartbeat stopped; "
                           f"see its output)")
        if message is None or message.startswith(f"rank {self.rank} "):
            return None  # nobody else failed: the collective's error is this rank's own, reported as it is
        self._stopping = True
        try:
            if store is not None:
                store.add(STOPPED_KEY, 1)
        except Exception:
            pass
        return PeerFailure(f"rank {self.rank} stopped because {message}")

    def _from_collective(self, exc: BaseException) -> bool:
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:
            if e is self._collective_error or isinstance(e, dist.DistError):
                return True
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return False

    def close(self) -> None:
        """Stop the heartbeat; destroy the process group if this communicator created it.

        After a failure, rank 0 (which hosts the rendezvous store unless torchrun's agent does) closes its
        connections, which makes the others' pending collectives fail, then keeps the store alive for up
        to STORE_GRACE_SECONDS so that every rank can read which rank failed and why.
        """
        if self._monitor is not None:
            self._monitor.stop()
        if not (self.owns_group and dist.is_initialized()):
            self.owns_group = False
            return
        store = _store() if (self._stopping and self.rank == 0) else None  # keeps the server up
        if not self._stopping:
            # let every rank finish its last exchange before any rank tears its connections down
            self.barrier()
        dist.destroy_process_group()
        self.owns_group = False
        if store is not None:
            _wait_for_stopped_ranks(store, self.world_size - self._dead)


class _Monitor:
    """The heartbeat thread of one rank (module docstring).

    Bumps `dfl/beat/<rank>` every HEARTBEAT_SECONDS; with `watch` (NCCL) it also reads the failure record and the
    peers' heartbeats, and aborts the process group on a failure or a peer silent for STALE_SECONDS, so that a
    blocked collective ends.
    """

    def __init__(self, store, rank: int, world: int, watch: bool):
        self.store, self.rank, self.world, self.watch = store, rank, world, watch
        self.failure: str | None = None
        self._stop = threading.Event()
        self._seen = {q: (-1, time.monotonic()) for q in range(world) if q != rank}
        self._thread = threading.Thread(target=self._run, name=f"dfl-heartbeat-{rank}", daemon=True)

    @classmethod
    def start(cls, rank: int, world: int, watch: bool) -> _Monitor | None:
        store = _store()
        if store is None or world < 2:
            return None
        monitor = cls(store, rank, world, watch)
        monitor._thread.start()
        return monitor

    def stop(self) -> None:
        self._stop.set()

    def beats(self) -> dict[int, int]:
        return {q: int(self.store.add(f"dfl/beat/{q}", 0)) for q in self._seen}

    def silent_peers(self, seconds: float) -> list[int]:
        """Peers whose heartbeat does not move for `seconds` (watched now, in the calling thread)."""
        try:
            first = self.beats()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(min(0.25, seconds))
                now = self.beats()
                first = {q: v for q, v in first.items() if now[q] == v}
                if not first:
                    return []
            return sorted(first)
        except Exception:  # the store is gone: it lived in rank 0 (no torchrun agent)
            return [0] if self.rank != 0 else []

    def _run(self) -> None:
        key = f"dfl/beat/{self.rank}"
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self.store.add(key, 1)
                if self.watch and self.failure is None:
                    self._watch()
            except Exception:  # the store is gone (the run is ending, or rank 0 died): nothing left to watch
                return

    def _watch(self) -> None:
        if self.store.check([FAILURE_KEY]):
            message = self.store.get(FAILURE_KEY).decode()
            if not message.startswith(f"rank {self.rank} "):
                self._abort(message)
            return
        now = time.monotonic()
        for q, value in self.beats().items():
            last, since = self._seen[q]
            if value != last:
                self._seen[q] = (value, now)
            elif now - since > STALE_SECONDS:
                message = f"rank {q} stopped responding (no heartbeat for {STALE_SECONDS:.0f} s: killed, or its node " \
                          "was lost; see its output)"
                if not self.store.check([FAILURE_KEY]):
                    self.store.set(FAILURE_KEY, message)
                self._abort(message)
                return

    def _abort(self, message: str) -> None:
        self.failure = message
        try:  # ends the collective the main thread is blocked in (NCCL); it then raises PeerFailure
            dist.distributed_c10d._abort_process_group()
        except Exception:
            pass


def _wait_for_stopped_ranks(store, world_size: int) -> None:
    deadline = time.monotonic() + STORE_GRACE_SECONDS
    try:
        while time.monotonic() < deadline:
            if store.add(STOPPED_KEY, 0) >= world_size:
                return
            time.sleep(0.05)
    except Exception:  # a broken store: nothing left to wait for
        return


def _is_mean(W) -> bool:
    """W = J = 11ᵀ/n (to float64 rounding): the complete graph with uniform weights (never a sparse W)."""
    return not sp.issparse(W) and bool(np.allclose(W, 1.0 / W.shape[0], rtol=0.0, atol=1e-12))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None
