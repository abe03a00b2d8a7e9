"""Communicators: how the rows of the client stack meet across processes.

`LocalCommunicator` is a world of one process hosting every client: mixing is one matmul, means are
row means. The torch.distributed communicator (multi-process) implements the same methods, so
algorithms and metrics never know how many processes there are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch


def even_blocks(num_clients: int, world_size: int) -> list[range]:
    """Contiguous client blocks, as even as possible: the first (m mod P) ranks host one extra client.

    Rank r hosts clients [r·⌊m/P⌋ + min(r, m mod P), …) — e.g. m = 10, P = 4 gives 0–2, 3–5, 6–7, 8–9.
    Contiguity keeps a ring or torus crossing few process boundaries
    (docs/concepts/vectorized-clients.md#clients-on-processes).
    """
    if num_clients < world_size:
        raise ValueError(
            f"clients ({num_clients}) must be >= the number of processes ({world_size}): every process "
            "hosts at least one client"
        )
    base, extra = divmod(num_clients, world_size)
    blocks, start = [], 0
    for r in range(world_size):
        size = base + (1 if r < extra else 0)
        blocks.append(range(start, start + size))
        start += size
    return blocks


class LocalCommunicator:
    """A single process hosting all `num_clients` clients.

    It implements the engine's communicator interface (`dfl.algorithms.base.EngineCommunicator`): nothing crosses a
    process boundary, so the failure methods have nothing to report or name.
    """

    rank = 0
    world_size = 1
    gossip_mode = None  # no gossip crosses processes

    def __init__(self, num_clients: int):
        self.num_clients = num_clients
        self.client_ids = list(range(num_clients))
        self.bytes_moved = 0  # bytes exchanged between processes (none in a world of one)
        self.device: torch.device | None = None  # the runner picks the device from the config

    @property
    def is_main(self) -> bool:
        """True: a single process is the main one."""
        return True

    def mix(self, M: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """X ← M X for the global [m, m] mixing matrix M (rows = receivers), in IEEE fp32/fp64 (never TF32)."""
        from dfl.network.gossip import exact_matmul

        return exact_matmul(M, X)

    def mean_rows(self, X: torch.Tensor) -> torch.Tensor:
        """x̄ = (1/m) Σ_i x_i over every client of every process."""
        return X.mean(dim=0)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of a tensor over processes."""
        return value

    def gather_rows(self, X: torch.Tensor) -> torch.Tensor:
        """All clients' rows, in client order (complete on the main process)."""
        return X

    def assemble_rows(self, X: torch.Tensor) -> torch.Tensor:
        """Every client's rows on the host (the main process's, in a multi-process run): here X itself on the CPU."""
        return X.detach().cpu()

    def barrier(self) -> None:
        """Wait for every process (none to wait for in a world of one)."""

    def report_failure(self, exc: BaseException) -> None:
        """Tell the other processes that this one failed (nothing to tell in a world of one)."""

    def peer_failure(self, exc: BaseException) -> BaseException | None:
        """The failure of another process that caused `exc` here, if any (never, in a world of one)."""
        return None

    def check_peers(self) -> None:
        """Raise the failure of another process known here (none, in a world of one)."""

    def finish(self) -> None:
        """The run's last collective is done (nobody to tell in a world of one)."""

    def close(self) -> None:
        """Nothing to release in a single process."""
        pass


@dataclass(frozen=True)
class ExchangePlan:
    """Who sends which rows to whom for one gossip matrix W, seen from every rank at once.

    `send[q][r]` are the global ids of the clients of rank q that rank r needs (their column of W has a
    nonzero in a row of rank r), sorted; the plan is computed identically on every rank from W alone,
    so the exchange is symmetric and deterministic. `columns(r)` are the clients whose rows rank r
    holds after the exchange: its own, then the received ones by source rank.
    """

    blocks: tuple[range, ...]
    send: tuple[tuple[np.ndarray, ...], ...]  # send[q][r]: global client ids, q -> r (empty when q == r)

    def columns(self, rank: int) -> np.ndarray:
        """The clients whose rows rank `rank` mixes: its own block, then those it receives, in plan order."""
        received = [self.send[q][rank] for q in range(len(self.blocks)) if q != rank]
        return np.concatenate([np.arange(self.blocks[rank].start, self.blocks[rank].stop), *received])

    def rows_sent(self) -> int:
        """Rows sent between processes by all ranks together."""
        return sum(len(ids) for row in self.send for ids in row)


def exchange_plan(W, blocks: list[range]) -> ExchangePlan:
    """The neighbour-only exchange for x_i ← Σ_l W[i, l] x_l when rank r hosts clients blocks[r].

    W is a dense array or a scipy sparse matrix (then only its nonzeros are visited).
    """
    support = sp.csr_array(W) if sp.issparse(W) else np.asarray(W) != 0
    send = []
    for q, src in enumerate(blocks):
        row = []
        for r, dst in enumerate(blocks):
            if q == r:
                row.append(np.zeros(0, dtype=np.int64))
                continue
            piece = support[dst.start : dst.stop, src.start : src.stop]
            needed = np.unique(piece.indices[piece.data != 0]) if sp.issparse(piece) else np.flatnonzero(
                piece.any(axis=0))
            row.append(src.start + needed.astype(np.int64))
        send.append(tuple(row))
    return ExchangePlan(blocks=tuple(blocks), send=tuple(send))
