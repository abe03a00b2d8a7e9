"""Per-round minibatch schedules for a block of clients, gathered with one indexing op per step.

Client i's data order in round t comes from its own generator seeded by (seed, i, t), so the batches a
client sees never depend on which process hosts it, on the world size, or on the chunk size.

Each epoch is a fresh permutation of the client's n_i samples cut into ceil(n_i / B) batches; the last
batch of an epoch may be short, which is expressed as per-sample weights (0 = padding). In epoch mode
client i takes E * ceil(n_i / B) steps, so clients with less data finish earlier (they are left out of
later steps, never padded with fake steps). In step mode every client takes exactly K steps, starting a
new permutation whenever an epoch runs out. `batch_size = 0` is full-batch gradient descent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from dfl.data.augment import crop_flip

CROP_PADDING = 4


def client_generator(seed: int, client: int, round_index: int, stream: int = 0) -> torch.Generator:
    """A CPU generator determined only by (seed, client id, round, stream)."""
    state = np.random.SeedSequence([seed, client, round_index, stream]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


@dataclass
class Batch:
    rows: torch.Tensor  # local row ids of the clients that take this step, [a]
    x: torch.Tensor  # [a, B, *input_shape]
    y: torch.Tensor  # [a, B]
    weight: torch.Tensor  # [a, B], 1 for real samples, 0 for padding


class RoundSchedule:
    """The minibatches of one round for the clients of this process."""

    def __init__(
        self,
        data,
        client_ids: list[int],
        round_index: int,
        seed: int,
        batch_size: int,
        mode: str,
        amount: int,
    ):
        self.data = data
        padded, sizes = data.padded_indices()
        local = torch.as_tensor(client_ids, dtype=torch.long)
        sizes = sizes[local]
        self.batch_size = batch_size if batch_size > 0 else int(sizes.max()) if len(sizes) else 1
        B = self.batch_size
        positions, steps, aug = [], [], []
        for cid, n in zip(client_ids, sizes.tolist()):
            per_epoch = math.ceil(n / B)
            k = amount * per_epoch if mode == "epochs" else amount
            gen = client_generator(seed, cid, round_index)
            pos = _epoch_positions(n, B, per_epoch, math.ceil(k / per_epoch), gen, shuffle=batch_size > 0)
            positions.append(pos[: k * B])
            steps.append(k)
            if data.augment == "crop-flip":
                aug.append(_crop_flip_params(k * B, gen))
        self.steps_per_client = torch.tensor(steps, dtype=torch.long)
        self.steps = int(self.steps_per_client.max()) if steps else 0
        width = self.steps * B
        pos = torch.full((len(client_ids), width), -1, dtype=torch.long)
        for r, p in enumerate(positions):
            pos[r, : p.numel()] = p
        device = data.train_x.device
        valid = pos >= 0
        rows_idx = padded[local].gather(1, pos.clamp_min(0))
        self.index = rows_idx.to(device)
        self.weight = valid.to(device=device, dtype=data.train_x.dtype)
        self.aug = None
        if aug:
            params = torch.zeros(len(client_ids), width, 3, dtype=torch.long)
            for r, a in enumerate(aug):
                params[r, : a.shape[0]] = a
            self.aug = params.to(device)

    def batch(self, k: int) -> Batch:
        """Step k's batch for every client that still has steps left."""
        B = self.batch_size
        rows = (self.steps_per_client > k).nonzero().squeeze(1).to(self.index.device)
        idx = self.index[rows, k * B : (k + 1) * B]
        x = self.data.train_x[idx]
        if self.aug is not None:
            x = apply_crop_flip(x, self.aug[rows, k * B : (k + 1) * B])
        return Batch(rows=rows, x=x, y=self.data.train_y[idx], weight=self.weight[rows, k * B : (k + 1) * B])


def _epoch_positions(n: int, B: int, per_epoch: int, epochs: int, gen: torch.Generator, shuffle: bool):
    chunks = []
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen) if shuffle else torch.arange(n)
        padded = torch.full((per_epoch * B,), -1, dtype=torch.long)
        padded[:n] = perm
        chunks.append(padded)
    return torch.cat(chunks)


def _crop_flip_params(count: int, gen: torch.Generator) -> torch.Tensor:
    shifts = torch.randint(0, 2 * CROP_PADDING + 1, (count, 2), generator=gen)
    flips = torch.randint(0, 2, (count, 1), generator=gen)
    return torch.cat([shifts, flips], dim=1)


def apply_crop_flip(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Random crop (zero padding 4) + horizontal flip with explicit per-sample params [..., 3] = (dy, dx, flip)."""
    return crop_flip(x, params[..., :2], params[..., 2].bool(), padding=CROP_PADDING)
