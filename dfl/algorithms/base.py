"""What every algorithm gets (`Context`) and gives (`Algorithm.round`).

An algorithm owns the client stack X (`[m_local, d]`, rows = this process's clients) and any
per-client state; `round(t)` performs one communication round and returns its statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from dfl.local import LocalRule


@dataclass
class Context:
    config: Any  # dfl.Config
    hp: dict[str, Any]  # resolved hyperparameters of this algorithm
    trainer: Any  # dfl.local.LocalTrainer
    gossip: Any  # dfl.gossip.Gossip
    comm: Any  # a communicator (dfl.comm)

    def lr(self, t: int) -> float:
        """η_t = η_0 · γ^t (per-round decay)."""
        return self.config.lr * self.config.lr_decay**t

    def rule(self, **overrides: Any) -> LocalRule:
        """The local rule from the config and this algorithm's hyperparameters."""
        values = dict(
            rho=self.hp.get("rho", 0.0),
            sam=self.hp.get("sam", "sam"),
            asam_eta=self.hp.get("asam_eta", 0.2),
            momentum=self.hp.get("momentum", 0.0),
            weight_decay=self.config.weight_decay,
            clip_grad_norm=self.config.clip_grad_norm,
        )
        values.update(overrides)
        return LocalRule(**values)


@dataclass
class RoundStats:
    train_loss: torch.Tensor  # [m_local] mean local minibatch loss per client
    models_sent: np.ndarray  # [m] models each client sent this round (all clients)
    trained: torch.Tensor | None = None  # [m_local] bool: clients that trained this round (None = all)


class Algorithm:
    name: ClassVar[str]
    # Config fields this algorithm reads, with its defaults (None in the Config = use these).
    hyperparameters: ClassVar[dict[str, Any]] = {}

    def __init__(self, ctx: Context, X: torch.Tensor):
        self.ctx = ctx
        self.X = X

    def round(self, t: int) -> RoundStats:
        raise NotImplementedError

    def state(self) -> dict[str, torch.Tensor]:
        """Per-client and server state beyond X, for checkpoints."""
        return {}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        for key, value in state.items():
            setattr(self, key, value)
