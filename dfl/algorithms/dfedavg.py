"""DFedAvg and DFedAvgM (Sun, Li & Wang, TPAMI 2023; docs/reference/update-rules.md#dfedavg-and-dfedavgm).

Round t, client i:
    y^0 = y^{−1} = x_i^t
    y^{k+1} = y^k − η g_i(y^k) + θ (y^k − y^{k−1}),  k = 0..K−1      (heavy ball; θ = 0: DFedAvg)
    x_i^{t+1} = Σ_l w_il y_l^K                                       (one gossip step)
The heavy ball equals torch SGD(momentum=θ) with the buffer re-created every round, which is how it
is computed here (the buffer is reset to 0 at the start of each round).
"""

from __future__ import annotations

from typing_extensions import override

from dfl.algorithms.base import Algorithm, RoundStats
from dfl.algorithms.builtin import BUILTINS
from dfl.algorithms.spec import Hyperparameters


class DFedAvg(Algorithm[Hyperparameters]):
    """DFedAvg: K local SGD steps from each client's model, then one gossip step.

    Sun, Li & Wang, "Decentralized federated averaging", TPAMI 2023, Algorithm 1 (θ = 0).

        y^0 = x_i^t;  y^{k+1} = y^k − η g_i(y^k),  k < K;   X^{t+1} = W Y^K

    On a column-stochastic W it mixes by push-sum (`Algorithm.mix`); with one local step it is SGP. It sends only its
    trained Y (and push-sum's public weight), so Byzantine clients, robust gossip and differential privacy apply.
    """

    card = BUILTINS["dfedavg"].card

    @override
    def round(self, t: int) -> RoundStats:
        ctx = self.ctx
        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t), adam=self.optimizer_state)  # y^K
        self.X = self.mix(local.Y, t, 1)  # x^{t+1} = W Y^K (push-sum on a column-stochastic W: `Algorithm.mix`)
        return RoundStats(train_loss=local.loss, models_sent=ctx.gossip.sends(t, 1))


class DFedAvgM(DFedAvg):
    """DFedAvgM: DFedAvg with heavy-ball local SGD, the buffer reset every round.

    Sun, Li & Wang, "Decentralized federated averaging", TPAMI 2023, Algorithm 1.

        y^{k+1} = y^k − η g_i(y^k) + θ (y^k − y^{k−1}),  y^{−1} = y^0 = x_i^t;   X^{t+1} = W Y^K

    Heavy-ball SGD by definition (SGD only: Adam has its own momentum, use dfedavg).
    """

    card = BUILTINS["dfedavgm"].card
