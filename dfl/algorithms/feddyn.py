"""FedDyn (Acar et al., ICLR 2021; docs/reference/update-rules.md#feddyn), as in Acar's `train_FedDyn`.

State: client h_i (0; = −∇f_i/α at the fixed point), kept by non-participants. The server model x_t
is the broadcast "cloud" model. Down: x_t. Up: θ_i.
Client i ∈ S_t, K steps from θ = x_t on  f_i(θ) + α⟨θ, h_i − x_t⟩ + (α/2)‖θ‖²  (up to a constant), i.e.
    θ ← θ − η (g_i(θ) + α (θ − x_t) + α h_i)       (the FedDyn terms enter before clipping/decay)
    h_i ← h_i + (θ_i − x_t)
Server:
    x_{t+1} = Σ_S p_i θ_i + (1/N) Σ_{all j} h_j       (mean over every client, not only S_t)
Acar's code also scales α per client by mean(n)/n_i; that is not done here (one α for every client).
No server lr (the spec has none). Default α = 0.01.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from dfl.algorithms.base import Context, RoundStats
from dfl.algorithms.builtin import BUILTINS, FedDynParams
from dfl.algorithms.server import ServerAlgorithm


class FedDyn(ServerAlgorithm[FedDynParams]):
    """FedDyn: a dynamic linear-plus-quadratic regulariser per client that aligns local and global optima.

    Acar et al., "Federated learning based on dynamic regularization", ICLR 2021 (as the authors' code).

        θ ← θ − η (g_i(θ) + α (θ − x_t) + α h_i)  (K steps from x_t);   h_i ← h_i + (θ_i − x_t)
        x_{t+1} = Σ_S p_i θ_i + (1/N) Σ_j h_j
    """
    card = BUILTINS["feddyn"].card
    client_state = ("h",)  # h_i per client; x is server state

    def __init__(self, ctx: Context[FedDynParams], X: torch.Tensor):
        super().__init__(ctx, X)
        self.h = torch.zeros_like(self.X)  # h_i (rows = local clients)

    @override
    def round(self, t: int) -> RoundStats:
        part = self.participants(t)
        if part.count == 0:
            return self.skipped()
        ctx, alpha, r = self.ctx, self.hp.feddyn_alpha, part.rows

        def dyn(g, y, rows):  # ∇f_i(θ) + α(θ − x_t) + α h_i
            return g + alpha * (y - self.x + self.h[rows])

        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t), transform=dyn, rows=r)
        self.h[r] += local.Y[r] - self.x
        average = self.x + self.aggregate(local.Y - self.x, part.weights)  # Σ_S p_i θ_i
        self.broadcast(average + ctx.comm.mean_rows(self.h))  # + mean_all h_j
        return self.stats(local.loss, part)

    @override
    def state(self):
        return {**super().state(), "h": self.h}
