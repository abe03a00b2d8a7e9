"""FedAvg with local momentum, with or without server momentum (docs/reference/update-rules.md#fedavglm-and-fedavglm-z).

Client: heavy ball u ← μ u + g_i(y);  y ← y − η u,  K steps from x_t, with u starting from
    FedAvgLM:    the averaged buffer u_t of the previous round (Yu et al. 2019); u_{t+1} = Σ_S p_i u_{i,K}.
                 The buffer travels with the model both ways (2 vectors down, 2 up).
    FedAvgLM-Z:  0 (reset every round; 1 vector each way).
Server:
    LM, LM-Z:    x_{t+1} = x_t + η_g Σ_S p_i (y_{i,K} − x_t)
    SLM, SLM-Z:  d_t = Σ_S p_i (x_t − y_{i,K})/(η K_i);  m ← β m + d_t;  x_{t+1} = x_t − η_g η K̄ m
                 (normalized pseudo-gradient; K̄ = Σ_S p_i K_i, = K when every client takes K steps).
"""

from __future__ import annotations

from typing import TypeVar

import torch
from typing_extensions import override

from dfl.algorithms.base import Context
from dfl.algorithms.builtin import BUILTINS, LocalMomentumParams, LocalServerMomentumParams
from dfl.algorithms.fedavg import FedAvg

P = TypeVar("P", bound=LocalMomentumParams)


class FedAvgLM(FedAvg[P]):
    """FedAvgLM: local heavy-ball SGD whose buffer is averaged at the server and sent back each round.

    Yu, Jin & Yang, "On the linear speedup analysis of communication efficient momentum SGD", ICML 2019.

        u ← μ u + g_i(y);  y ← y − η u  (u from the averaged u_t);   u_{t+1} = Σ_S p_i u_{i,K}
    """
    card = BUILTINS["fedavglm"].card
    reset = False  # -Z variants start every round from u = 0

    def __init__(self, ctx: Context[P], X: torch.Tensor):
        super().__init__(ctx, X)
        if not self.reset:
            self.u = torch.zeros_like(self.x)  # u_t, the averaged local momentum buffer
            self.uplink = self.downlink = 2

    @override
    def local(self, t: int, part):
        ctx = self.ctx
        start = None if self.reset else self.u.expand_as(self.X)
        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t), momentum=start, rows=part.rows)
        if not self.reset and local.momentum is not None:
            self.u = self.aggregate(local.momentum, part.weights)  # u_{t+1} = Σ_S p_i u_{i,K}
        return local

    @override
    def state(self):
        return {**super().state(), **({} if self.reset else {"u": self.u})}


class FedAvgLMZ(FedAvgLM):
    """FedAvgLM-Z: local heavy-ball SGD with the buffer reset to zero every round, FedAvg at the server.

    The local-momentum baseline of Xu & Huang, "Coordinating momenta for cross-silo federated learning", AAAI 2022.

        u ← μ u + g_i(y);  y ← y − η u  (u = 0 at the start of each round);   x_{t+1} = x_t + η_g Σ_S p_i Δ_i
    """
    card = BUILTINS["fedavglm-z"].card
    reset = True


class FedAvgSLM(FedAvgLM[LocalServerMomentumParams]):
    """FedAvgSLM: local momentum (buffer averaged across rounds) and server momentum on the normalized update.

    The double-momentum baseline of Xu & Huang, "Coordinating momenta for cross-silo federated learning", AAAI 2022.

        d_t = Σ_S p_i (x_t − y_{i,K})/(η K_i);   m ← β m + d_t;   x_{t+1} = x_t − η_g η K̄ m
    """
    card = BUILTINS["fedavgslm"].card

    def __init__(self, ctx: Context[LocalServerMomentumParams], X: torch.Tensor):
        super().__init__(ctx, X)
        self.m = torch.zeros_like(self.x)

    @override
    def round(self, t: int):
        part = self.participants(t)
        if part.count == 0:
            return self.skipped()
        lr = self.ctx.lr(t)
        local = self.local(t, part)
        d, K = self.pseudo_gradient(local.Y, local.steps, lr, part)  # d_t, K̄
        self.m = self.hp.server_momentum * self.m + d  # m ← β m + d_t
        self.broadcast(self.x - self.hp.server_lr * lr * K * self.m)  # x_{t+1} = x_t − η_g η K̄ m
        return self.stats(local.loss, part)

    @override
    def state(self):
        return {**super().state(), "m": self.m}


class FedAvgSLMZ(FedAvgSLM):
    """FedAvgSLM-Z: FedAvgSLM with the local buffer reset to zero every round.

    The double-momentum baseline of Xu & Huang, "Coordinating momenta for cross-silo federated learning", AAAI 2022.

        u = 0 each round;   d_t = Σ_S p_i (x_t − y_{i,K})/(η K_i);   m ← β m + d_t;   x_{t+1} = x_t − η_g η K̄ m
    """
    card = BUILTINS["fedavgslm-z"].card
    reset = True
