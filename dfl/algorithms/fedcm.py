"""FedCM (Xu et al. 2021) and MoFedSAM (Qu et al. 2022): client momentum (docs/reference/update-rules.md#fedcm).

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

from typing import TypeVar

import torch
from typing_extensions import override

from dfl.algorithms.base import Context, RoundStats
from dfl.algorithms.builtin import BUILTINS, FedCMParams, MoFedSAMParams
from dfl.algorithms.fedavg import FedAvg

P = TypeVar("P", bound=FedCMParams)


class FedCM(FedAvg[P]):
    """FedCM: local steps that blend each gradient with the server's last global update direction.

    Xu, Wang, Wang & Yao, "FedCM: Federated learning with client-level momentum", arXiv 2106.10874, 2021.

        v = α g + (1 − α) Δ_t;   y ← y − η v  (K steps from x_t)
        Δ_{t+1} = Σ_S p_i (x_t − y_{i,K})/(η K_i);   x_{t+1} = x_t + η_g Σ_S p_i (y_{i,K} − x_t)
    """
    card = BUILTINS["fedcm"].card
    downlink = 2  # x_t and Δ_t

    def __init__(self, ctx: Context[P], X: torch.Tensor):
        super().__init__(ctx, X)
        self.delta = torch.zeros_like(self.x)  # Δ_t

    @override
    def round(self, t: int) -> RoundStats:
        part = self.participants(t)
        if part.count == 0:
            return self.skipped()
        ctx, lr, alpha = self.ctx, self.ctx.lr(t), self.hp.fedcm_alpha

        def blend(g, y, rows):  # v = α g + (1 − α) Δ_t
            return alpha * g + (1 - alpha) * self.delta

        local = ctx.trainer.train(self.X, t, lr, ctx.rule(t), transform=blend, rows=part.rows)
        self.delta, _ = self.pseudo_gradient(local.Y, local.steps, lr, part)  # Δ_{t+1}
        self.server_step(self.aggregate(local.Y - self.x, part.weights), t)
        return self.stats(local.loss, part)

    @override
    def state(self):
        return {**super().state(), "delta": self.delta}


class MoFedSAM(FedCM[MoFedSAMParams]):
    """MoFedSAM: FedCM whose local gradient is a SAM gradient (the ascent from the plain gradient).

    Qu et al., "Generalized federated learning via sharpness aware minimization", ICML 2022 (MoFedSAM).

        v = α SAMGRAD(f_i, y, ρ) + (1 − α) Δ_t;   y ← y − η v;   server as FedCM
    """
    card = BUILTINS["mofedsam"].card
