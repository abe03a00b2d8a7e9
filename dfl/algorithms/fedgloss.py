"""FedGLoSS (Caldarola, Cagnasso, Caputo & Ciccone, CVPR 2025, Alg. 1; docs/reference/update-rules.md#fedgloss).

Server SAM from the previous pseudo-gradient, with a FedDyn/ADMM-style client regulariser.
State: server w, σ (0), Δ̃_prev (0); client σ_k (0), kept by non-participants. Down: w̃ (1×). Up: w_k (1×).
Round t (ρ_t, ρ_{l,t} from the ramp below):
  1. w̃ = w + ρ_t Δ̃_prev/‖Δ̃_prev‖   (joint norm; w̃ = w while Δ̃_prev = 0, i.e. in the first round, or ρ_t = 0)
  2. client k ∈ S_t, from w_k = w̃, per batch:  g = SAMGRAD(f_k, w_k, ξ, ρ_{l,t})   (ρ_l = 0: plain gradient)
         w_k ← w_k − η [g − σ_k + (w_k − w̃)/β]          (the bracket's extra terms enter before clipping/decay)
     then σ_k ← σ_k − (w_k − w̃)/β
  3. server, in this order:
         σ ← σ − (1/(β N)) Σ_{k∈S_t} (w_k − w̃)      (N = all clients; the paper's form — the official code has
                                                       an extra 1/|S_t| here, not followed)
         Δ̃ = Σ_S p_k (w̃ − w_k)                      (pseudo-gradient at the perturbed point)
         w ← w − η_g Δ̃ − β σ                         (descent from the unperturbed w)
         Δ̃_prev ← Δ̃
ρ ramp: FedGLoSS's rho_schedule defaults to "linear" (`Context.rho`, shared with every SAM algorithm): with
T_s = rho_ramp_rounds > 1, ρ_t = ρ_0 + (ρ − ρ_0)·min(t/T_s, 1) for both radii, ρ_0 = min(0.001, ρ), the
intended linear ramp (the official server ramp reuses the client's value, a bug not reproduced).
T_s ≤ 1 or rho_schedule = "constant": constant radii.
ρ = ρ_l = 0 gives FedDyn with α = 1/β (σ_k = −α h_k, β σ = −mean_all h_j).
Defaults (CIFAR-10 CNN): ρ = ρ_l = 0.15, β = 10, η_g = 1; the paper ramps over T_s = 2000 of 10⁴ rounds,
here the default is no ramp (T_s = 0).
"""

from __future__ import annotations

import torch
from typing_extensions import override

from dfl.algorithms.base import Context, RoundStats
from dfl.algorithms.builtin import BUILTINS, FedGLoSSParams
from dfl.algorithms.server import ServerAlgorithm


class FedGLoSS(ServerAlgorithm[FedGLoSSParams]):
    """FedGLoSS: server SAM from the previous pseudo-gradient, with FedDyn/ADMM-style client regularisation.

    Caldarola, Cagnasso, Caputo & Ciccone, "Beyond local sharpness: communication-efficient global sharpness-aware
    minimization for federated learning", CVPR 2025, Algorithm 1.

        w̃ = w + ρ Δ̃_prev/‖Δ̃_prev‖;   w_k ← w_k − η [SAMGRAD(f_k, w_k, ρ_l) − σ_k + (w_k − w̃)/β]
        σ ← σ − (1/(βN)) Σ_S (w_k − w̃);   Δ̃ = Σ_S p_k (w̃ − w_k);   w ← w − η_g Δ̃ − β σ
    """
    card = BUILTINS["fedgloss"].card
    client_state = ("sigma_k",)  # per-client σ_k; σ and Δ̃_prev are server state

    def __init__(self, ctx: Context[FedGLoSSParams], X: torch.Tensor):
        super().__init__(ctx, X)
        self.sigma = torch.zeros_like(self.x)  # server σ
        self.delta_prev = torch.zeros_like(self.x)  # Δ̃_prev
        self.sigma_k = torch.zeros_like(self.X)  # client σ_k (rows = local clients)

    @override
    def round(self, t: int) -> RoundStats:
        part = self.participants(t)
        if part.count == 0:
            return self.skipped()
        ctx, beta, r = self.ctx, self.hp.fedgloss_beta, part.rows
        # 1. server ascent along the previous pseudo-gradient: one vector, the paper's step without an ε in the
        # norm, so it is not the clients' per-row SAM point (dfl.training.local.sam_point)
        norm = float(self.delta_prev.norm())
        rho = ctx.rho(t, self.hp.server_rho)
        w_tilde = self.x + rho * self.delta_prev / norm if norm > 0 and rho > 0 else self.x
        start = w_tilde.expand_as(self.X).clone()

        # 2. clients: local SAM on the regularised objective
        def regularise(g, y, rows):  # g − σ_k + (w_k − w̃)/β
            return g - self.sigma_k[rows] + (y - w_tilde) / beta

        local = ctx.trainer.train(start, t, ctx.lr(t), ctx.rule(t), transform=regularise, rows=r)  # ρ_l = ctx.rho(t)
        self.sigma_k[r] -= (local.Y[r] - w_tilde) / beta

        # 3. server
        moved = self.aggregate(local.Y[r] - w_tilde, torch.ones_like(r, dtype=self.x.dtype))  # Σ_S (w_k − w̃)
        self.sigma = self.sigma - moved / (beta * ctx.comm.num_clients)
        delta = self.aggregate(w_tilde - local.Y, part.weights)  # Δ̃ = Σ_S p_k (w̃ − w_k)
        self.broadcast(self.x - self.hp.server_lr * delta - beta * self.sigma)
        self.delta_prev = delta
        return self.stats(local.loss, part)

    @override
    def state(self):
        return {**super().state(), "sigma": self.sigma, "delta_prev": self.delta_prev, "sigma_k": self.sigma_k}
