"""DFedSAM and DFedSAM-MGS (Shi et al., ICML 2023, Algorithm 1; docs/reference/update-rules.md#dfedsam-and-dfedsam-mgs).

Round t, client i:
    y^0 = x_i^t
    y^{k+1} = y^k − η SAMGRAD(f_i, y^k, ξ, ρ),  k = 0..K−1        (local SAM, Alg. 1 lines 4–7)
    z^{(0)} = y^K;  z_i^{(q+1)} = Σ_l w_il z_l^{(q)},  q = 0..Q−1    (multiple gossip steps, lines 8–10)
    x_i^{t+1} = z_i^{(Q)},  i.e. X^{t+1} = W^Q Y^K
Q = 1 is DFedSAM; ρ = 0 with Q = 1 (and momentum 0) is DFedAvg. Gossip steps of round t are the global steps
tQ … tQ+Q−1, so time-varying topologies draw a fresh matrix for every step.

Local momentum (default 0.9, as DFedAvgM's): the local step is SAMGRAD fed to heavy-ball SGD, re-started each
round, b ← μ b + g̃; y ← y − η b. Chosen from two sources: Algorithm 1 of the paper (our copy, the
poster) initialises "y^{t,−1}(i) = y^{t,0}(i)", which only matters for a heavy-ball term θ(y^k − y^{k−1}) — the
DFedAvgM update the algorithm is built on (docs/reference/update-rules.md#dfedavg-and-dfedavgm) — and the
DisPFL-derived code of this lineage runs the local SGD with momentum 0.9. The paper prints the plain-SGD form;
`momentum = 0` gives it. With matched momentum, DFedSAM vs DFedAvgM measures SAM, not momentum.
"""

from __future__ import annotations

from typing import TypeVar

from typing_extensions import override

from dfl.algorithms.base import Algorithm, RoundStats
from dfl.algorithms.builtin import BUILTINS, DFedSAMMGSParams, DFedSAMParams

P = TypeVar("P", bound=DFedSAMParams)


class DFedSAM(Algorithm[P]):
    """DFedSAM: K local SAM steps, then one gossip step (DFedSAM-MGS with Q = 1).

    Shi et al., "Improving the model consistency of decentralized federated learning", ICML 2023, Algorithm 1.

        y^{k+1} = y^k − η SAMGRAD(f_i, y^k, ρ) (heavy ball μ, reset every round);   X^{t+1} = W Y^K

    It sends only its trained Y (and push-sum's public weight), through `Algorithm.mix` (push-sum on a
    column-stochastic W).
    """

    card = BUILTINS["dfedsam"].card

    def gossip_steps(self) -> int:
        """Q, the gossip steps after each round's local steps (DFedSAM: 1; DFedSAM-MGS: `gossip_steps`)."""
        return 1

    @override
    def round(self, t: int) -> RoundStats:
        ctx, Q = self.ctx, self.gossip_steps()
        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t), adam=self.optimizer_state)  # Y^K by local SAM
        self.X = self.mix(local.Y, t * Q, Q)  # X^{t+1} = W^Q Y^K (push-sum on a column-stochastic W)
        return RoundStats(train_loss=local.loss, models_sent=ctx.gossip.sends(t * Q, Q))


class DFedSAMMGS(DFedSAM[DFedSAMMGSParams]):
    """DFedSAM-MGS: K local SAM steps, then Q gossip steps (multiple gossip steps).

    Shi et al., "Improving the model consistency of decentralized federated learning", ICML 2023, Algorithm 1.

        y^{k+1} = y^k − η SAMGRAD(f_i, y^k, ρ) (heavy ball μ, reset every round);   X^{t+1} = W^Q Y^K
    """

    card = BUILTINS["dfedsam-mgs"].card

    @override
    def gossip_steps(self) -> int:
        return self.ctx.hp.gossip_steps
