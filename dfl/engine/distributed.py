"""Multi-process runs on torch.distributed: process-group set-up from the torchrun environment, and the
communicator that moves client rows between processes.

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
2(P−1)·B (what a ring all-reduce sends). Every collective of the communicator is counted (metrics too).
"""

from __future__ import annotations

import os
import socket
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
    PeerFailure,  # noqa: F401 (re-exported)
)
from dfl.network.comm import LocalCommunicator, even_blocks, exchange_plan
from dfl.network.gossip import csr_tensor

GOSSIP_MODES = ("p2p", "allgather")
FAILURE_KEY = "dfl/failure"
STOPPED_KEY = "dfl/stopped"  # ranks that have read or written the failure
STORE_GRACE_SECONDS = 10.0  # how long rank 0 keeps the store alive for the others to read the failure
_CACHE_SIZE = 64  # exchange plans / products kept (static and periodic topologies reuse a few)
DENSE_PRODUCT_LIMIT = 20_000  # allgather mode: largest m whose [m, m] product is formed


def env_world_size() -> int:
    """WORLD_SIZE from the environment (torchrun sets it); 1 when unset."""
    return _env_int("WORLD_SIZE", 1, minimum=1)


def communicator_from_env(config, num_clients: int):
    """The communicator for this process: `LocalCommunicator` in a world of one, else a
    `DistributedCommunicator` on the process group (initialised here from the torchrun environment,
    or the one the caller already initialised)."""
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
        torch.cuda.set_device(device)  # before any NCCL call (TOPOLOGIES.md B2)
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
    """cuda:LOCAL_RANK when the run uses CUDA, else cpu. One process per GPU: NCCL refuses two ranks
    on one device, so an explicit "cuda:k" is rejected in a multi-process run."""
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
    """This process's block of clients in a multi-process run (see the module docstring)."""

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
        self.device = device
        self.backend = dist.get_backend()
        # gloo moves CPU tensors only (its all_to_all has no CUDA path): stage CUDA data through the host
        self._stage = self.backend == "gloo"
        self.owns_group = owns_group
        self.bytes_moved = 0
        self._stopping = False  # a failure on any rank: no more collectives
        self._cache: OrderedDict[tuple, tuple] = OrderedDict()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ gossip
    def mix_steps(self, matrices: list[np.ndarray], X: torch.Tensor) -> torch.Tensor:
        """X_local ← (W_{Q−1} ⋯ W_0)[local, :] X for the global float64 step matrices W_q (rows = receivers)."""
        if self.gossip_mode == "allgather":
            is_mean, M = self._cached(("product", *map(id, matrices)), matrices, self._product, X)
            return self._mean_everywhere(X) if is_mean else M @ self.gather_rows(X)
        previous_mean = False
        for W in matrices:
            is_mean, plan, A = self._cached(("step", id(W)), [W], self._step_operator, X)
            if is_mean:
                if not previous_mean:  # J·J = J: consecutive complete steps are one mean
                    X = self._mean_everywhere(X)
            else:
                X = self._exchange(plan, A, X)
            previous_mean = is_mean
        return X

    def mix(self, M: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """X_local ← M[local, :] X for any global [m, m] matrix M: one all_gather, then a local matmul."""
        rows = M[self.blocks[self.rank].start : self.blocks[self.rank].stop]
        return rows.to(device=X.device, dtype=X.dtype) @ self.gather_rows(X)

    def _exchange(self, plan, A: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """One neighbour-only exchange (all_to_all_single), then the local rows of W_s times the held rows."""
        if plan.rows_sent() == 0:
            return A @ X
        start = self.blocks[self.rank].start
        sends = [plan.send[self.rank][r] - start for r in range(self.world_size)]
        recv_counts = [len(plan.send[q][self.rank]) for q in range(self.world_size)]
        index = torch.as_tensor(np.concatenate(sends), dtype=torch.long, device=X.device)
        inp = self._wire(X.index_select(0, index))
        out = inp.new_empty((sum(recv_counts), *X.shape[1:]))
        dist.all_to_all_single(out, inp, recv_counts, [len(s) for s in sends])
        self.bytes_moved += plan.rows_sent() * self._row_bytes(X)
        return A @ torch.cat([X, out.to(X.device)])

    def exchange_rows(self, X: torch.Tensor, send: list[torch.Tensor], recv_counts: list[int],
                      total_rows: int) -> torch.Tensor:
        """Rows X[send[r]] to every rank r (empty to itself) and, concatenated by source rank, the recv_counts[q]
        rows each rank q sends here: one all_to_all_single, for plans every rank knows (`dfl.engine.asynchronous`).
        `total_rows` = rows sent by all ranks together (counted in `bytes_moved`)."""
        inp = self._wire(X[torch.cat(send).to(X.device)])
        out = inp.new_empty((sum(recv_counts), *X.shape[1:]))
        dist.all_to_all_single(out, inp, recv_counts, [len(s) for s in send])
        self.bytes_moved += total_rows * self._row_bytes(X)
        return out.to(X.device)

    def _step_operator(self, matrices, X):
        (W,) = matrices
        if _is_mean(W):
            return True, None, None
        plan = exchange_plan(W, self.blocks)
        block = self.blocks[self.rank]
        columns = plan.columns(self.rank)
        if sp.issparse(W):  # large m: the local rows stay sparse ([m_local, held] CSR)
            A = csr_tensor(sp.csr_array(W)[block.start : block.stop][:, columns], X.dtype, X.device)
        else:
            A = torch.as_tensor(W[np.ix_(np.arange(block.start, block.stop), columns)], dtype=X.dtype,
                                device=X.device)
        return False, plan, A

    def _product(self, matrices, X):
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
        return False, torch.tensor(P[block.start : block.stop], dtype=X.dtype, device=X.device)

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
        """x̄ = (1/m) Σ_i x_i over every client of every process (summed in float64)."""
        total = self.sum(X.sum(dim=0, dtype=torch.float64))
        return (total / self.num_clients).to(X.dtype)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """Σ over processes (all_reduce), returned on every rank."""
        out = self._wire(value.clone())
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        self.bytes_moved += 2 * (self.world_size - 1) * out.numel() * out.element_size()
        return out.to(value.device)

    def gather_rows(self, X: torch.Tensor) -> torch.Tensor:
        """All clients' rows in client order, on every rank (all_gather of the blocks, padded to equal size)."""
        size = max(len(b) for b in self.blocks)
        buf = self._wire(X).new_zeros((size, *X.shape[1:]))
        buf[: X.shape[0]] = X
        parts = [torch.empty_like(buf) for _ in range(self.world_size)]
        dist.all_gather(parts, buf)
        self.bytes_moved += self.world_size * (self.world_size - 1) * buf.numel() * buf.element_size()
        return torch.cat([p[: len(b)] for p, b in zip(parts, self.blocks)]).to(X.device)

    def _wire(self, t: torch.Tensor) -> torch.Tensor:
        return t.cpu() if self._stage else t.contiguous()

    @staticmethod
    def _row_bytes(X: torch.Tensor) -> int:
        return X[0].numel() * X.element_size() if X.shape[0] else 0

    # ------------------------------------------------------------------ failures and shutdown
    def report_failure(self, exc: BaseException) -> None:
        """Record "rank r failed: …" in the rendezvous store so the other ranks can say why they stopped.
        Their blocked collectives fail when this process exits (gloo closes its sockets) or after
        `dist_timeout` (NCCL watchdog)."""
        if isinstance(exc, PeerFailure) or _is_comm_error(exc):
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
        """A `PeerFailure` naming the failed rank when `exc` is a communication error caused by it."""
        if isinstance(exc, PeerFailure) or not _is_comm_error(exc):
            return None
        self._stopping = True
        message = None
        store = _store()
        if store is not None:
            try:
                if store.check([FAILURE_KEY]):
                    message = store.get(FAILURE_KEY).decode()
                store.add(STOPPED_KEY, 1)
            except Exception:  # the store may have lived in the failed process
                message = None
        if message is not None and not message.startswith(f"rank {self.rank} "):
            return PeerFailure(f"rank {self.rank} stopped because {message}")
        return PeerFailure(
            f"rank {self.rank} stopped: a collective failed ({_describe(exc)}); another rank probably failed, "
            "was killed or exceeded dist_timeout — see its output"
        )

    def close(self) -> None:
        """Destroy the process group if this communicator created it.

        After a failure, rank 0 (which hosts the rendezvous store unless torchrun's agent does) closes its
        connections, which makes the others' pending collectives fail, then keeps the store alive for up
        to STORE_GRACE_SECONDS so that every rank can read which rank failed and why."""
        if not (self.owns_group and dist.is_initialized()):
            self.owns_group = False
            return
        store = _store() if (self._stopping and self.rank == 0) else None  # keeps the server up
        if not self._stopping:
            # let every rank finish its last exchange before any rank tears its connections down
            dist.barrier()
        dist.destroy_process_group()
        self.owns_group = False
        if store is not None:
            _wait_for_stopped_ranks(store, self.world_size)


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


def _is_comm_error(exc: BaseException) -> bool:
    # gloo reports a dead peer as a plain RuntimeError; subclasses (e.g. DivergenceError) are ours
    return isinstance(exc, dist.DistError) or type(exc) is RuntimeError


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None
