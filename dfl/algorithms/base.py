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

from dfl.adam import AdamState
from dfl.config import LOCAL_OPTIMIZERS
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


ADAPTIVE = LOCAL_OPTIMIZERS  # `Algorithm.local_optimizers` of algorithms that accept Adam/AdamW too
RHO_START = 0.001  # ρ_0 of the linear ramp (FedGLoSS's official code), capped at the final ρ
# The ρ-schedule hyperparameters of every SAM algorithm (those with a `rho`); FedGLoSS's default is "linear".
RHO_SCHEDULE_DEFAULTS = {"rho_schedule": "constant", "rho_ramp_rounds": 0}


def scheduled_rho(hp: dict[str, Any], t: int, final: float) -> float:
    """ρ_t for a SAM radius whose final value is `final` (hp: an algorithm's resolved hyperparameters):
    see `Context.rho`."""
    ramp = hp.get("rho_ramp_rounds", 0)
    if hp.get("rho_schedule", "constant") == "constant" or ramp <= 1:
        return final
    start = min(RHO_START, final)
    return start + (final - start) * min(t / ramp, 1.0)


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

    def rho(self, t: int, final: float | None = None) -> float:
        """The SAM radius ρ_t of round t (`final` = the radius it schedules, default the algorithm's `rho`).

        - constant (`rho_schedule`, the default of every SAM algorithm but FedGLoSS): ρ_t = ρ;
        - linear (FedGLoSS's default; T_s = `rho_ramp_rounds`): ρ_t = ρ_0 + (ρ − ρ_0)·min(t/T_s, 1), a ramp
          from ρ_0 = min(0.001, ρ) at t = 0 up to ρ at t = T_s, then constant (FedGLoSS, Caldarola et al. 2025,
          whose official code starts at 0.001). T_s ≤ 1 is constant. The ramp does not depend on `rounds`,
          so a run with it can be extended on resume.
        Algorithms without a `rho` get 0.
        """
        return scheduled_rho(self.hp, t, self.hp.get("rho", 0.0) if final is None else final)

    def rule(self, t: int, **overrides: Any) -> LocalRule:
        """The local rule of round t from the config and this algorithm's hyperparameters (ρ = `rho(t)`)."""
        config = self.config
        values = dict(
            rho=self.rho(t),
            sam=self.hp.get("sam", "sam"),
            asam_eta=self.hp.get("asam_eta", 0.2),
            momentum=self.hp.get("momentum", 0.0),
            weight_decay=config.weight_decay,
            clip_grad_norm=config.clip_grad_norm,
            optimizer=config.local_optimizer,
            adam_betas=tuple(config.adam_betas),
            adam_eps=config.adam_eps,
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
    # Local optimizers (`local_optimizer`) the update rule is defined for. Adam/AdamW fit algorithms that use local
    # training only through its result y_K; not those whose rule is written in SGD steps (SCAFFOLD's (x − y)/(Kη),
    # FedCM's blended direction, local momentum buffers, FedDyn/FedGLoSS penalties, MimeLite, DOMO).
    local_optimizers: ClassVar[tuple[str, ...]] = ("sgd",)

    def __init__(self, ctx: Context, X: torch.Tensor):
        self.ctx = ctx
        self.X = X
        # local_optimizer_state = "keep": every client's Adam moments persist across rounds, as per-client state;
        # the algorithm passes them to `trainer.train(..., adam=self.optimizer_state)`. None: fresh every round.
        self.optimizer_state: AdamState | None = None
        config = ctx.config
        if config.local_optimizer != "sgd" and config.local_optimizer_state == "keep":
            self.optimizer_state = AdamState.zeros(X)
            self.client_state = (*type(self).client_state, *AdamState.KEYS)

    def round(self, t: int) -> RoundStats:
        raise NotImplementedError

    def state(self) -> dict[str, torch.Tensor]:
        """Everything beyond X that the next rounds depend on, for checkpoints: the per-client entries
        named in `client_state` ([m_local, ...] rows) and replicated server state."""
        return {} if self.optimizer_state is None else self.optimizer_state.as_dict()

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Set attributes from `state` (e.g. a checkpoint's, rows already sliced to this process's clients).
        A tensor replacing a tensor attribute must have its shape; it takes the attribute's device and dtype."""
        for key, value in state.items():
            adam = key in AdamState.KEYS and self.optimizer_state is not None  # "adam_step" -> optimizer_state.step
            owner, name = (self.optimizer_state, key.removeprefix("adam_")) if adam else (self, key)
            current = getattr(owner, name, None)
            if torch.is_tensor(current) and torch.is_tensor(value):
                if value.shape != current.shape:
                    raise ValueError(
                        f"{self.name} state {key!r}: expected shape {tuple(current.shape)}, got {tuple(value.shape)}"
                    )
                value = value.to(device=current.device, dtype=current.dtype)
            setattr(owner, name, value)
