"""DFedSAM with per-client update clipping and error feedback ("dfedsam-clip"), written against dfl's public
algorithm interface (`dfl.algorithms.base`) only.

Round t, client i (η_t the round's learning rate, K local steps, Q gossip steps, C = clip):
    y^0 = x_i^t;  y^{k+1} = y^k − η_t SAMGRAD(f_i, y^k, ξ, ρ),  k = 0..K−1     (1) local SAM, as in DFedSAM
    v_i = (y^K − x_i^t) + e_i                                                  (2) the round's update (+ residual)
    Δ_i = v_i · min(1, C/‖v_i‖)                                                (3) per-client norm clipping
    e_i ← v_i − Δ_i  with error_feedback, else 0                               (4) what clipping cut, sent later
    X^{t+1} = W^Q (X^t + Δ)                                                    (5) Q gossip steps (Alg. 1 l. 8–10)
Clipping the round's update bounds how far one client (noisy data, a large local step) can move its neighbours
in a round; error feedback (as for compressed updates: EF-SGD, Karimireddy et al. 2019, with clipping as the
compressor) keeps the cut part in e_i and adds it to the next update, so nothing is lost over time.
C = 0 turns clipping off: Δ_i = y^K − x_i^t and the round is DFedSAM-MGS's (DFedSAM for Q = 1).

Options (`algorithm_options`): clip = C (default 1.0; 0 = off), error_feedback (default false). The Config fields
rho, sam, asam_eta, momentum and gossip_steps apply as for DFedSAM (ρ = 0.01, momentum 0.9, Q = 1 by default).
"""

from __future__ import annotations

import torch

from dfl.algorithms import Algorithm, RoundStats


class ClipSAM(Algorithm):
    """DFedSAM with per-client clipping of each round's update, optionally with error feedback."""

    hyperparameters = {"rho": 0.01, "sam": "sam", "asam_eta": 0.2, "momentum": 0.9, "gossip_steps": 1,
                       "clip": 1.0, "error_feedback": False}
    client_state = ("residual",)  # e_i, one row per client: checkpoints gather it, resumes slice it

    @classmethod
    def check_hyperparameters(cls, hp):
        if hp["clip"] < 0:
            raise ValueError(f"algorithm_options.clip must be >= 0 (0 = no clipping), got {hp['clip']}")

    def __init__(self, ctx, X):
        super().__init__(ctx, X)
        self.residual = torch.zeros_like(X)  # e_i = 0

    def round(self, t: int) -> RoundStats:
        ctx, hp = self.ctx, self.ctx.hp
        Q, C = hp["gossip_steps"], hp["clip"]
        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t))  # (1) y^K by local SAM
        v = local.Y - self.X + self.residual  # (2)
        delta = v * (C / v.norm(dim=1, keepdim=True).clamp_min(1e-12)).clamp(max=1.0) if C > 0 else v  # (3)
        self.residual = v - delta if hp["error_feedback"] else torch.zeros_like(v)  # (4)
        self.X = ctx.gossip.mix(self.X + delta, t * Q, Q)  # (5) X^{t+1} = W^Q (X^t + Δ)
        return RoundStats(train_loss=local.loss, models_sent=ctx.gossip.sends(t * Q, Q))

    def state(self):
        return {"residual": self.residual}
