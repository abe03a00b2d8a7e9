"""Communicators: how the rows of the client stack meet across processes.

`LocalCommunicator` is a world of one process hosting every client: mixing is one matmul, means are
row means. The torch.distributed communicator (multi-process) implements the same methods, so
algorithms and metrics never know how many processes there are.
"""

from __future__ import annotations

import torch


def even_blocks(num_clients: int, world_size: int) -> list[range]:
    """Contiguous client blocks, as even as possible: the first (m mod P) ranks host one extra client."""
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
    """A single process hosting all `num_clients` clients."""

    rank = 0
    world_size = 1

    def __init__(self, num_clients: int):
        self.num_clients = num_clients
        self.client_ids = list(range(num_clients))
        self.bytes_moved = 0  # bytes exchanged between processes (none in a world of one)

    @property
    def is_main(self) -> bool:
        return True

    def mix(self, M: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """X ← M X for the global [m, m] mixing matrix M (rows = receivers)."""
        return M @ X

    def mean_rows(self, X: torch.Tensor) -> torch.Tensor:
        """x̄ = (1/m) Σ_i x_i over every client of every process."""
        return X.mean(dim=0)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of a tensor over processes."""
        return value

    def gather_rows(self, X: torch.Tensor) -> torch.Tensor:
        """All clients' rows, in client order (complete on the main process)."""
        return X

    def close(self) -> None:
        pass
