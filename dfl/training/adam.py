"""Local Adam and AdamW, vectorized over clients: torch.optim.Adam / AdamW semantics, row by row.

Per client i (rows of the `[m, d]` stack): first moment m_i, second moment v_i (`[m, d]`), step count k_i (`[m]`).
One step of client i with gradient g (after SAM, the algorithm's transform and clipping; λ = `weight_decay`,
(β1, β2) = `adam_betas`, ε = `adam_eps`, η = the round's learning rate):
    adam only:  g ← g + λ y                                   (L2 added to the gradient, torch.optim.Adam)
    k ← k + 1;   m ← β1 m + (1 − β1) g;   v ← β2 v + (1 − β2) g²
    y ← y − η (m/(1 − β1^k)) / (√v/√(1 − β2^k) + ε)
    adamw only: y ← y − η λ y, from the y before the step     (decoupled decay, torch.optim.AdamW)
Each client's bias correction uses its own k (with local epochs, clients take different numbers of steps).
The state starts at zero every round (`local_optimizer_state = "reset"`) or persists per client across rounds
(`"keep"`, saved in checkpoints as per-client state: `Algorithm.optimizer_state`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AdamState:
    """The clients' Adam/AdamW state, row i for client i: moments m_i, v_i and step count k_i."""

    exp_avg: torch.Tensor  # [m, d] first moments m_i
    exp_avg_sq: torch.Tensor  # [m, d] second moments v_i
    step: torch.Tensor  # [m] int64 steps k_i taken so far

    # names of the tensors in `Algorithm.state()` and checkpoints (per-client entries)
    KEYS = ("adam_exp_avg", "adam_exp_avg_sq", "adam_step")

    @classmethod
    def zeros(cls, X: torch.Tensor) -> AdamState:
        """Fresh state for the rows of X (k = 0: the first step's bias correction makes m, v unbiased)."""
        return cls(torch.zeros_like(X), torch.zeros_like(X), torch.zeros(X.shape[0], dtype=torch.long, device=X.device))

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The state by checkpoint key (`KEYS`)."""
        return dict(zip(self.KEYS, (self.exp_avg, self.exp_avg_sq, self.step)))

    def direction(self, g: torch.Tensor, y: torch.Tensor, rule, rows: slice | torch.Tensor) -> torch.Tensor:
        """One Adam/AdamW step of the clients `rows`: the direction d of y ← y − η d.

        `rows` is a slice (its views are updated in place) or an index tensor (gathered and written back); y are the
        parameters and g their gradient. The clients' moments are updated as a side effect.
        """
        if isinstance(rows, slice):
            return adam_direction(g, y, rule, self.exp_avg[rows], self.exp_avg_sq[rows], self.step[rows])
        m, v, k = self.exp_avg[rows], self.exp_avg_sq[rows], self.step[rows]
        d = adam_direction(g, y, rule, m, v, k)
        self.exp_avg[rows], self.exp_avg_sq[rows], self.step[rows] = m, v, k
        return d


def adam_direction(g, y, rule, m, v, k) -> torch.Tensor:
    """The Adam/AdamW direction d, y_new = y − η d, for the rows of g ([a, d]).

    Updates the moments m, v ([a, d]) and the step counts k ([a]) in place.
    """
    beta1, beta2 = rule.adam_betas
    if rule.optimizer == "adam" and rule.weight_decay > 0:
        g = g + rule.weight_decay * y
    k += 1
    m.lerp_(g, 1 - beta1)  # as torch: m + (1 − β1)(g − m)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    steps = k.to(torch.float64)  # bias corrections in double, as torch computes them (Python floats)
    correction1 = (1 - beta1**steps).to(g.dtype)[:, None]
    correction2 = (1 - beta2**steps).sqrt().to(g.dtype)[:, None]
    denom = v.sqrt().div_(correction2).add_(rule.adam_eps)  # in place: one [a, d] temporary, not three
    d = torch.div(m, denom).div_(correction1)
    if rule.optimizer == "adamw" and rule.weight_decay > 0:
        d.add_(y, alpha=rule.weight_decay)
    return d
