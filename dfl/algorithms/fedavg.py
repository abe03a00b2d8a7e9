"""FedAvg, FedSAM/FedASAM and FedAvgSM (docs/reference/update-rules.md#fedavg, #fedsam, #fedavgsm).

Round t (S_t sampled, weights p_i; see `dfl.algorithms.server`):
    y_{i,0} = x_t;  K local steps of SGD (FedAvg) or of SAM/ASAM (FedSAM, same minibatch for the ascent)
    Δ_i = y_{i,K} − x_t
    FedAvg / FedSAM:  x_{t+1} = x_t + η_g Σ_S p_i Δ_i                       (η_g = 1: weighted average)
    FedAvgSM:         d_t = Σ_S p_i (x_t − y_{i,K});  m ← β m + d_t;  x_{t+1} = x_t − η_g m   (Hsu et al. 2019)
Communication: the model down, the model up.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from typing_extensions import override

from dfl.algorithms.base import RoundStats
from dfl.algorithms.builtin import BUILTINS, FedAvgParams, FedSAMParams, ServerMomentumParams
from dfl.algorithms.server import ServerAlgorithm

P = TypeVar("P", bound=FedAvgParams)


class FedAvg(ServerAlgorithm[P]):
    """FedAvg: K local SGD steps on the sampled clients, then their weighted average at the server.

    McMahan et al., "Communication-efficient learning of deep networks from decentralized data", AISTATS 2017.

        Δ_i = y_{i,K} − x_t;   x_{t+1} = x_t + η_g Σ_S p_i Δ_i
    """
    card = BUILTINS["fedavg"].card

    def local(self, t: int, part):
        """K local steps from the global model x_t for the round's participants.

        K local steps from x_t for the participants (the local rule from the hyperparameters; kept Adam state
        of non-participants stays as it is).
        """
        ctx = self.ctx
        return ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t), rows=part.rows, adam=self.optimizer_state)

    @override
    def round(self, t: int) -> RoundStats:
        part = self.participants(t)
        if part.count == 0:
            return self.skipped()
        local = self.local(t, part)
        # Δ_i = y_{i,K} − x_t in place: Y is this round's own copy (no second [m, d] stack)
        self.server_step(self.aggregate_updates(local.Y.sub_(self.x), part, t), t)  # Σ_S p_i Δ_i, or a robust rule
        return self.stats(local.loss, part)

    def server_step(self, delta: torch.Tensor, t: int) -> None:
        """Apply the aggregated update Δ = Σ p_i Δ_i of round t at the server and broadcast the new global model.

        Subclasses with their own server optimizer (FedAvgSM, FedAdam, ...) override this step alone; t is the
        round index, which a step size that depends on the round reads (FedAdam's Flower form).
        """
        self.broadcast(self.x + self.hp.server_lr * delta)  # x_{t+1} = x_t + η_g Σ p_i Δ_i


class FedSAM(FedAvg[FedSAMParams]):
    """FedSAM: SAM local steps on the sampled clients, FedAvg at the server (FedASAM with sam = asam).

    Qu et al., "Generalized federated learning via sharpness aware minimization", ICML 2022; Caldarola, Caputo &
    Ciccone, "Improving generalization in federated learning by seeking flat minima", ECCV 2022 (FedASAM).

        y ← y − η SAMGRAD(f_i, y, ρ)  (K steps from x_t);   x_{t+1} = x_t + η_g Σ_S p_i (y_{i,K} − x_t)
    """

    card = BUILTINS["fedsam"].card


class FedAvgSM(FedAvg[ServerMomentumParams]):
    """FedAvgSM: FedAvg with server heavy-ball momentum on the pseudo-gradient (effective lr η_g/(1 − β)).

    Hsu, Qi & Brown, "Measuring the effects of non-identical data distribution", arXiv 1909.06335, 2019 (FedAvgM).

        d_t = Σ_S p_i (x_t − y_{i,K});   m ← β m + d_t;   x_{t+1} = x_t − η_g m
    """

    card = BUILTINS["fedavgsm"].card

    def __init__(self, ctx, X):
        super().__init__(ctx, X)
        self.m = torch.zeros_like(self.x)

    @override
    def server_step(self, delta: torch.Tensor, t: int) -> None:
        self.m = self.hp.server_momentum * self.m - delta  # m ← β m + d_t,  d_t = −Σ p_i Δ_i
        self.broadcast(self.x - self.hp.server_lr * self.m)

    @override
    def state(self):
        return {**super().state(), "m": self.m}
