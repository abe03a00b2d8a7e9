"""D-PSGD (Lian et al., NeurIPS 2017, Algorithm 1).

One SGD step per communication, with the gradient taken at the pre-mixing iterate:
    X^{k+1} = W_k X^k − γ G(X^k)                      (Alg. 1, lines 4–6, matrix form)
A round is the usual amount of local work (local_epochs or local_steps), i.e. K such iterations, so
it gossips K times. Clients that have finished their epoch(s) still gossip, with zero gradient.
K is the largest step count of all clients of all processes, so every process gossips equally often.
With local_optimizer = adam/adamw, γ G(X^k) becomes each client's Adam/AdamW step at X^k (`dfl.training.adam`, from the
gradient at the pre-mixing iterate), its moments fresh every round of K iterations or kept across rounds
(`local_optimizer_state`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from typing_extensions import override

from dfl.algorithms.base import Algorithm, Context, RoundStats
from dfl.algorithms.builtin import BUILTINS
from dfl.algorithms.spec import Hyperparameters
from dfl.training.adam import AdamState
from dfl.training.local import descent_direction


class DPSGD(Algorithm[Hyperparameters]):
    """D-PSGD: one SGD step per gossip step, the gradient taken at the iterate before mixing.

    Lian et al., "Can decentralized algorithms outperform centralized algorithms?", NeurIPS 2017, Algorithm 1.
    A round is the usual local work (K = local_steps, or local_epochs over the data), i.e. K iterations of

        X^{k+1} = W_k X^k − γ G(X^k)

    Hyperparameters: none besides the learning rate γ (`lr`) and the local optimizer (SGD, Adam or AdamW).
    """
    card = BUILTINS["dpsgd"].card

    def __init__(self, ctx: Context[Hyperparameters], X: torch.Tensor):
        super().__init__(ctx, X)
        self.gossip_step = 0  # global gossip-step counter (time-varying topologies advance per step)

    @override
    def round(self, t: int) -> RoundStats:
        ctx, lr, rule = self.ctx, self.ctx.lr(t), self.ctx.rule(t)
        adam = self.optimizer_state
        if rule.optimizer != "sgd" and adam is None:
            adam = AdamState.zeros(self.X)  # reset: fresh moments every round
        schedule = ctx.trainer.schedule(t)
        loss_sum = torch.zeros(self.X.shape[0], device=self.X.device, dtype=self.X.dtype)
        sent = np.zeros(ctx.gossip.topology.n, dtype=np.int64)
        for k in range(iterations_per_round(ctx.trainer)):
            step = torch.zeros_like(self.X)
            if k < schedule.steps:  # some client of this process still has local steps left
                batch = schedule.batch(k)
                Xb = self.X[batch.rows]
                g, loss = ctx.trainer.gradient(Xb, batch)  # G(X^k), before mixing
                loss_sum[batch.rows] += loss
                step[batch.rows] = descent_direction(g, Xb, rule, None, adam, batch.rows)
            self.X = ctx.gossip.mix(self.X, self.gossip_step, 1) - lr * step  # W X^k − γ G(X^k)
            sent += ctx.gossip.sends(self.gossip_step, 1)
            self.gossip_step += 1
        steps = schedule.steps_per_client.to(self.X.device).clamp_min(1)
        return RoundStats(train_loss=loss_sum / steps, models_sent=sent)

    @override
    def state(self):
        return {**super().state(), "gossip_step": torch.tensor(self.gossip_step, device="cpu")}  # a host counter

    @override
    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        state = dict(state)
        self.gossip_step = int(state.pop("gossip_step"))
        super().load_state(state)


def iterations_per_round(trainer) -> int:
    """Iterations per round: K, or E·max_i ⌈n_i/B⌉ over all N clients (not only this process's)."""
    if trainer.mode == "steps":
        return trainer.amount
    sizes = trainer.data.sizes
    if trainer.batch_size == 0 or len(sizes) == 0:  # full batch: one step per epoch
        return trainer.amount
    return trainer.amount * max(math.ceil(int(n) / trainer.batch_size) for n in sizes.tolist())
