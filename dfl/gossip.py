"""Gossip: X ← W_t X for each gossip step t, as one matmul with the product of the step matrices.

Gossip is linear, so Q steps equal one step with W_{s+Q−1} ⋯ W_{s+1} W_s (= W^Q for a static W;
TOPOLOGIES.md A1). The product is formed in float64 and applied once, which is exact to the
precision of the final matmul; a multi-process communicator may instead apply the steps one at a
time, exchanging only the rows neighbours need (`dfl.distributed`). Gossip step s is global: round t
of an algorithm with Q steps per round uses steps tQ, …, tQ+Q−1, so time-varying schedules advance
the same way whatever the algorithm.
"""

from __future__ import annotations

import numpy as np
import torch


class Gossip:
    def __init__(self, topology, comm, dtype: torch.dtype, device: torch.device):
        self.topology = topology
        self.comm = comm
        self.dtype = dtype
        self.device = device
        self._static: dict[int, torch.Tensor] = {}

    def product(self, first_step: int, steps: int) -> np.ndarray:
        """W_{first+steps−1} ⋯ W_{first} in float64."""
        if not self.topology.is_time_varying:
            return np.linalg.matrix_power(self.topology.W, steps)
        P = np.eye(self.topology.n)
        for s in range(first_step, first_step + steps):
            P = self.topology.matrix(s) @ P
        return P

    def operator(self, first_step: int, steps: int) -> torch.Tensor:
        if not self.topology.is_time_varying:
            if steps not in self._static:
                self._static[steps] = self._tensor(self.product(0, steps))
            return self._static[steps]
        return self._tensor(self.product(first_step, steps))

    def mix(self, X: torch.Tensor, first_step: int, steps: int) -> torch.Tensor:
        """Apply gossip steps first_step … first_step+steps−1 to the local rows X.

        A multi-process communicator (one with `mix_steps`) gets the step matrices themselves, so it can
        exchange only the rows each step needs; a single process applies their product in one matmul.
        """
        mix_steps = getattr(self.comm, "mix_steps", None)
        if mix_steps is not None:
            return mix_steps([self.topology.matrix(s) for s in range(first_step, first_step + steps)], X)
        return self.comm.mix(self.operator(first_step, steps), X)

    def sends(self, first_step: int, steps: int) -> np.ndarray:
        """Models each client sends over these steps: Σ_s out-degree of client j in W_s (self excluded)."""
        out = np.zeros(self.topology.n, dtype=np.int64)
        for s in range(first_step, first_step + steps):
            W = self.topology.matrix(s)
            out += (W > 0).sum(axis=0) - (np.diag(W) > 0)
        return out

    def _tensor(self, M: np.ndarray) -> torch.Tensor:
        return torch.tensor(np.asarray(M), dtype=self.dtype, device=self.device)
