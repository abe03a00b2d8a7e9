"""FedCM (Xu et al. 2021) and MoFedSAM (Qu et al. 2022): client momentum from the server (ALGORITHMS.md §4.8–4.9).

Server state: x_t and Δ_t, the normalized global update direction (Δ_0 = 0); both are sent down (2×).
Client step (K steps from x_t):
    v = α g + (1 − α) Δ_t;   y ← y − η v
    g = ∇f_i(y; ξ) (FedCM) or SAMGRAD(f_i, y, ξ, ρ) (MoFedSAM: the ascent uses the plain gradient, not v).
    Clipping and weight decay act on the combined v (as in FL-Simulator).
Server:
    Δ_{t+1} = Σ_S p_i (x_t − y_{i,K})/(η K_i)          (gradient scale; η = this round's lr)
    x_{t+1} = x_t + η_g Σ_S p_i (y_{i,K} − x_t)        (FedAvg scale: η_g = 1 is averaging)
α = 1 gives FedAvg (FedCM) and FedSAM (MoFedSAM). Default α = 0.1 (FL-Simulator).
"""

from __future__ import annotations

import torch

from dfl.algorithms.base import RHO_SCHEDULE_DEFAULTS, Context, RoundStats
from dfl.algorithms.fedavg import FedAvg


class FedCM(FedAvg):
    name = "fedcm"
    hyperparameters = {**FedAvg.hyperparameters, "fedcm_alpha": 0.1}
    downlink = 2  # x_t and Δ_t
    local_optimizers = ("sgd",)  # Δ_t is normalized by η K: SGD steps

    def __init__(self, ctx: Context, X: torch.Tensor):
        super().__init__(ctx, X)
        self.delta = torch.zeros_like(self.x)  # Δ_t

    def round(self, t: int) -> RoundStats:
        part = self.participants(t)
        if part.count == 0:
            return self.skipped()
        ctx, lr, alpha = self.ctx, self.ctx.lr(t), self.hp["fedcm_alpha"]

        def blend(g, y, rows):  # v = α g + (1 − α) Δ_t
            return alpha * g + (1 - alpha) * self.delta

        local = ctx.trainer.train(self.X, t, lr, ctx.rule(t), transform=blend, rows=part.rows)
        self.delta, _ = self.pseudo_gradient(local.Y, local.steps, lr, part)  # Δ_{t+1}
        self.server_step(self.aggregate(local.Y - self.x, part.weights))
        return self.stats(local.loss, part)

    def state(self):
        return {**super().state(), "delta": self.delta}


class MoFedSAM(FedCM):
    name = "mofedsam"
    hyperparameters = {**FedCM.hyperparameters, "rho": 0.1, **RHO_SCHEDULE_DEFAULTS, "sam": "sam", "asam_eta": 0.2}
