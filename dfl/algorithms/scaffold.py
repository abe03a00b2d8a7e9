"""SCAFFOLD, option II (Karimireddy et al. 2020, Algorithm 1; docs/reference/update-rules.md#scaffold).

State: server x, c (c = 0); client c_i (0), kept by non-participants. Down: x, c. Up: Δy_i, Δc_i (2× each way).
Client i ∈ S_t:
    y ← x;  K steps of  y ← y − η (g_i(y) − c_i + c)        (the correction enters before clipping/decay)
    c_i⁺ = c_i − c + (x − y_K)/(K_i η)                       (option II; K_i, η: this round's steps and lr)
    Δy_i = y_K − x,  Δc_i = c_i⁺ − c_i,  c_i ← c_i⁺
Server:
    x ← x + η_g Σ_S p_i Δy_i
    c ← c + Σ_S q_i Δc_i        (q_i = 1/N: the paper's (|S|/N)·mean_S Δc_i; with aggregation = "size",
                                 q_i = n_i/n, so c stays the n-weighted mean of the c_i as in Acar's code)
The invariant c = Σ_all q_i c_i holds after every round.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from dfl.algorithms.base import Context, RoundStats
from dfl.algorithms.builtin import BUILTINS, FedAvgParams
from dfl.algorithms.fedavg import FedAvg


class Scaffold(FedAvg[FedAvgParams]):
    """SCAFFOLD (option II): local steps corrected by control variates, c − c_i, against client drift.

    Karimireddy et al., "SCAFFOLD: Stochastic controlled averaging for federated learning", ICML 2020,
    Algorithm 1 (option II).

        y ← y − η (g_i(y) − c_i + c);   c_i⁺ = c_i − c + (x − y_K)/(K_i η)
        x ← x + η_g Σ_S p_i (y_K − x);   c ← c + Σ_S q_i (c_i⁺ − c_i)
    """
    card = BUILTINS["scaffold"].card
    uplink = downlink = 2
    client_state = ("ci",)  # c_i per client; x and c are server state

    def __init__(self, ctx: Context[FedAvgParams], X: torch.Tensor):
        super().__init__(ctx, X)
        self.c = torch.zeros_like(self.x)  # server control variate
        self.ci = torch.zeros_like(self.X)  # client control variates (rows = local clients)

    @override
    def round(self, t: int) -> RoundStats:
        part = self.participants(t)
        if part.count == 0:
            return self.skipped()
        ctx, lr, r = self.ctx, self.ctx.lr(t), part.rows

        def correct(g, y, rows):  # g_i(y) − c_i + c
            return g - self.ci[rows] + self.c

        local = ctx.trainer.train(self.X, t, lr, ctx.rule(t), transform=correct, rows=r)
        K = local.steps[r].to(self.x.dtype).clamp_min(1)[:, None]
        ci_new = self.ci[r] - self.c + (self.x - local.Y[r]) / (K * lr)  # option II
        self.c = self.c + self.aggregate(ci_new - self.ci[r], self.share[r])  # c += Σ_S q_i Δc_i
        self.ci[r] = ci_new
        self.server_step(self.aggregate(local.Y - self.x, part.weights), t)  # x += η_g Σ_S p_i Δy_i
        return self.stats(local.loss, part)

    @override
    def state(self):
        return {**super().state(), "c": self.c, "ci": self.ci}
