"""DSGT: distributed stochastic gradient tracking, and its SAM variant DSGT-SAM.

Source: Pu & Nedić, "Distributed stochastic gradient tracking methods", Mathematical Programming 187, 2021;
arXiv 1805.11454, Algorithm 1 "DSGT".

Each client keeps its model x_i and a tracker y_i of the average gradient; with G(X) the [m, d] stack of the
clients' stochastic gradients, one iteration is (Algorithm 1 in the paper's stacked form)

    X^{k+1} = W (X^k − α Y^k)                               (x-update: gossip the descended models)
    Y^{k+1} = W Y^k + G(X^{k+1}) − G(X^k),    Y^0 = G(X^0)  (y-update: gossip the trackers, add the new gradients)

For a doubly stochastic W the trackers keep Σ_i y_i^k = Σ_i g_i(x_i^k), so y_i follows the average gradient instead
of client i's own: the iterates converge to the minimiser of f = (1/m) Σ_i f_i however different the f_i are,
where D-PSGD (X^{k+1} = W X^k − α G(X^k)) with a constant step stops at a distance of order α ζ (ζ² the gradient
dissimilarity) from it (Pu & Nedić, Theorem 1 vs. Lian et al. 2017). For a row-stochastic W (an explicit choice,
`dfl.graphs`) the sum is no longer kept and the fixed point is the minimiser of Σ_i π_i f_i instead.

As computed here (the same recursion, the gradient of iteration k taken where the iteration starts): with the
mixed tracker Ỹ^k = W Y^{k−1} (Ỹ^0 = 0) and G^{−1} = 0,

    G^k = G(X^k);   Y^k = Ỹ^k + G^k − G^{k−1}            (for k = 0: Y^0 = G^0)
    [X^{k+1}, Ỹ^{k+1}] = W [X^k − α Y^k, Y^k]              (one gossip of both, concatenated: 2 vectors sent)

A round is the usual amount of local work (local_epochs or local_steps), i.e. K such iterations, so it gossips
K times, as D-PSGD does (`dfl.algorithms.dpsgd`); α is the round's learning rate. A client with no step left in
this round (local_epochs with uneven data) keeps its last gradient, G^k_i = G^{k−1}_i, so its tracker only mixes.

Hyperparameters (DSGT: none besides the learning rate; `dsgt-sam` adds SAM):
- rho (dsgt 0, dsgt-sam 0.01): the SAM radius; ρ > 0 tracks the SAM gradient ∇f_i(x + ρ g/‖g‖) (ASAM with
  sam = "asam", radius rho_schedule), i.e. gradient tracking of the SAM objective, well defined because the tracked
  quantity is any per-client direction;
- weight_decay and clip_grad_norm (Config fields) enter G^k itself (g + λx, clipped), so the tracked gradient is
  that of the regularised objective. SGD only: the recursion is written for plain gradient steps (no momentum,
  no Adam).
"""

from __future__ import annotations

import numpy as np
import torch
from typing_extensions import override

from dfl.algorithms.base import Algorithm, Context, RoundStats
from dfl.algorithms.builtin import BUILTINS, TrackingParams
from dfl.algorithms.dpsgd import iterations_per_round
from dfl.training.local import descent_direction


class DSGT(Algorithm[TrackingParams]):
    """DSGT: D-PSGD with a gossiped tracker of the average gradient, exact under heterogeneity.

    Pu & Nedić, "Distributed stochastic gradient tracking methods", Math. Programming 2021, Algorithm 1.

        X^{k+1} = W (X^k − α Y^k);   Y^{k+1} = W Y^k + G(X^{k+1}) − G(X^k),  Y^0 = G(X^0)
    """

    card = BUILTINS["dsgt"].card
    client_state = ("tracker", "last_gradient")

    def __init__(self, ctx: Context[TrackingParams], X: torch.Tensor):
        super().__init__(ctx, X)
        self.tracker = torch.zeros_like(X)  # Ỹ^k = W Y^{k−1} (Ỹ^0 = 0)
        self.last_gradient = torch.zeros_like(X)  # G^{k−1} (G^{−1} = 0, so Y^0 = G^0)
        self.gossip_step = 0  # global gossip-step counter (time-varying topologies advance per step)

    @override
    def round(self, t: int) -> RoundStats:
        ctx, alpha = self.ctx, self.ctx.lr(t)
        rule = ctx.rule(t, momentum=0.0)
        schedule = ctx.trainer.schedule(t)
        loss_sum = torch.zeros(self.X.shape[0], device=self.X.device, dtype=self.X.dtype)
        sent = np.zeros(ctx.gossip.topology.n, dtype=np.int64)
        d = self.X.shape[1]
        for k in range(iterations_per_round(ctx.trainer)):
            G = self.last_gradient.clone()  # clients without a step left keep G^{k−1}
            if k < schedule.steps:
                batch = schedule.batch(k)
                Xb = self.X[batch.rows]
                g, loss = ctx.trainer.sam_gradient(Xb, batch, rule)  # ∇F_i(x_i^k; ξ) (at the SAM point if ρ > 0)
                G[batch.rows] = descent_direction(g, Xb, rule, None)  # + weight decay, clipped
                loss_sum[batch.rows] += loss
            Y = self.tracker + G - self.last_gradient  # Y^k = W Y^{k−1} + G^k − G^{k−1}
            mixed = ctx.gossip.mix(torch.cat([self.X - alpha * Y, Y], dim=1), self.gossip_step, 1)
            self.X, self.tracker = mixed[:, :d], mixed[:, d:]  # X^{k+1} = W(X^k − α Y^k); Ỹ^{k+1} = W Y^k
            self.last_gradient = G
            sent += 2 * ctx.gossip.sends(self.gossip_step, 1)
            self.gossip_step += 1
        self.X, self.tracker = self.X.contiguous(), self.tracker.contiguous()
        steps = schedule.steps_per_client.to(self.X.device).clamp_min(1)
        return RoundStats(train_loss=loss_sum / steps, models_sent=sent)

    @override
    def state(self):
        return {**super().state(), "tracker": self.tracker, "last_gradient": self.last_gradient,
                "gossip_step": torch.tensor(self.gossip_step, device="cpu")}  # a host counter

    @override
    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        state = dict(state)
        self.gossip_step = int(state.pop("gossip_step"))
        super().load_state(state)


class DSGTSAM(DSGT):
    """DSGT-SAM: gradient tracking of SAM gradients ∇f_i(x + ρ g/‖g‖).

    DSGT (Pu & Nedić 2021, Algorithm 1) with G the clients' SAM gradients (Foret et al. 2021).

        X^{k+1} = W (X^k − α Y^k);   Y^{k+1} = W Y^k + G_SAM(X^{k+1}) − G_SAM(X^k)
    """

    card = BUILTINS["dsgt-sam"].card
