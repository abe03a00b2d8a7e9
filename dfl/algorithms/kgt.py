"""K-GT: gradient tracking with local steps, and its SAM variant K-GT-SAM.

Source: Liu, Lin, Koloskova & Stich, "Decentralized Gradient Tracking with Local Steps", Optimization Methods
and Software, 2024; arXiv 2301.01313, Algorithm 1.

Each client keeps its model x_i and a correction c_i (c_i = 0 at the start, so Σ_i c_i = 0); round t, client i:

    z_i^{(0)} = x_i^t
    z_i^{(k+1)} = z_i^{(k)} − η_c (∇F_i(z_i^{(k)}; ξ_i^k) + c_i^t),   k = 0..K−1       (local steps, corrected)
    Δ_i^t = z_i^{(0)} − z_i^{(K)}                                                   (the round's progress)
    c_i^{t+1} = c_i^t − Δ_i^t/(K η_c) + Σ_j w_ij Δ_j^t/(K η_c)                       (tracking update)
    x_i^{t+1} = Σ_j w_ij (x_j^t − η_s Δ_j^t)                                        (gossip the update)

Δ/(K η_c) is client i's average corrected gradient over the round, so c_i + ∇f_i tracks the network's average
gradient (for a doubly stochastic W, Σ_i c_i stays 0): the local steps follow the global objective instead of
drifting towards each client's own optimum, and K-GT reaches the minimiser of (1/m) Σ_i f_i under arbitrary
heterogeneity, where DFedAvg / DFedSAM (local steps then gossip) keep a heterogeneity bias. With K = 1 and
η_s = 1 it is exactly DSGT (`dfl.algorithms.dsgt`): y_i = g_i + c_i.

Every round sends two vectors per link: x_j − η_s Δ_j and Δ_j/(K η_c), gossiped together. The heavy-ball buffer is not
part of the method (momentum 0); weight decay and clipping act inside each local step, after the correction.

Hyperparameters:
- outer_lr (η_s, default 1.0; an algorithm option): the step on the averaged progress; η_s = 1 gossips the
  local models z^{(K)} themselves, as DFedAvg does;
- rho (kgt 0, kgt-sam 0.01), sam ("sam" | "asam"), asam_eta, rho_schedule: local steps by SAM / ASAM (the
  gradient at the perturbed point, then the correction, as SCAFFOLD-type methods correct FedSAM's steps): K-GT
  with SAM, tracking the SAM gradients' average;
- the local learning rate η_c is the round's lr (`lr`, `lr_schedule`); K the round's steps (local_epochs or
  local_steps; with uneven step counts each client sends Δ_j/(K_j η_c) with its own K_j, which keeps Σ_i c_i).
"""

from __future__ import annotations

import torch
from typing_extensions import override

from dfl.algorithms.base import Algorithm, Context, RoundStats
from dfl.algorithms.builtin import BUILTINS, KGTParams


class KGT(Algorithm[KGTParams]):
    """K-GT: K local steps corrected by a tracked average gradient, then gossip of models and updates.

    Liu, Lin, Koloskova & Stich, "Decentralized gradient tracking with local steps", Optim. Methods Softw. 2024,
    Algorithm 1.

        z ← z − η (∇F_i(z) + c_i)  (K steps from x_i);   Δ = x − z
        c ← c − Δ/(Kη) + W Δ/(Kη);   X ← W (X − η_s Δ)
    """

    card = BUILTINS["kgt"].card
    client_state = ("correction",)

    def __init__(self, ctx: Context[KGTParams], X: torch.Tensor):
        super().__init__(ctx, X)
        self.correction = torch.zeros_like(X)  # c_i^0 = 0

    @override
    def round(self, t: int) -> RoundStats:
        ctx, eta_c, eta_s = self.ctx, self.ctx.lr(t), self.ctx.hp.outer_lr

        def correct(g, y, rows):  # ∇F_i(z; ξ) + c_i
            return g + self.correction[rows]

        local = ctx.trainer.train(self.X, t, eta_c, ctx.rule(t, momentum=0.0), transform=correct)
        delta = self.X - local.Y  # Δ_i = z^{(0)} − z^{(K)}
        K = local.steps.to(self.X.dtype).clamp_min(1)[:, None]
        progress = delta / (K * eta_c)  # Δ_i/(K_i η_c): client i's average corrected gradient
        d = self.X.shape[1]
        mixed = ctx.gossip.mix(torch.cat([self.X - eta_s * delta, progress], dim=1), t, 1)
        self.correction = self.correction - progress + mixed[:, d:]  # c_i ← c_i − Δ_i/(Kη_c) + Σ_j w_ij Δ_j/(Kη_c)
        self.X = mixed[:, :d].contiguous()  # x_i ← Σ_j w_ij (x_j − η_s Δ_j)
        return RoundStats(train_loss=local.loss, models_sent=2 * ctx.gossip.sends(t, 1))

    @override
    def state(self):
        return {**super().state(), "correction": self.correction}


class KGTSAM(KGT):
    """K-GT-SAM: K-GT whose corrected local steps are SAM steps.

    K-GT (Liu et al. 2024, Algorithm 1) with ∇F_i replaced by SAMGRAD(f_i, z, ρ) (Foret et al. 2021).
    """

    card = BUILTINS["kgt-sam"].card
