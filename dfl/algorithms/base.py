"""What every algorithm gets (`Context`) and gives (`Algorithm.round`).

An algorithm owns the client stack X (`[m_local, d]`, rows = this process's clients) and any
per-client state; `round(t)` performs one communication round and returns its statistics.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from dfl.local import LocalRule


def scheduled_lr(config: Any, t: int) -> float:
    """η_t of `config`'s learning-rate schedule at round t: see `Context.lr`."""
    eta0, warmup = config.lr, config.warmup_rounds
    if t < warmup:
        return eta0 * (t + 1) / warmup
    s = t - warmup
    if config.lr_schedule == "exponential":
        return eta0 * config.lr_decay**s
    if config.lr_schedule == "cosine":
        floor = config.lr_min
        return floor + (eta0 - floor) * (1 + math.cos(math.pi * s / (config.rounds - warmup))) / 2
    if config.lr_schedule == "step":
        return eta0 * config.lr_step_factor ** sum(1 for m in config.lr_milestones if m <= s)
    raise ValueError(f"unknown lr_schedule {config.lr_schedule!r}")


@dataclass
class Context:
    config: Any  # dfl.Config
    hp: dict[str, Any]  # resolved hyperparameters of this algorithm
    trainer: Any  # dfl.local.LocalTrainer
    gossip: Any  # dfl.gossip.Gossip
    comm: Any  # a communicator (dfl.comm)

    def lr(self, t: int) -> float:
        """The learning rate η_t of round t = 0, …, T−1 (T = `config.rounds`, η_0 = `config.lr`).

        Warmup (W = `warmup_rounds`): for t < W, η_t = η_0 (t + 1)/W, a linear ramp up to η_0. From round W
        on, the schedule proper runs on s = t − W over S = T − W rounds (with W = 0: s = t, S = T):
        - exponential (γ = `lr_decay`): η_t = η_0 γ^s;
        - cosine (η_min = `lr_min`): η_t = η_min + (η_0 − η_min)(1 + cos(π s/S))/2, which starts at η_0 and
          would reach η_min at s = S, just after the last round. It depends on T, so a cosine run cannot be
          extended on resume (`dfl.checkpoint.check_config`);
        - step (milestones m_1 < m_2 < … = `lr_milestones`, counted in s; factor = `lr_step_factor`):
          η_t = η_0 · factor^(number of milestones m_i ≤ s).
        With the defaults (exponential, W = 0) this is η_0 γ^t, computed exactly as before the schedules.
        """
        return scheduled_lr(self.config, t)

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
    # The `state()` entries that are per-client: tensors whose rows are this process's clients. A checkpoint
    # gathers them into all m rows (`comm.gather_rows`) and a resume slices out `comm.client_ids` again.
    # Every other entry is replicated server/global state, identical on every process (rank 0's is saved).
    client_state: ClassVar[tuple[str, ...]] = ()

    def __init__(self, ctx: Context, X: torch.Tensor):
        self.ctx = ctx
        self.X = X

    def round(self, t: int) -> RoundStats:
        raise NotImplementedError

    def state(self) -> dict[str, torch.Tensor]:
        """Everything beyond X that the next rounds depend on, for checkpoints: the per-client entries
        named in `client_state` ([m_local, ...] rows) and replicated server state."""
        return {}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Set attributes from `state` (e.g. a checkpoint's, rows already sliced to this process's clients).
        A tensor replacing a tensor attribute must have its shape; it takes the attribute's device and dtype."""
        for key, value in state.items():
            current = getattr(self, key, None)
            if torch.is_tensor(current) and torch.is_tensor(value):
                if value.shape != current.shape:
                    raise ValueError(
                        f"{self.name} state {key!r}: expected shape {tuple(current.shape)}, got {tuple(value.shape)}"
                    )
                value = value.to(device=current.device, dtype=current.dtype)
            setattr(self, key, value)
