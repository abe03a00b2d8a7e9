"""FedProx (Li et al., MLSys 2020; docs/reference/update-rules.md#fedprox).

Round t (S_t sampled, weights p_i; see `dfl.algorithms.server`):
    client i ∈ S_t, from y = x_t, K local steps on h_i(y) = f_i(y) + μ/2 ‖y − x_t‖²   (Algorithm 2, the local
        objective), i.e. on the direction g_i(y) + μ (y − x_t)
    x_{t+1} = x_t + η_g Σ_S p_i (y_{i,K} − x_t)                                      (the FedAvg server)
The proximal gradient μ (y − x_t) joins the minibatch gradient before clipping, weight decay and momentum (or
Adam), as a term of the loss does in torch (`dfl.training.local.Proximal`); the authors' TensorFlow optimizer
(PerturbedGradientDescent) steps y ← y − η (g + μ (y − x_t)) and has no momentum or weight decay to order it against.
μ = 0 is FedAvg. Communication: the model down, the model up (as FedAvg).
"""

from __future__ import annotations

from typing_extensions import override

from dfl.algorithms.builtin import BUILTINS, FedProxParams
from dfl.algorithms.fedavg import FedAvg
from dfl.training.local import Proximal


class FedProx(FedAvg[FedProxParams]):
    """FedProx: local steps on the loss plus the proximal term μ/2‖y − x_t‖², FedAvg at the server.

    Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, "Federated optimization in heterogeneous networks", MLSys 2020,
    Algorithm 2.

        y ← y − η (g_i(y) + μ (y − x_t))  (K steps from x_t);   x_{t+1} = x_t + η_g Σ_S p_i (y_{i,K} − x_t)
    """

    card = BUILTINS["fedprox"].card

    @override
    def local(self, t: int, part):
        """K local steps on h_i(y) = f_i(y) + μ/2 ‖y − x_t‖² from x_t for the round's participants."""
        ctx = self.ctx
        # the anchor is each row's start, X (x_t broadcast; in round 0 the common initial model, of which x is the
        # mean and may differ by a rounding): the term is exactly 0 at the first step, as under Adam's scale-free
        # step a rounding of y − x_t on a coordinate without gradient would be a full step
        return ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t), rows=part.rows, adam=self.optimizer_state,
                                 proximal=Proximal(self.hp.prox_mu, self.X))  # ∇h_i(y) = g_i(y) + μ (y − x_t)
