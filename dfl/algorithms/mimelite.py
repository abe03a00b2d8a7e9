"""MimeLite with SGD + momentum as base optimizer (Karimireddy et al. 2021; docs/reference/update-rules.md#mimelite).

Server state x, m (m = 0). Down: x, m (2×). Up: y_{i,K}, c_i (2×).
Client i ∈ S_t:
    c_i = ∇f_i(x)                        full-batch gradient at the received x (one pass over the local
                                         data in minibatches of batch_size; with data augmentation the
                                         pass sees augmented samples)
    y ← x;  K steps of  y ← y − η ((1 − β) g_i(y) + β m)      (m frozen: no local optimizer state)
Server:
    x ← x + η_g Σ_S p_i (y_{i,K} − x)
    m ← (1 − β) Σ_S p_i c_i + β m
This is the paper's (1 − β) form of the momentum; FedJAX's `mime_lite` uses the optax trace m ← g + β m
instead (the same up to rescaling). β = 0 is FedAvg. Default β = 0.9.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from dfl.algorithms.base import RoundStats
from dfl.algorithms.builtin import BUILTINS, ServerMomentumParams
from dfl.algorithms.fedavg import FedAvg
from dfl.data.sampler import RoundSchedule


class MimeLite(FedAvg[ServerMomentumParams]):
    """MimeLite: local steps that apply the server's frozen momentum, updated from full-batch gradients.

    Karimireddy et al., "Breaking the centralized barrier for cross-device federated learning", NeurIPS 2021
    (Mime, MimeLite with SGD + momentum).

        c_i = ∇f_i(x);   y ← y − η ((1 − β) g_i(y) + β m)  (K steps);   x ← x + η_g Σ_S p_i (y_K − x)
        m ← (1 − β) Σ_S p_i c_i + β m
    """
    card = BUILTINS["mimelite"].card
    uplink = downlink = 2

    def __init__(self, ctx, X):
        super().__init__(ctx, X)
        self.m = torch.zeros_like(self.x)

    @override
    def round(self, t: int) -> RoundStats:
        part = self.participants(t)
        if part.count == 0:
            return self.skipped()
        ctx, beta = self.ctx, self.hp.server_momentum
        c = self.full_gradients(t, part.rows)  # c_i = ∇f_i(x_t)

        def mime(g, y, rows):  # (1 − β) g + β m
            return (1 - beta) * g + beta * self.m

        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t), transform=mime, rows=part.rows)
        self.m = (1 - beta) * self.aggregate(c, part.weights[part.rows]) + beta * self.m
        self.server_step(self.aggregate(local.Y - self.x, part.weights), t)
        return self.stats(local.loss, part)

    def full_gradients(self, t: int, rows: torch.Tensor) -> torch.Tensor:
        """∇f_i(x_t) for the local rows `rows`: the sample-weighted mean of the minibatch gradients of one epoch."""
        trainer = self.ctx.trainer
        ids = [trainer.client_ids[r] for r in rows.tolist()]
        schedule = RoundSchedule(trainer.data, ids, t, trainer.seed, trainer.batch_size, "epochs", 1)
        G = torch.zeros(len(ids), self.x.numel(), dtype=self.x.dtype, device=self.x.device)
        count = torch.zeros(len(ids), dtype=self.x.dtype, device=self.x.device)
        for k in range(schedule.steps):
            batch = schedule.batch(k)
            g, _ = trainer.gradient(self.X[rows[batch.rows]], batch)  # mean over the batch's real samples
            n = batch.weight.sum(dim=1).to(G.dtype)
            G[batch.rows] += n[:, None] * g
            count[batch.rows] += n
        return G / count.clamp_min(1)[:, None]

    @override
    def state(self):
        return {**super().state(), "m": self.m}
