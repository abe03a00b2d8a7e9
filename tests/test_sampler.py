"""RoundSchedule: per-epoch permutations, step counts, augmentation, and (seed, client, round)-only randomness."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from dfl.data import FederatedData
from dfl.data import sampler as sampler_module
from dfl.data.sampler import CROP_PADDING, RoundSchedule, apply_crop_flip
from tests.helpers import row_coded_data

SIZES = (10, 7, 13, 5, 1, 8, 4)
make_data = partial(row_coded_data, sizes=SIZES)


def schedule(data, ids, t=0, seed=0, B=4, mode="epochs", amount=1):
    return RoundSchedule(data, list(ids), t, seed, B, mode, amount)


def ceil_div(a, b):
    return -(-a // b)


def client_rows(s, r):
    """(index, weight) of schedule row r over its own steps only."""
    k = int(s.steps_per_client[r]) * s.batch_size
    return s.index[r, :k], s.weight[r, :k]


def epochs_of(s, r, n):
    """Schedule row r's positions split into epochs of ceil(n / B) * B: [(index, weight), ...]."""
    index, weight = client_rows(s, r)
    L = ceil_div(n, s.batch_size) * s.batch_size
    return [(index[e : e + L], weight[e : e + L]) for e in range(0, index.numel(), L)]


def slot_order(data, s, r, cid, epoch=0):
    """Client cid's epoch as positions into its own client_indices (its permutation of 0..n-1)."""
    n = len(data.client_indices[cid])
    index, weight = epochs_of(s, r, n)[epoch]
    where = {int(v): i for i, v in enumerate(data.client_indices[cid])}
    return [where[int(v)] for v in index[weight > 0]]


# ------------------------------------------------------------------------------------ epochs / steps
@pytest.mark.parametrize("B, E", [(4, 3), (3, 1), (16, 2), (1, 2)])
def test_each_epoch_is_a_permutation_with_a_short_padded_last_batch(B, E):
    data = make_data()
    s = schedule(data, range(len(SIZES)), B=B, amount=E)
    per_epoch = [ceil_div(n, B) for n in SIZES]
    assert s.steps_per_client.tolist() == [E * p for p in per_epoch] and s.steps == E * max(per_epoch)
    B = min(B, max(SIZES))  # the width: a batch wider than every client is one pass over each client's data
    assert s.batch_size == B
    assert s.index.shape == s.weight.shape == (len(SIZES), s.steps * B) and s.aug is None
    for r, n in enumerate(SIZES):
        epochs = epochs_of(s, r, n)
        assert len(epochs) == E
        for index, weight in epochs:
            L = per_epoch[r] * B
            assert weight.tolist() == [1.0] * n + [0.0] * (L - n)  # real samples first, padding only at the end
            assert sorted(index[:n].tolist()) == sorted(data.client_indices[r].tolist())
        assert (s.weight[r, s.steps_per_client[r] * B :] == 0).all()  # no fake steps past the client's own


def test_steps_mode_takes_exactly_k_steps_and_restarts_the_permutation():
    data = make_data()
    B, K = 4, 7
    s = schedule(data, range(len(SIZES)), B=B, mode="steps", amount=K)
    assert s.steps_per_client.tolist() == [K] * len(SIZES) and s.steps == K
    for r, n in enumerate(SIZES):
        own = sorted(data.client_indices[r].tolist())
        epochs = epochs_of(s, r, n)
        assert len(epochs) == ceil_div(K, ceil_div(n, B))
        for e, (index, weight) in enumerate(epochs):
            real = index[weight > 0].tolist()
            if e < len(epochs) - 1 or index.numel() == ceil_div(n, B) * B:
                assert sorted(real) == own  # complete epochs are permutations
            else:
                assert len(set(real)) == len(real) and set(real) <= set(own)  # a prefix of the next permutation
        # consecutive epochs are fresh permutations, not repeats (n > 3: repeats are unlikely but possible)
        if n >= 5 and len(epochs) > 1:
            assert epochs[0][0][:n].tolist() != epochs[1][0][:n].tolist()


def test_batches_match_the_grids():
    data = make_data()
    for mode, amount in (("epochs", 2), ("steps", 5)):
        s = schedule(data, [3, 0, 6, 2], B=3, mode=mode, amount=amount)
        for k in range(s.steps):
            b = s.batch(k)
            active = (s.steps_per_client > k).nonzero().squeeze(1)
            assert torch.equal(b.rows, active)
            window = slice(k * 3, (k + 1) * 3)
            assert torch.equal(b.weight, s.weight[active, window])
            real = b.weight > 0
            assert torch.equal(b.x[..., 0][real].long(), s.index[active, window][real])
            assert torch.equal(b.y[real], data.train_y[s.index[active, window][real]])
            # padding repeats a real sample of the same client, whose gradient it does not touch (weight 0)
            for a, r in enumerate(active.tolist()):
                cid = [3, 0, 6, 2][r]
                assert set(b.x[a, :, 0].long().tolist()) <= set(data.client_indices[cid].tolist())


def test_full_batch_is_every_sample_in_order_every_step():
    data = make_data()
    s = schedule(data, range(len(SIZES)), B=0, mode="steps", amount=3)
    other = schedule(data, range(len(SIZES)), t=9, seed=4, B=0, mode="steps", amount=3)
    assert s.batch_size == max(SIZES) and s.steps == 3
    for k in range(3):
        b = s.batch(k)
        for r, n in enumerate(SIZES):
            assert b.weight[r].tolist() == [1.0] * n + [0.0] * (max(SIZES) - n)
            assert b.x[r, :n, 0].long().tolist() == data.client_indices[r].tolist()
        assert torch.equal(b.x, other.batch(k).x)
    e = schedule(data, range(len(SIZES)), B=0, mode="epochs", amount=2)
    assert e.steps_per_client.tolist() == [2] * len(SIZES)


@pytest.mark.parametrize("mode, amount", [("epochs", 2), ("steps", 3)])
def test_batch_size_is_capped_at_the_largest_client(mode, amount):
    """A batch wider than every client's data is one pass over each client's n_i samples: width max_j n_j over all
    clients (also for a subset holding only small ones), never [m, batch_size] (10**8 would need gigabytes)."""
    data = make_data()
    ids = [3, 0, 6, 2]
    exact = schedule(data, ids, t=2, seed=5, B=max(SIZES), mode=mode, amount=amount)
    for B in (max(SIZES) + 1, 10**8):
        huge = schedule(data, ids, t=2, seed=5, B=B, mode=mode, amount=amount)
        assert huge.batch_size == max(SIZES) and huge.steps == exact.steps
        assert torch.equal(huge.steps_per_client, exact.steps_per_client)
        for k in range(huge.steps):
            a, b = exact.batch(k), huge.batch(k)
            assert b.x.shape == (len(b.rows), max(SIZES), 1)
            assert torch.equal(a.rows, b.rows) and torch.equal(a.weight, b.weight) and torch.equal(a.x, b.x)
            assert (b.weight.sum(1) == torch.tensor([SIZES[ids[r]] for r in b.rows.tolist()])).all()
    small = schedule(data, [4, 6], B=10**8, mode=mode, amount=amount)  # clients of 1 and 4 samples
    assert small.batch_size == max(SIZES)
    assert schedule(data, [4, 6], B=3, mode=mode, amount=amount).batch_size == 3  # below the cap: unchanged


def test_full_batch_width_and_augmentation_do_not_depend_on_the_subset():
    data = make_data(augment="crop-flip")
    everyone = schedule(data, range(len(SIZES)), t=1, seed=3, B=0, mode="steps", amount=3)
    small = schedule(data, [4, 6], t=1, seed=3, B=0, mode="steps", amount=3)
    assert small.batch_size == everyone.batch_size == max(SIZES)
    assert torch.equal(small.aug, everyone.aug[[4, 6]])
    for k in range(3):
        assert torch.equal(small.batch(k).x, everyone.batch(k).x[[4, 6]])


def test_zero_steps_and_bad_mode():
    data = make_data()
    s = schedule(data, range(3), mode="steps", amount=0)
    assert s.steps == 0 and s.steps_per_client.tolist() == [0, 0, 0] and s.index.shape == (3, 0)
    with pytest.raises(ValueError, match="mode"):
        schedule(data, range(3), mode="rounds")


# ------------------------------------------------------------------------------------ augmentation
def test_crop_flip_parameters_are_in_range_deterministic_and_applied():
    data = make_data(sizes=(9, 6, 11), augment="crop-flip")
    s = schedule(data, range(3), t=2, B=4, mode="steps", amount=6)
    again = schedule(data, range(3), t=2, B=4, mode="steps", amount=6)
    aug = s.aug
    assert aug.shape == (3, 24, 3) and aug.dtype == torch.long
    assert torch.equal(aug, again.aug)
    shifts, flips = aug[..., :2], aug[..., 2]
    assert shifts.min() == 0 and shifts.max() == 2 * CROP_PADDING and set(flips.unique().tolist()) == {0, 1}
    assert set(shifts.flatten().tolist()) == set(range(2 * CROP_PADDING + 1))  # every shift occurs
    assert not torch.equal(aug, schedule(data, range(3), t=3, B=4, mode="steps", amount=6).aug)
    assert not torch.equal(aug, schedule(data, range(3), t=2, seed=1, B=4, mode="steps", amount=6).aug)
    for k in range(s.steps):
        b = s.batch(k)
        window = slice(4 * k, 4 * k + 4)
        expected = apply_crop_flip(data.train_x[s.index[:, window]], aug[:, window])
        real = b.weight > 0
        assert torch.equal(b.x[real], expected[real])
        assert torch.equal(b.x, again.batch(k).x)


# ------------------------------------------------------------------------------------ (seed, i, t) only
@pytest.mark.parametrize("mode, amount", [("epochs", 2), ("steps", 5)])
def test_a_clients_batches_do_not_depend_on_the_other_clients(mode, amount, monkeypatch):
    data = make_data(augment="crop-flip")
    everyone = schedule(data, range(len(SIZES)), t=3, seed=11, mode=mode, amount=amount)
    subset_ids = [5, 2, 0, 6]
    subset = schedule(data, subset_ids, t=3, seed=11, mode=mode, amount=amount)
    monkeypatch.setattr(sampler_module, "_GROUP", 3)  # many small vectorized groups instead of one
    grouped = schedule(data, list(reversed(range(len(SIZES)))), t=3, seed=11, mode=mode, amount=amount)
    for r, cid in enumerate(subset_ids):
        alone = schedule(data, [cid], t=3, seed=11, mode=mode, amount=amount)
        g = len(SIZES) - 1 - cid
        k = int(everyone.steps_per_client[cid]) * 4
        for other, row in ((subset, r), (alone, 0), (grouped, g)):
            assert int(other.steps_per_client[row]) * 4 == k
            for a, b in zip(client_rows(everyone, cid), client_rows(other, row)):
                assert torch.equal(a, b)
            assert torch.equal(everyone.aug[cid, :k], other.aug[row, :k])
        for step in range(k // 4):
            b1, b2 = everyone.batch(step), alone.batch(step)
            a1 = (b1.rows == cid).nonzero().item()
            torch.testing.assert_close(b1.x[a1], b2.x[0], rtol=0, atol=0)
            assert torch.equal(b1.weight[a1], b2.weight[0])


def test_different_rounds_seeds_and_clients_give_different_orders():
    sizes = (12,) * 6
    data = make_data(sizes=sizes)
    base = schedule(data, range(6), t=0, seed=0, B=5)
    orders = {tuple(slot_order(data, base, r, r)) for r in range(6)}
    assert len(orders) == 6  # equal-sized clients get different permutations of their slots
    for t, seed in ((1, 0), (0, 1), (2**40, 0), (0, -1), (0, 2**63 + 5)):
        other = schedule(data, range(6), t=t, seed=seed, B=5)
        assert all(slot_order(data, base, r, r) != slot_order(data, other, r, r) for r in range(6))
    assert slot_order(data, base, 0, 0) != list(range(12))


def test_matches_the_per_client_reference_definition():
    """Epoch e of client i sorts its slots by the top 32 bits of hash(seed, t, stream 0, i, e, slot)."""
    data = make_data()
    s = schedule(data, range(len(SIZES)), t=5, seed=21, B=4, mode="steps", amount=6)
    for cid, n in enumerate(SIZES):
        root = sampler_module.client_keys(21, [cid], 5, sampler_module.STREAM_ORDER)
        for e in range(len(epochs_of(s, cid, n))):
            seg = sampler_module.absorb(root, np.array([e], dtype=np.uint64), sampler_module._EPOCH)
            keys = sampler_module._mix(seg ^ sampler_module.slot_words(n)) >> np.uint64(32)
            expected = np.argsort(keys, kind="stable").tolist()
            got = slot_order(data, s, cid, cid, epoch=e)
            assert got == expected[: len(got)]


# ------------------------------------------------------------------------------------ uniformity
def chi_square(counts):
    counts = np.asarray(counts, dtype=float)
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


def test_permutations_are_uniform_across_clients_and_rounds():
    """Deterministic (fixed seeds), so the bounds cannot flake; each is far above the 99.99% chi-square quantile."""
    n, m = 8, 4000
    data = make_data(sizes=(n,) * m)
    s = schedule(data, range(m), t=0, seed=123, B=3)
    slots = np.array([slot_order(data, s, r, r) for r in range(m)])  # [m, n]
    position = np.zeros((n, n))
    for p in range(n):
        position[p] = np.bincount(slots[:, p], minlength=n)
    assert chi_square(position[0]) < 35  # df 7: 99.99% quantile 29.9
    assert chi_square(position) < 110  # every (position, slot) cell, df 49: 99.99% quantile 89
    pairs = np.bincount(slots[0::2, 0] * n + slots[1::2, 0], minlength=n * n)  # neighbouring clients, same round
    assert chi_square(pairs) < 120  # df 63: 99.99% quantile 108
    # one client over many rounds
    small = make_data(sizes=(n, 5))
    firsts = [slot_order(small, schedule(small, [0], t=t, seed=7, B=3), 0, 0)[0] for t in range(800)]
    assert chi_square(np.bincount(firsts, minlength=n)) < 35
    consecutive = np.bincount(np.array(firsts[:-1]) * n + np.array(firsts[1:]), minlength=n * n)
    assert chi_square(consecutive) < 120


# ------------------------------------------------------------------------------------ scale, FederatedData
def test_hundred_thousand_clients_build():
    m, n = 100_000, 10
    pool = torch.randperm(m * n, generator=torch.Generator().manual_seed(0))
    x = torch.arange(m * n, dtype=torch.float32)[:, None]
    y = torch.zeros(m * n, dtype=torch.long)
    data = FederatedData(train_x=x, train_y=y, client_indices=list(pool.view(m, n)), test_x=x[:2], test_y=y[:2],
                         num_classes=2, input_shape=(1,))
    s = RoundSchedule(data, list(range(m)), 4, 0, 8, "steps", 5)
    assert s.steps == 5 and (s.steps_per_client == 5).all()
    batches = {k: s.batch(k) for k in (0, 1, 4)}
    assert batches[4].x.shape == (m, 8, 1) and (batches[4].weight == 1).all()  # step 4 = epoch 2's first batch
    assert (batches[1].weight.sum(1) == 2).all()  # the short second batch of an epoch of 10
    for cid in (0, 31_337, m - 1):
        alone = RoundSchedule(data, [cid], 4, 0, 8, "steps", 5)
        for k, b in batches.items():
            assert torch.equal(b.x[cid], alone.batch(k).x[0])


def test_flat_and_padded_indices():
    sizes = (3, 1, 40, 2)
    data = make_data(sizes=sizes)
    flat, offsets, counts = data.flat_indices()
    assert counts.tolist() == list(sizes) and offsets.tolist() == [0, 3, 4, 44]
    assert torch.equal(flat, torch.cat(data.client_indices))
    assert data.flat_indices()[0] is flat  # cached
    padded, counts = data.padded_indices()
    assert padded.shape == (4, 40)
    for i, idx in enumerate(data.client_indices):
        assert torch.equal(padded[i, : sizes[i]], idx) and (padded[i, sizes[i] :] == 0).all()
    data.client_indices = data.client_indices[:2]  # a new list: the cache follows it
    assert data.flat_indices()[2].tolist() == [3, 1] and data.sizes.tolist() == [3, 1]
    with pytest.raises(ValueError, match="client 2 has indices outside"):
        FederatedData(train_x=data.train_x, train_y=data.train_y, client_indices=[[0], [1, 2], [3, 99]],
                      test_x=data.test_x, test_y=data.test_y, num_classes=3, input_shape=(1,))
