"""FedAdagrad, FedAdam and FedYogi: adaptive server optimizers (Reddi et al., ICLR 2021, Algorithm 2).

The server runs Adagrad, Adam or Yogi on the pseudo-gradient, the clients' mean update
(docs/reference/update-rules.md#fedadam-fedyogi-and-fedadagrad).

Round t (S_t sampled, weights p_i; see `dfl.algorithms.server`):
    y_{i,0} = x_t;  K local steps (the configured local rule)
    Δ_t = Σ_S p_i (y_{i,K} − x_t)                               (the paper's mean over S: aggregation = uniform)
    m_t = β1 m_{t−1} + (1 − β1) Δ_t
    v_t = v_{t−1} + Δ_t²                                        FedAdagrad
    v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)          FedYogi
    v_t = β2 v_{t−1} + (1 − β2) Δ_t²                            FedAdam
    x_{t+1} = x_t + η m_t / (√v_t + τ)                          (elementwise)
Initial state: m_{−1} = 0 and v_{−1} = τ², the lower end of the paper's v_{−1} ≥ τ². No bias correction.
A round nobody joins (Bernoulli participation) is skipped: the moments do not decay.

`fedopt_form` reproduces a library's convention exactly instead (each difference on the update-rules page):
    flower  Flower's FedAdam/FedYogi/FedAdagrad: v_{−1} = 0; FedAdam steps with η √(1 − β2^(r+1)) / (1 − β1^(r+1)),
            r = t + 1 Flower's 1-based round (so the exponent starts at 2), τ added to the uncorrected √v_t.
    torch   (FedAdam) torch.optim.Adam on the gradient −Δ_t, as pfl-research's central optimizer: v_{−1} = 0,
            bias-corrected m̂ = m/(1 − β1^k), v̂ = v/(1 − β2^k), x_{t+1} = x_t + η m̂/(√v̂ + τ), k = server steps taken.
Communication: the model down, the model up (as FedAvg); the moments stay at the server.
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch
from typing_extensions import override

from dfl.algorithms.base import Context
from dfl.algorithms.builtin import BUILTINS, FedAdamParams, FedOptParams
from dfl.algorithms.fedavg import FedAvg
from dfl.training.adam import adam_direction
from dfl.training.local import LocalRule

P = TypeVar("P", bound=FedOptParams)


class FedOpt(FedAvg[P]):
    """The adaptive server rule shared by FedAdagrad, FedAdam and FedYogi (subclasses define `second_moment`)."""

    def __init__(self, ctx: Context[P], X: torch.Tensor):
        super().__init__(ctx, X)
        form, tau = self.hp.fedopt_form, self.hp.server_tau
        self.m = torch.zeros_like(self.x)  # m_{−1} = 0
        self.v = torch.full_like(self.x, tau**2) if form == "paper" else torch.zeros_like(self.x)  # v_{−1}
        if form == "torch":  # torch.optim.Adam's step count k, a [1] tensor as `adam_direction` keeps it per row
            self.server_steps = torch.zeros(1, dtype=torch.int64, device=self.x.device)

    @override
    def server_step(self, delta: torch.Tensor, t: int) -> None:
        """x_{t+1} = x_t + the adaptive step from the pseudo-gradient Δ_t = Σ_S p_i (y_{i,K} − x_t); updates m, v.

        The round itself is FedAvg's (`FedAvg.round`: sampling, local steps, Δ_t or a robust aggregate of it).
        """
        self.broadcast(self.x + self.adaptive_step(delta, t))

    def adaptive_step(self, delta: torch.Tensor, t: int) -> torch.Tensor:
        """The server's step x_{t+1} − x_t from the pseudo-gradient Δ_t, updating the moments."""
        hp = self.hp
        beta1, tau = hp.server_beta1, hp.server_tau
        if hp.fedopt_form == "torch":
            return self.torch_step(delta)
        self.m = beta1 * self.m + (1 - beta1) * delta  # m_t = β1 m_{t−1} + (1 − β1) Δ_t
        self.v = self.second_moment(self.v, delta * delta)  # v_t
        return self.step_size(t) * self.m / (self.v.sqrt() + tau)  # η m_t / (√v_t + τ)

    def second_moment(self, v: torch.Tensor, square: torch.Tensor) -> torch.Tensor:
        """v_t from v_{t−1} and Δ_t² (the one line that tells the three optimizers apart)."""
        raise NotImplementedError

    def step_size(self, t: int) -> float:
        """η of round t (FedAdam's Flower form overrides it)."""
        return self.hp.server_lr

    def torch_step(self, delta: torch.Tensor) -> torch.Tensor:
        """The server's step by torch.optim.Adam (fedopt_form = torch: FedAdam only, which overrides it)."""
        raise NotImplementedError("fedopt_form = torch applies to fedadam only")

    @override
    def state(self) -> dict[str, torch.Tensor]:
        steps = {"server_steps": self.server_steps} if self.hp.fedopt_form == "torch" else {}
        return {**super().state(), "m": self.m, "v": self.v, **steps}


class FedAdagrad(FedOpt[FedOptParams]):
    """FedAdagrad: Adagrad at the server on the clients' mean update (the pseudo-gradient).

    Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan, "Adaptive federated optimization", ICLR 2021,
    Algorithm 2.

        Δ_t = Σ_S p_i (y_{i,K} − x_t);   m_t = β1 m_{t−1} + (1 − β1) Δ_t;   v_t = v_{t−1} + Δ_t²;
        x_{t+1} = x_t + η m_t / (√v_t + τ)   (v_{−1} = τ²)
    """

    card = BUILTINS["fedadagrad"].card

    @override
    def second_moment(self, v: torch.Tensor, square: torch.Tensor) -> torch.Tensor:
        return v + square  # v_t = v_{t−1} + Δ_t²


class FedAdam(FedOpt[FedAdamParams]):
    """FedAdam: Adam at the server on the clients' mean update, without bias correction (the paper's form).

    Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan, "Adaptive federated optimization", ICLR 2021,
    Algorithm 2.

        m_t = β1 m_{t−1} + (1 − β1) Δ_t;   v_t = β2 v_{t−1} + (1 − β2) Δ_t²;   x_{t+1} = x_t + η m_t / (√v_t + τ)
    """

    card = BUILTINS["fedadam"].card

    @override
    def second_moment(self, v: torch.Tensor, square: torch.Tensor) -> torch.Tensor:
        beta2 = self.hp.server_beta2
        return beta2 * v + (1 - beta2) * square  # v_t = β2 v_{t−1} + (1 − β2) Δ_t²

    @override
    def step_size(self, t: int) -> float:
        hp = self.hp
        if hp.fedopt_form != "flower":
            return hp.server_lr
        power = t + 2  # Flower's server_round + 1, its rounds counted from 1
        return hp.server_lr * math.sqrt(1 - hp.server_beta2 ** power) / (1 - hp.server_beta1 ** power)

    @override
    def torch_step(self, delta: torch.Tensor) -> torch.Tensor:
        # torch's Adam on −Δ_t: its direction is odd in the gradient, so feed Δ_t
        hp = self.hp
        rule = LocalRule(optimizer="adam", adam_betas=(hp.server_beta1, hp.server_beta2), adam_eps=hp.server_tau)
        return hp.server_lr * adam_direction(delta[None], self.x[None], rule, self.m[None], self.v[None],
                                             self.server_steps)[0]


class FedYogi(FedOpt[FedAdamParams]):
    """FedYogi: Yogi at the server on the clients' mean update (v moves additively toward Δ²).

    Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan, "Adaptive federated optimization", ICLR 2021,
    Algorithm 2 (Yogi: Zaheer et al., NeurIPS 2018).

        m_t = β1 m_{t−1} + (1 − β1) Δ_t;   v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²);
        x_{t+1} = x_t + η m_t / (√v_t + τ)
    """

    card = BUILTINS["fedyogi"].card

    @override
    def second_moment(self, v: torch.Tensor, square: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.hp.server_beta2) * square * torch.sign(v - square)  # Yogi's additive step
