"""DisPFL (Dai, Shen, He, Tian & Tao, ICML 2022; docs/reference/update-rules.md#dispfl).

Every client keeps a personalized 0/1 mask m_i over the flat parameters and a model supported on it. Round t of
client i, in dfl's order (local training, then gossip; docs/reference/update-rules.md#conventions) with the steps
numbered as below and each step's source in the authors' code (rong-dai/DisPFL @e2f47d4, `fedml_api/standalone/
DisPFL/`):

    (1) y^0 = x_i^t;  y^{k+1} = (y^k − η_t d_i(y^k)) ⊙ m_i,  k < K             sparse local training
        (d: the SGD direction, weight decay and clipping on the dense gradient;  my_model_trainer.train)
    (2) α_t = (a/2)(1 + cos(π t / T))                                        cosine annealing  (client.fire_mask)
    (3) for every tensor l with n_l active of N_l (0 < n_l < N_l):
          prune: the ⌈α_t n_l⌉ active weights of smallest |y^K|                 (client.fire_mask)
          regrow: as many inactive coordinates, at random or of largest          (client.regrow_mask)
                  |∇f_i(y^K; ξ)| on one minibatch                               → m_i'
    (4) c_i = Σ_j w_ij m_j,   x_i^{t+1} = [Σ_j w_ij m_j ⊙ y_j^K / c_i] ⊙ m_i'   masked average; 0 where c_i = 0
        (over i and its neighbours, each y_j on the mask it trained with;     dispfl_api._aggregate_func)

With the random-pull topology w_ij = 1/(k + 1) on i and the k peers it draws, so (4) divides each coordinate's sum by
the number of neighbours whose masks cover it, as the code does; any row-stochastic W gives the weighted form. The
code gossips first and trains second: its round t + 1 begins with (4) of round t, the same trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from typing_extensions import override

from dfl.algorithms.base import Algorithm, Context, RoundStats
from dfl.algorithms.builtin import BUILTINS, DisPFLParams

MASK_STREAM = 0xD15F  # separates the masks' draws from every other stream drawn from the run's seed
INIT, REGROW, SHARED_INIT = 0, 1, 2  # the draws: each client's initial mask, its random regrowth, one shared mask
SORT_BYTES = 64 * 2**20  # keys and int64 indices of one sort call: rows are sorted this many bytes at a time


# ---------------------------------------------------------------------------------------- the masks' layout
def active_counts(shapes: Sequence[Sequence[int]], density: float, allocation: str = "erk",
                  power: float = 1.0) -> list[int]:
    """The active weights of each parameter tensor at the target `density` (the code's per-layer allocation).

    `uniform` gives every tensor the density (biases too); `erk` (Erdős–Rényi-kernel, Evci et al. 2020) gives tensor l
    the density ε·p_l with p_l = (Σ dims / Π dims)^power, ε chosen so the total is density·Σ N_l, and makes dense
    (density 1) the tensors of largest p_l while ε·p_l > 1, then solves again for the others
    (my_model_trainer.calculate_sparsities). A tensor keeps int(ε p_l N_l) weights, truncated as the code's
    init_masks does. `density` = 1 makes every tensor dense (the code's ERK loop cannot reach it: it would end
    dividing by zero).
    """
    sizes = [int(np.prod(shape)) for shape in shapes]
    if density >= 1:
        return sizes
    if allocation == "uniform":
        return [min(n, int((1 - (1 - density)) * n)) for n in sizes]  # the code's int((1 - sparsity) · N)
    dense: set[int] = set()
    while True:
        rhs, divisor, raw = 0.0, 0.0, {}
        for layer, (shape, n) in enumerate(zip(shapes, sizes)):
            if layer in dense:
                rhs -= n * (1 - density)  # a dense tensor's zeros are owed by the sparse ones
            else:
                rhs += n * density
                raw[layer] = (float(np.sum(shape)) / n) ** power if n else 0.0
                divisor += raw[layer] * n
        if not raw or divisor <= 0:
            return [sizes[layer] if layer in dense else 0 for layer in range(len(sizes))]
        epsilon = rhs / divisor
        highest = max(raw.values())
        if highest * epsilon <= 1:
            break
        dense.update(layer for layer, p in raw.items() if p == highest)
    return [n if layer in dense else max(0, min(n, int((1 - (1 - epsilon * raw[layer])) * n)))
            for layer, n in enumerate(sizes)]


@dataclass(frozen=True)
class Block:
    """One parameter tensor's slice of the flat row, `offset` … `offset + size`, and its active weights per client."""

    offset: int
    size: int
    active: int

    @property
    def sparse(self) -> bool:
        """Whether its mask can change: some of its weights active and some not (a dense tensor stays dense)."""
        return 0 < self.active < self.size


def anneal_rate(anneal_factor: float, t: int, rounds: int) -> float:
    """(2) α_t = (a/2)(1 + cos(π t / T)): a at round 0, down to 0 at t = T, then 0 (client.fire_mask's drop_ratio)."""
    return anneal_factor / 2 * (1 + math.cos(math.pi * t / rounds)) if t < rounds else 0.0


def mask_seed(seed: int, stream: int, client: int = 0, t: int = 0) -> int:
    """The seed of one draw of the masks: a function of (seed, what is drawn, client id, round) only."""
    return int(np.random.SeedSequence([seed, MASK_STREAM, stream, client, t]).generate_state(1, np.uint64)[0])


def uniform_keys(seeds: Sequence[int], d: int, device: torch.device) -> torch.Tensor:
    """[len(seeds), d] uniforms in [0, 1), row r from a generator seeded with `seeds[r]` (one client's own draw)."""
    out = torch.empty(len(seeds), d, device=device)
    generator = torch.Generator(device=device)
    for row, seed in enumerate(seeds):
        generator.manual_seed(seed)
        torch.rand(d, generator=generator, device=device, out=out[row])
    return out


def _row_chunks(rows: int, size: int):
    step = max(1, SORT_BYTES // max(1, 16 * size))
    for start in range(0, rows, step):
        yield slice(start, min(start + step, rows))


def _first(keys: torch.Tensor, k: int, descending: bool) -> torch.Tensor:
    """The column indices of each row's k smallest keys (largest: `descending`); ties: the lower index first.

    The set a stable sort's first k would give. A float32 key and its column are packed into one int64, the key's
    bits made monotone in its value (negatives flipped) above the column (its complement when descending), so every
    packed key is distinct and a top-k of them is that set on any device: 3-4x faster than the stable sort on the CPU
    (16 x 12,800 keys). Other dtypes take the stable sort.
    """
    if keys.dtype != torch.float32:
        return torch.sort(keys, dim=1, descending=descending, stable=True).indices[:, :k]
    bits = (keys + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes 0.0, equal keys as the sort has them
    monotone = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(torch.int64)  # a < b as floats iff as integers (no NaN)
    column = torch.arange(keys.shape[1], dtype=torch.int64, device=keys.device)
    packed = (monotone << 32) | ((0xFFFFFFFF - column) if descending else column)
    return torch.topk(packed, k, dim=1, largest=descending, sorted=False).indices


def choose(keys: torch.Tensor, blocks: Sequence[Block]) -> torch.Tensor:
    """[a, d] bool masks with each tensor's `active` coordinates of largest key set (random keys: uniform subsets)."""
    mask = torch.zeros(keys.shape, dtype=torch.bool, device=keys.device)
    for block in blocks:
        part = mask[:, block.offset:block.offset + block.size]
        if block.active == block.size:
            part.fill_(True)
        elif block.active > 0:
            for rows in _row_chunks(keys.shape[0], block.size):
                top = _first(keys[rows, block.offset:block.offset + block.size], block.active, descending=True)
                part[rows].scatter_(1, top, True)
    return mask


def prune_and_regrow(mask: torch.Tensor, weights: torch.Tensor, scores: torch.Tensor, blocks: Sequence[Block],
                     rate: float) -> torch.Tensor:
    """(3) The masks after pruning and regrowing ⌈rate·n_l⌉ weights of every sparse tensor l (a new tensor).

    Args:
        mask: [a, d] bool, the masks the weights were trained with.
        weights: [a, d] the trained weights (0 off the mask).
        scores: [a, d] the regrowth score of every coordinate (random keys, or |gradient|).
        blocks: every tensor's slice and active count (the count each row's mask holds in that slice).
        rate: α_t, the fraction of each tensor's active weights replaced.

    Prune the k = ⌈rate·n_l⌉ active weights of smallest |w| (client.fire_mask), then set the k coordinates of
    largest score among the inactive ones, the just-pruned included (client.regrow_mask): each tensor keeps n_l
    active weights. Ties go to the lower index, where the code's unstable sort leaves them to the device.
    """
    new = mask.clone()
    inf = torch.tensor(math.inf, dtype=weights.dtype, device=weights.device)
    for block in blocks:
        k = math.ceil(rate * block.active)
        if not block.sparse or k == 0:  # a dense tensor regrows exactly what it pruned
            continue
        cols = slice(block.offset, block.offset + block.size)
        for rows in _row_chunks(mask.shape[0], block.size):
            part = new[rows, cols]  # a view: the scatters below write into `new`
            drop = _first(torch.where(part, weights[rows, cols].abs(), inf), k, descending=False)
            part.scatter_(1, drop, False)
            grow = _first(torch.where(part, -inf, scores[rows, cols]), k, descending=True)
            part.scatter_(1, grow, True)
    return new


def masked_average(mixed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(4) [Σ_j w_ij m_j ⊙ y_j / Σ_j w_ij m_j] ⊙ m_i' from `mixed` = W [M ⊙ Y, M] ([a, 2d]) and the new masks m_i'.

    A coordinate no neighbour covers (c_i = 0) is 0, as the code's count 0 → coefficient 0.
    """
    d = mask.shape[1]
    numerator, cover = mixed[:, :d], mixed[:, d:]
    return torch.div(numerator, cover).masked_fill_(~mask | (cover == 0), 0.0)  # the weights are >= 0


# ------------------------------------------------------------------------------------------------- the rule
class DisPFL(Algorithm[DisPFLParams]):
    """DisPFL: sparse personalized models: masked local SGD, prune and regrow, masked averaging.

    Dai, Shen, He, Tian & Tao, "DisPFL: Towards communication-efficient personalized federated learning via
    decentralized sparse training", ICML 2022, as the authors' code runs it (rong-dai/DisPFL; the module docstring).

        y^{k+1} = (y^k − η d(y^k)) ⊙ m_i;   m_i' = regrow(prune(m_i, |y^K|, α_t), score);
        x_i^{t+1} = [Σ_j w_ij m_j ⊙ y_j^K / Σ_j w_ij m_j] ⊙ m_i'

    Run it on `random-pull` with `k` peers (the code's random topology: `k` = 10 for its 100 clients) and evaluate
    the personalized models with `local_test_fraction` > 0 (`personal_acc_mean`). A message is a client's active
    weights, plus its mask (one bit per coordinate of its sparse tensors) when the mask changed since its previous
    message; `bytes_sent` counts exactly that.
    """
    card = BUILTINS["dispfl"].card
    client_state = ("mask", "mask_changed")

    def __init__(self, ctx: Context[DisPFLParams], X: torch.Tensor):
        super().__init__(ctx, X)
        hp, layout = ctx.hp, ctx.trainer.layout
        counts = active_counts([tuple(s) for s in layout.shapes], hp.density, hp.density_allocation, hp.erk_power)
        self.blocks = [Block(o, n, a) for o, n, a in zip(layout.offsets, layout.numels, counts)]
        self.mask = self.initial_masks(X.shape[1], X.device)  # [m_local, d] bool, m_i
        self.X = X * self.mask  # x_i^0 = x^0 ⊙ m_i (dispfl_api.train: w_per_mdls)
        # whether m_i changed since client i's previous message, so that its next message carries it. The initial
        # masks are a function of the run's seed and the client id, which every client knows: none is sent.
        self.mask_changed = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        # one message's bytes: the active weights (a count every mask keeps), and the bitmap of the sparse tensors
        self.value_bytes = sum(b.active for b in self.blocks) * X.element_size()
        self.mask_bytes = math.ceil(sum(b.size for b in self.blocks if b.sparse) / 8)

    def initial_masks(self, d: int, device: torch.device) -> torch.Tensor:
        """Each client's m_i^0: every tensor's active coordinates drawn uniformly (my_model_trainer.init_masks).

        `different`: client i's own draw, seeded by (seed, i); `same`: one draw, seeded by the seed, for everyone.
        """
        seed, ids = self.ctx.config.seed, list(self.ctx.comm.client_ids)
        if self.ctx.hp.initial_masks == "same":
            keys = uniform_keys([mask_seed(seed, SHARED_INIT)], d, device).expand(len(ids), d)
        else:
            keys = uniform_keys([mask_seed(seed, INIT, i) for i in ids], d, device)
        return choose(keys, self.blocks)

    def regrowth_scores(self, Y: torch.Tensor, t: int) -> torch.Tensor:
        """[m_local, d] the score of each coordinate for regrowth: uniform keys, or |∇f_i(y_i^K; ξ)|.

        `random`: client i's draw seeded by (seed, i, t) (the code's torch.multinomial over the inactive
        coordinates: a uniform subset, as the largest uniform keys are). `gradient`: the dense gradient at the trained
        model on the first minibatch of round t's schedule (the code's screen_gradients: the first batch of a fresh
        pass over the client's shuffled data).
        """
        ctx = self.ctx
        if ctx.hp.regrowth == "random":
            seed = ctx.config.seed
            return uniform_keys([mask_seed(seed, REGROW, i, t) for i in ctx.comm.client_ids], Y.shape[1], Y.device)
        batch = ctx.trainer.schedule(t).batch(0)
        rows = batch.rows.to(Y.device)
        scores = torch.zeros_like(Y)
        gradient, _ = ctx.trainer.gradient(Y[rows], batch)
        scores[rows] = gradient.abs_()  # in place: the round's peak stays where the plan puts it (its card)
        return scores

    @override
    def round(self, t: int) -> RoundStats:
        ctx = self.ctx
        # (1) K local steps of SGD, the weights re-masked after every step
        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t), mask=self.mask)
        Y, loss = local.Y, local.loss
        del local  # only Y and the losses are used: the stacks of the round are freed as soon as done with
        # (2)–(3) the new masks m_i' from the trained weights
        rate = anneal_rate(ctx.hp.anneal_factor, t, ctx.hp.anneal_rounds or ctx.config.rounds)
        new_mask = self.mask
        if any(b.sparse and math.ceil(rate * b.active) > 0 for b in self.blocks):
            new_mask = prune_and_regrow(self.mask, Y, self.regrowth_scores(Y, t), self.blocks, rate)
        # each client sends y_j on m_j (and m_j when it changed): one gossip of [M ⊙ Y, M], then (4)
        sends = ctx.gossip.sends(t, 1)
        sent = self.bytes_sent(sends)
        d = Y.shape[1]
        message = torch.empty(Y.shape[0], 2 * d, dtype=Y.dtype, device=Y.device)
        torch.mul(Y, self.mask, out=message[:, :d])
        message[:, d:] = self.mask
        del Y
        mixed = ctx.gossip.mix(message, t, 1)
        del message
        self.X = masked_average(mixed, new_mask)
        self.mask_changed = (new_mask != self.mask).any(dim=1)
        self.mask = new_mask
        return RoundStats(train_loss=loss, models_sent=sends, bytes_sent=sent)

    def bytes_sent(self, sends: np.ndarray) -> int:
        """This round's bytes over every client: Σ_j sends_j (values_j + [m_j changed] · bitmap).

        sends_j: the messages client j sends (its out-degree in W_t); a collective (the sum over processes).
        """
        ctx = self.ctx
        values = int(sends.sum()) * self.value_bytes
        if self.mask_bytes == 0:  # no sparse tensor: no mask ever changes
            return values
        local = torch.as_tensor(sends[np.asarray(ctx.comm.client_ids, dtype=np.int64)], device=self.X.device)
        with_mask = ctx.comm.sum((local * self.mask_changed).sum())
        return values + int(with_mask) * self.mask_bytes

    @override
    def state(self) -> dict[str, torch.Tensor]:
        return {**super().state(), "mask": self.mask, "mask_changed": self.mask_changed}
