"""Per-round minibatch schedules for a block of clients, built without a Python loop over clients.

Client i's data order in round t is a function of (seed, i, t) only, so the batches a client sees never depend
on which other clients are in the schedule, their order, the process hosting it, the world size or the chunk
size.

Each epoch is a fresh permutation of the client's n_i samples cut into ceil(n_i / B) batches; the last batch of
an epoch may be short, which is expressed as per-sample weights (0 = padding). In epoch mode client i takes
E * ceil(n_i / B) steps, so clients with less data finish earlier (they are left out of later steps, never
padded with fake steps). In step mode every client takes exactly K steps, starting a new permutation whenever an
epoch runs out. `batch_size = 0` is full-batch gradient descent (no shuffle). The batch width is B = min(batch_size,
max_j n_j) over all N clients of the data (full batch: max_j n_j): a client's minibatch is min(B, n_i) real samples,
and a batch_size larger than every client's data is one pass over each client's n_i samples per step, without
allocating [m, batch_size]. Widths, and with them every client's batches, do not depend on which clients are in
the schedule. With crop-flip augmentation every
sample of every step gets its own (dy, dx, flip), also a function of (seed, i, t) only.

Randomness is counter-based: a 64-bit hash (splitmix64's finalizer, a bijection of uint64 with full
avalanche, chained over the words) of (seed, round, stream, client id, epoch, slot). Client i's permutation
of epoch e sorts its slots 0..n_i-1 by the top 32 bits of hash(seed, t, 0, i, e, slot) (ties, probability
~ n_i^2 / 2^33 per epoch, keep slot order), so every (client, epoch) of the schedule is permuted at once by
one stable argsort of (segment, key) over the concatenated segments. Augmentation parameters of the sample at
flat position q = k * B + b of client i are read from hash(seed, t, 1, i, q). numpy uint64 arithmetic wraps
modulo 2^64 (defined behaviour, no warnings on arrays).

Cost: building a round generates one key per (client, epoch, sample) of the epochs a client touches,
Σ_i E_i n_i (in step mode the last, partly used epoch is still permuted in full), in groups of ~1M keys
(temporaries ~70 MB whatever m is; a client with more keys forms a group of its own). The schedule keeps one
row id (int32 when the pooled train set has < 2^31 rows) per real sample the clients visit (full batch: Σ_i
n_i) and a few [m] vectors; never [m, max n_i] nor [m, steps * B], so a skewed split (a few huge clients)
costs what its samples cost. `batch(k)` reads a block of consecutive steps gathered at once on the data's device
(the row ids of every client at those positions, then x, y and the augmentation; up to BLOCK_BYTES of samples,
at least one step), so a step costs a view or one row gather. What a step needs from the host is built with the
schedule, once per round, and sent to the device in one copy (the row-id offsets, the clients still taking steps
for each distinct step count, crop-flip's parameters of every sample as uint8): a step reads nothing back and
uploads nothing (tests/test_host_syncs.py). The [m, steps * B] grids `index`, `weight` and
`aug` are materialized on first access only (tests, debugging).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import torch

from dfl.data.augment import crop_flip
from dfl.errors import DataError

CROP_PADDING = 4
STREAM_ORDER, STREAM_AUGMENT = 0, 1
_GROUP = 1 << 20  # keys generated per vectorized group: bounds the temporaries, not the schedule
BLOCK_BYTES = 32 * 2**20  # samples `batch` gathers at once (a block of steps, at least one)

_MASK64 = (1 << 64) - 1
_U = np.uint64
_M1, _M2 = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)
_S15, _S16, _S27, _S30, _S31, _S32, _S40 = (_U(s) for s in (15, 16, 27, 30, 31, 32, 40))
# one odd constant per kind of word, so that e.g. client 3 / epoch 5 and client 5 / epoch 3 differ
_SEED, _ROUND, _STREAM, _CLIENT, _EPOCH, _SLOT = (
    _U(c) for c in (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03, 0xABC98388FB8FAC03, 0x8CB92BA72F3D8DD7,
                    0xDB4F0B9175AE2165, 0xF1357AEA2E62A9C5)
)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (Stafford's mix13) on uint64 arrays: a bijection with full avalanche."""
    z = z ^ (z >> _S30)
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def _words(values) -> np.ndarray:
    """Python ints / int arrays as uint64 arrays (two's complement for negatives, like any 64-bit seed)."""
    if isinstance(values, (int, np.integer)):
        return np.array([int(values) & _MASK64], dtype=np.uint64)
    return np.asarray(values, dtype=np.int64).astype(np.uint64)


def absorb(h: np.ndarray, word: np.ndarray, kind: np.uint64) -> np.ndarray:
    """Absorb `word` into the hashes h: h' = mix(h ^ mix(word ^ kind)).

    For fixed h a bijection of word and vice versa (uint64, broadcasting).
    """
    return _mix(h ^ _mix(word ^ kind))


def client_keys(seed: int, client_ids, round_index: int | np.ndarray, stream: int) -> np.ndarray:
    """uint64 [m]: hash(seed, round, stream, client) for each client id, the root of its randomness."""
    h = _mix(_words(seed) ^ _SEED)
    h = absorb(h, _words(round_index), _ROUND)
    h = absorb(h, _words(stream), _STREAM)
    return absorb(h, _words(client_ids), _CLIENT)


def slot_words(count: int) -> np.ndarray:
    """uint64 [count]: mix(q ^ kind) for q = 0..count-1, the per-position word absorbed last."""
    return _mix(np.arange(count, dtype=np.uint64) ^ _SLOT)


def batch_width(all_sizes: np.ndarray, batch_size: int) -> int:
    """The batch width B every client's batches share.

    B = min(batch_size, max_j n_j) over all N clients of the data (full batch, batch_size = 0: max_j n_j), so widths
    and augmentation positions never depend on the subset; a batch wider than n_i is one pass over n_i.
    """
    widest = max(int(all_sizes.max()), 1) if len(all_sizes) else 1
    return min(batch_size, widest) if batch_size > 0 else widest


def local_step_counts(n: np.ndarray, B: int, mode: str, amount: int) -> np.ndarray:
    """K_i per client of n_i samples: amount · ceil(n_i / B) in epoch mode, amount in step mode (int64)."""
    if mode == "epochs":
        return amount * -(-np.asarray(n, dtype=np.int64) // B)
    return np.full(len(n), amount, dtype=np.int64)


class _EpochPlan(NamedTuple):
    """The steps and epochs of a round's clients (arrays over the clients, int64).

    Attributes:
        k: K_i, the steps client i takes (capped by `max_steps`).
        per_epoch: ceil(n_i / B), the batches of one epoch.
        epochs: the epochs client i starts, ceil(K_i / per_epoch).
        last: the samples it uses of its last epoch (0 without steps).
        kept: the samples it reads in all: whole epochs, then the used prefix of the last one (n_i, full batch).
    """

    k: np.ndarray
    per_epoch: np.ndarray
    epochs: np.ndarray
    last: np.ndarray
    kept: np.ndarray

    @classmethod
    def of(cls, n: np.ndarray, B: int, mode: str, amount: int, max_steps: np.ndarray | None,
           shuffle: bool) -> _EpochPlan:
        """The plan of clients of n samples with batches of B.

        `max_steps` caps the steps (stragglers stopped by a deadline take a prefix of their batches).
        """
        per_epoch = -(-n // B)
        k = local_step_counts(n, B, mode, amount)
        if max_steps is not None:
            k = np.minimum(k, np.asarray(max_steps, dtype=np.int64))
        epochs = -(-k // per_epoch)
        L = per_epoch * B
        last = np.minimum(n, k * B - np.maximum(epochs - 1, 0) * L) * (epochs > 0)
        kept = np.maximum(epochs - 1, 0) * n + last if shuffle else n
        return cls(k.astype(np.int64), per_epoch, epochs, last, kept)


@dataclass
class Batch:
    """One step's minibatch of the clients that take it."""

    rows: torch.Tensor  # local row ids of the clients that take this step, [a]
    x: torch.Tensor  # [a, B, *input_shape]
    y: torch.Tensor  # [a, B]
    weight: torch.Tensor  # [a, B], 1 for real samples, 0 for padding

    def slice(self, start: int, stop: int) -> Batch:
        """The clients start..stop-1 of this batch (views, no copy)."""
        return Batch(self.rows[start:stop], self.x[start:stop], self.y[start:stop], self.weight[start:stop])


class RoundSchedule:
    """The minibatches of one round for the clients of this process.

    Client row r (client id client_ids[r]) takes `steps_per_client[r]` steps; at flat position q = k * B + b
    (step k, batch slot b) it reads epoch e = q // L_r, slot s = q % L_r of its epoch layout (L_r =
    ceil(n_r / B) * B; s >= n_r is padding), i.e. entry start_r + e * stride_r + s of the kept row ids.
    `max_steps` (per row) caps the steps: a capped client takes the first steps of its uncapped schedule.
    """

    def __init__(
        self,
        data,
        client_ids: list[int],
        round_index: int | np.ndarray,
        seed: int,
        batch_size: int,
        mode: str,
        amount: int,
        max_steps: np.ndarray | None = None,
    ):
        if mode not in ("epochs", "steps"):
            raise DataError(f"mode must be 'epochs' or 'steps', got {mode!r}")
        self.data = data
        self.round_index, self.seed = round_index, seed
        flat, offsets, all_sizes = data.flat_indices()
        ids = np.asarray(client_ids, dtype=np.int64).reshape(-1)
        self.client_ids = ids
        n = all_sizes.numpy()[ids]
        shuffle = batch_size > 0
        self.batch_size = B = batch_width(all_sizes.numpy(), batch_size)
        plan = _EpochPlan.of(n, B, mode, amount, max_steps, shuffle)
        rows = self._row_ids(flat.numpy(), offsets.numpy()[ids], n, plan, shuffle)
        self.steps_per_client = torch.from_numpy(plan.k)  # host (numpy's memory): read by the host, never synced
        self._k = plan.k
        self.steps = int(plan.k.max()) if len(ids) else 0
        self._upload_tables(n, plan, shuffle)
        self._rows = torch.from_numpy(rows).to(data.train_x.device, non_blocking=True)
        self._aug_keys = client_keys(seed, ids, round_index, STREAM_AUGMENT) if data.augment == "crop-flip" else None
        self._aug_round = None if self._aug_keys is None else self._augmentation_grid(self._aug_keys)
        self._block_cache: tuple | None = None  # the latest `_block`

    def _row_ids(self, flat: np.ndarray, base: np.ndarray, n: np.ndarray, plan: _EpochPlan,
                 shuffle: bool) -> np.ndarray:
        """The train row ids the round's clients read, client after client.

        Per client its kept samples, each epoch shuffled (`_shuffled_rows`) when batches are drawn, else its
        samples in order (full batch).

        Args:
            flat: every client's train row ids, client after client (`FederatedData.flat_indices`).
            base: where each of this round's clients starts in `flat`.
            n: their sample counts.
            plan: their steps and epochs.
            shuffle: whether batches are drawn (batch_size > 0).

        Returns:
            int32 row ids (int64 for a train set of 2^31 samples or more).
        """
        row_dtype = np.int32 if len(flat) and self.data.train_x.shape[0] < 2**31 else np.int64
        if not shuffle:
            return flat[_ragged_arange(base, n)].astype(row_dtype)
        keys = client_keys(self.seed, self.client_ids, self.round_index, STREAM_ORDER)
        parts = [
            _shuffled_rows(flat, base[a:b], keys[a:b], n[a:b], plan.epochs[a:b], plan.last[a:b]).astype(row_dtype)
            for a, b in _groups(plan.epochs * n)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=row_dtype)

    def _upload_tables(self, n: np.ndarray, plan: _EpochPlan, shuffle: bool) -> None:
        """Send the per-client tables a step reads to the data's device, in one copy.

        The per-client tables a step reads (where its rows start, n, batches per epoch, epoch stride, positions
        used), and the sets of clients still stepping, sent to the data's device in one copy.

        The clients still taking steps at step k are those with K_i > k: the set changes only at the distinct
        values of K_i, so each such set's row ids are built here, for the whole round; a step then picks its set on
        the host (`batch`), with no sync.
        """
        k, m = plan.k, len(n)
        levels = np.unique(k[k > 0])
        active = [np.flatnonzero(k >= level) for level in levels]
        self._levels = levels
        parts = [np.cumsum(plan.kept) - plan.kept, n, plan.per_epoch, n if shuffle else np.zeros(m, dtype=np.int64),
                 k * self.batch_size, np.arange(m), *active]
        (self._start, self._n, self._per_epoch, self._stride, self._limit, self._all_rows, *self._active) = \
            _upload(self.data.train_x.device, parts)

    def _augmentation_grid(self, keys: np.ndarray) -> torch.Tensor:
        """The crop-flip parameters of every (client, flat position) of the round.

        uint8 [m, steps * B, 3] (3 bytes a sample) on the data's device: computed on the host once and sent in one
        copy, so a step's block only slices them on the device.
        """
        m, width = len(self.client_ids), self.steps * self.batch_size
        rows_per_group = max(1, _GROUP // max(width, 1))  # bounds the uint64 hash temporaries
        parts = [_augment_params(keys, np.arange(a, min(a + rows_per_group, m)), 0, width).to(torch.uint8)
                 for a in range(0, m, rows_per_group)]
        grid = torch.cat(parts) if parts else torch.zeros((0, width, 3), dtype=torch.uint8, device="cpu")
        return grid.to(self.data.train_x.device, non_blocking=True)

    # ---------------------------------------------------------------- per step
    def batch(self, k: int) -> Batch:
        """Step k's batch for every client that still has steps left.

        The batches come from a block of consecutive steps gathered at once (`_block`: one index grid, one gather of
        x and y, one augmentation call for up to BLOCK_BYTES of samples), so a step costs a view (every client
        active) or one row gather (some finished), not a dozen small index ops.
        """
        block = self._block_cache
        if block is None or not block[0] <= k < block[1]:
            block = self._block_cache = self._block(k)
        k0, _, xs, ys, ws = block
        x, y, w = xs[k - k0], ys[k - k0], ws[k - k0]
        level = int(np.searchsorted(self._levels, k, side="right"))  # the set of K_i >= levels[level] > k
        rows = self._active[level] if level < len(self._active) else self._all_rows[:0]
        if rows.numel() == len(self.client_ids):
            return Batch(rows=self._all_rows, x=x, y=y, weight=w)
        return Batch(rows=rows, x=x[rows], y=y[rows], weight=w[rows])

    def _block(self, k0: int):
        """The batches of a block of consecutive steps, gathered at once.

        (k0, k1, x [S, m, B, ...], y [S, m, B], weight [S, m, B]) of steps k0..k1-1 (S = k1 - k0) of every
        schedule row, step-major so that each step is contiguous; S keeps x under BLOCK_BYTES (at least one
        step). Entries of rows past their steps are any valid sample with weight 0 (`batch` leaves those rows
        out).
        """
        B, m = self.batch_size, len(self.client_ids)
        sample_bytes = self.data.train_x[:1].numel() * self.data.train_x.element_size()
        k1 = min(self.steps, k0 + max(1, BLOCK_BYTES // max(1, m * B * sample_bytes)))
        q = torch.arange(k0 * B, k1 * B, device=self._rows.device)
        idx, valid = self._gather(q)
        x = self.data.train_x[idx]
        if self._aug_round is not None:
            x = apply_crop_flip(x, self._aug_round[:, k0 * B : k1 * B].long())
        S = k1 - k0

        def steps_first(t: torch.Tensor) -> torch.Tensor:  # [m, S * B, ...] -> [S, m, B, ...], contiguous
            return t.reshape(m, S, B, *t.shape[2:]).transpose(0, 1).contiguous()

        return k0, k1, steps_first(x), steps_first(self.data.train_y[idx]), \
            steps_first(valid.to(self.data.train_x.dtype))

    def batch_at(self, steps) -> Batch:
        """Step steps[r] of every schedule row r at once (each below the row's step count).

        Row r's batch is row r of `batch(steps[r])`. The asynchronous mode takes one step per client, each
        client at its own step.
        """
        B = self.batch_size
        steps = np.asarray(steps, dtype=np.int64)
        if steps.shape != (len(self.client_ids),) or (steps < 0).any() or \
                (steps >= self.steps_per_client.numpy()).any():
            raise DataError(f"steps must give every row a step below its step count {self.steps_per_client.tolist()}"
                            f", got {steps.tolist()}")
        k = torch.from_numpy(steps).to(self._rows.device, non_blocking=True)
        epoch = k // self._per_epoch
        j = (k - epoch * self._per_epoch) * B
        count = (self._n - j).clamp_max(B)
        ar = torch.arange(B, device=k.device)
        where = (self._start + epoch * self._stride + j)[:, None] + torch.minimum(ar, count[:, None] - 1)
        idx = self._rows[where].long()
        x = self.data.train_x[idx]
        if self._aug_keys is not None:
            q = (steps[:, None] * B + np.arange(B)).astype(np.uint64)
            x = apply_crop_flip(x, _crop_flip_params(_mix(self._aug_keys[:, None] ^ _mix(q ^ _SLOT))).to(x.device))
        return Batch(rows=torch.arange(len(steps), device=k.device), x=x, y=self.data.train_y[idx],
                     weight=(ar < count[:, None]).to(self.data.train_x.dtype))

    def _gather(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(train row ids long [m, W], valid bool [m, W]) of flat positions q [W] of every schedule row."""
        L = (self._per_epoch * self.batch_size)[:, None]
        epoch = q // L
        slot = q - epoch * L
        n = self._n[:, None]
        valid = (slot < n) & (q < self._limit[:, None])
        where = self._start[:, None] + epoch * self._stride[:, None] + torch.minimum(slot, n - 1)
        if self._rows.numel() == 0:  # only when nobody takes a step
            return torch.zeros_like(where), valid
        return self._rows[where.clamp(0, self._rows.numel() - 1)].long(), valid

    # ---------------------------------------------------------------- whole-round grids (lazy)
    @cached_property
    def index(self) -> torch.Tensor:
        """The train row id of every (client, flat position) of the round: long [m, steps * B].

        Padding (weight 0) repeats the epoch's last real sample, as `batch` does; past the client's steps it is any
        valid row id.
        """
        return self._grid[0]

    @cached_property
    def weight(self) -> torch.Tensor:
        """[m, steps * B] in the data's dtype: 1 for real samples, 0 for padding and past the client's steps."""
        return self._grid[1].to(self.data.train_x.dtype)

    @cached_property
    def aug(self) -> torch.Tensor | None:
        """The crop-flip parameters, long [m, steps * B, 3] (0 past the client's steps); None without augmentation."""
        if self._aug_keys is None:
            return None
        width = self.steps * self.batch_size
        params = _augment_params(self._aug_keys, np.arange(len(self.client_ids)), 0, width)
        params[torch.arange(width, device="cpu") >= self.steps_per_client[:, None] * self.batch_size] = 0
        return params.to(self._rows.device)

    @cached_property
    def _grid(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._gather(torch.arange(self.steps * self.batch_size, device=self._rows.device))


def _augment_params(keys: np.ndarray, rows: np.ndarray, q0: int, q1: int) -> torch.Tensor:
    """The crop-flip parameters of flat positions q0..q1-1 of some schedule rows.

    long [a, q1 - q0, 3] = (dy, dx, flip) of flat positions q0..q1-1 of schedule rows `rows` (`keys`: every row's
    augmentation key).
    """
    return _crop_flip_params(_mix(keys[rows, None] ^ slot_words(q1)[None, q0:]))


def _upload(device: torch.device, arrays: list[np.ndarray]) -> list[torch.Tensor]:
    """int64 host arrays as device tensors in one host-to-device copy (concatenated, then split into views)."""
    sizes = [len(a) for a in arrays]
    flat = np.concatenate([np.asarray(a, dtype=np.int64).reshape(-1) for a in arrays]) if arrays else \
        np.zeros(0, dtype=np.int64)
    return list(torch.split(torch.from_numpy(flat).to(device, non_blocking=True), sizes))


def _crop_flip_params(h: np.ndarray) -> torch.Tensor:
    """The crop-flip parameters (dy, dx, flip), long [..., 3], from the hashes h of sample positions."""
    span = 2 * CROP_PADDING + 1  # 24-bit fields mod 9: bias 2^-24
    dy = (h >> _S40) % _U(span)
    dx = ((h >> _S16) & _U(0xFFFFFF)) % _U(span)
    flip = (h >> _S15) & _U(1)
    return torch.from_numpy(np.stack([dy, dx, flip], axis=-1).astype(np.int64))


def _groups(work: np.ndarray):
    """Consecutive client ranges [a, b) with about _GROUP units of `work` each (a heavier client alone)."""
    if len(work) == 0:
        return []
    group = (np.cumsum(work) - work) // _GROUP
    cuts = np.flatnonzero(np.diff(group)) + 1
    bounds = [0, *cuts.tolist(), len(work)]
    return list(zip(bounds[:-1], bounds[1:]))


def _ragged_arange(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """concat(arange(s, s + c) for s, c in zip(starts, counts)), vectorized."""
    total = int(counts.sum())
    shift = np.repeat(starts - (np.cumsum(counts) - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


def _shuffled_rows(flat, base, keys, n, epochs, last) -> np.ndarray:
    """Row ids, client by client and epoch by epoch, of the kept part of each epoch's permutation.

    Segment (client c, epoch e) holds n_c keys hash(keys_c, e, slot); one stable argsort of (segment << 32 |
    top 32 key bits) orders every segment at once without mixing segments (segment < 2^31).
    """
    seg_client = np.repeat(np.arange(len(n)), epochs)
    first = np.cumsum(epochs) - epochs
    seg_epoch = np.arange(len(seg_client)) - np.repeat(first, epochs)
    seg_n = n[seg_client]
    seg_keep = seg_n.copy()
    has = epochs > 0
    seg_keep[(first + epochs - 1)[has]] = last[has]  # the last epoch of a client keeps only its used prefix
    seg_key = absorb(keys[seg_client], seg_epoch.astype(np.uint64), _EPOCH)
    seg_of = np.repeat(np.arange(len(seg_n), dtype=np.int64), seg_n)
    slot = _ragged_arange(np.zeros(len(seg_n), dtype=np.int64), seg_n)  # also the position within the segment
    h = _mix(seg_key[seg_of] ^ slot_words(int(seg_n.max()) if len(seg_n) else 0)[slot])
    order = np.argsort((seg_of << 32) | (h >> _S32).astype(np.int64), kind="stable")
    keep = slot < seg_keep[seg_of]
    client_base = np.repeat(base[seg_client], seg_n)
    return flat[client_base[keep] + slot[order][keep]]


def apply_crop_flip(x: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """Random crop (zero padding 4) + horizontal flip with explicit per-sample params [..., 3] = (dy, dx, flip)."""
    return crop_flip(x, params[..., :2], params[..., 2].bool(), padding=CROP_PADDING)
