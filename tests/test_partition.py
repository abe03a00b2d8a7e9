"""Partitioners: sizes, disjointness and coverage, label skew at the alpha extremes, the SCAFFOLD and shard
splits, reproducibility, the Dirichlet sampler's semantics against a reference loop, and every error path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfl.data import PARTITIONS, label_histograms, partition, partition_options
from dfl.data.dirichlet import _class_stream, _client_stream, log_dirichlet

C = 10
LABELS = np.repeat(np.arange(C), 100)  # 1000 samples, 100 per class
RAGGED = np.random.default_rng(5).integers(0, C, 997)  # unequal class counts, N prime

ALL = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.3}),
    ("dirichlet", {"alpha": 0.3, "sigma": 0.5}),
    ("dirichlet-class", {"alpha": 0.5, "min_size": 5}),
    ("dirichlet-class", {"alpha": 0.5, "min_size": 5, "self_balancing": True}),
    ("shards", {"classes_per_client": 2}),
    ("shards", {"classes_per_client": 3}),
    ("similarity", {"similarity": 0.3}),
]


def check_disjoint(parts, n, *, complete=True):
    flat = np.concatenate(parts)
    assert all(p.dtype == np.int64 for p in parts)
    assert np.unique(flat).size == flat.size  # disjoint
    assert flat.min() >= 0 and flat.max() < n
    if complete:
        assert flat.size == n
    assert all(p.size >= 1 for p in parts)
    assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted


@pytest.mark.parametrize("labels", [LABELS, RAGGED], ids=["equal", "ragged"])
@pytest.mark.parametrize("method, options", ALL, ids=[f"{m}-{o}" for m, o in ALL])
def test_disjoint_covering_and_histograms(labels, method, options):
    m = 20
    parts = partition(labels, m, method, seed=3, **options)
    assert len(parts) == m
    balanced_dirichlet = method == "dirichlet" and not options.get("sigma")
    check_disjoint(parts, labels.size, complete=not balanced_dirichlet)
    if balanced_dirichlet:  # floor(N/m) each; the N mod m rest is unused
        assert [p.size for p in parts] == [labels.size // m] * m
    h = label_histograms(labels, parts, C)
    assert h.shape == (m, C) and h.dtype == np.int64
    assert (h.sum(1) == [p.size for p in parts]).all()
    for i in (0, m - 1):
        assert (h[i] == np.bincount(labels[parts[i]], minlength=C)).all()
    assert partition(labels, m, method, seed=3, **options)[0].tolist() == parts[0].tolist()  # reproducible
    assert any(a.tolist() != b.tolist() for a, b in zip(parts, partition(labels, m, method, seed=4, **options)))


def test_iid_sizes_and_proportions():
    parts = partition(RAGGED, 7, "iid", seed=0)
    sizes = [p.size for p in parts]
    assert sum(sizes) == 997 and max(sizes) - min(sizes) <= 1
    parts = partition(np.repeat(np.arange(C), 1000), 10, "iid", seed=0)
    props = label_histograms(np.repeat(np.arange(C), 1000), parts, C) / 1000
    assert np.abs(props - 0.1).max() < 0.05


def test_dirichlet_sigma_gives_unequal_sizes_summing_to_n():
    parts = partition(RAGGED, 20, "dirichlet", seed=1, alpha=1.0, sigma=1.0)
    sizes = np.array([p.size for p in parts])
    assert sizes.sum() == RAGGED.size and sizes.std() > 10


@pytest.mark.parametrize("method, extra", [("dirichlet", {}), ("dirichlet-class", {"min_size": 1})])
def test_large_alpha_is_near_uniform(method, extra):
    labels = np.repeat(np.arange(C), 1000)
    parts = partition(labels, 10, method, seed=0, alpha=1e4, **extra)
    h = label_histograms(labels, parts, C)
    props = h / h.sum(1, keepdims=True)
    assert np.abs(props - 0.1).max() < 0.04


def test_tiny_alpha_gives_about_one_class_per_client():
    labels = np.repeat(np.arange(C), 1000)

    def dominant_share(alpha):
        h = label_histograms(labels, partition(labels, 100, "dirichlet", seed=0, alpha=alpha), C)
        return (h.max(1) / h.sum(1)).mean()

    # balanced sizes force clients whose class ran out to take their next most likely class, hence not 1.0
    assert dominant_share(1e-3) > 0.75 and dominant_share(1.0) < 0.6 and dominant_share(1e4) < 0.2
    h = label_histograms(labels, partition(labels, 5, "dirichlet-class", seed=0, alpha=1e-3, min_size=1,
                                           max_retries=100), C)
    assert (h.max(0) >= 0.99 * h.sum(0)).all()  # each class lands (almost) whole on one client


@pytest.mark.slow
def test_dirichlet_matches_reference_popping_loop():
    """The sampler (docs/reference/update-rules.md#dirichlet-partition) as a plain loop; compare statistics."""

    def reference(labels, m, alpha, rng):
        perm = rng.permutation(labels.size)
        capacity = np.full(m, labels.size // m)
        cdf = np.cumsum(rng.dirichlet([alpha] * 4, size=m), axis=1)
        pools = [list(perm[labels[perm] == c]) for c in range(4)]
        parts = [[] for _ in range(m)]
        while capacity.sum() > 0:
            i = rng.integers(m)
            if capacity[i] <= 0:
                continue
            capacity[i] -= 1
            for tries in range(10**6):
                c = int(np.argmax(rng.random() <= cdf[i]))
                if tries > 5000:  # prior mass on the open classes underflows: same fallback as the sampler
                    c = int(rng.choice([k for k in range(4) if pools[k]]))
                if pools[c]:
                    break
            parts[i].append(pools[c].pop())
        return [np.array(p, dtype=np.int64) for p in parts]

    def stats(parts):
        h = label_histograms(labels, parts, 4)
        return (h.max(1) / h.sum(1)).mean(), (h > 0).sum(1).mean()

    labels = np.repeat(np.arange(4), [50, 20, 20, 10])
    ref = np.array([stats(reference(labels, 5, 0.5, np.random.default_rng(s))) for s in range(300)])
    ours = np.array([stats(partition(labels, 5, "dirichlet", seed=s, alpha=0.5)) for s in range(300)])
    se = np.sqrt(ref.var(0) / 300 + ours.var(0) / 300)
    assert (np.abs(ref.mean(0) - ours.mean(0)) < 4 * se).all()


def test_client_picks_are_uniform_over_non_full_clients():
    """Capacities (1, 3): a uniform pick among non-full clients puts client 0 first with probability 1/2 and
    last with probability 1/8 (a random arrangement of the multiset would give 1/4 and 1/4)."""
    rng = np.random.default_rng(0)
    seqs = np.array([_client_stream(np.array([1, 3]), rng) for _ in range(4000)])
    assert (seqs == 0).sum(1).tolist() == [1] * 4000
    assert abs((seqs[:, 0] == 0).mean() - 0.5) < 0.03 and abs((seqs[:, 3] == 0).mean() - 0.125) < 0.02


def test_class_redraw_is_restricted_prior():
    """One client, q = (1/2, 1/2), one sample of class 0 and plenty of class 1: the class-0 draw happens at
    step k with probability 2^-(k+1), and never twice."""
    rng = np.random.default_rng(0)
    first = []
    for _ in range(4000):
        out = _class_stream(np.zeros(6, np.int64), np.log([[0.5, 0.5]]), np.array([1, 10]), rng)
        assert (out == 0).sum() <= 1
        first.append(int(np.argmax(out == 0)) if (out == 0).any() else 6)
    freq = np.bincount(first, minlength=7) / 4000
    assert abs(freq[0] - 0.5) < 0.03 and abs(freq[1] - 0.25) < 0.03 and abs(freq[6] - 1 / 64) < 0.01


def test_class_stream_follows_prior_while_classes_last():
    rng = np.random.default_rng(1)
    prior = np.array([[0.7, 0.2, 0.1]])
    out = _class_stream(np.zeros(20000, np.int64), np.log(prior), np.array([10**6] * 3), rng)
    assert np.abs(np.bincount(out, minlength=3) / 20000 - prior[0]).max() < 0.015


def test_class_redraw_follows_underflowing_prior():
    """q = (1, 1e-320, 1e-400): in float the last two are 0 and 0, in log space the 2nd dominates the 3rd."""
    out = _class_stream(np.zeros(30, np.int64), np.array([[0.0, -320 * np.log(10), -400 * np.log(10)]]),
                        np.array([10, 10, 10]), np.random.default_rng(0))
    assert out.tolist() == [0] * 10 + [1] * 10 + [2] * 10


def test_log_dirichlet_moments():
    rng = np.random.default_rng(0)
    for alpha in (0.05, 1.0, 50.0):
        q = np.exp(log_dirichlet(alpha, 20000, 4, rng))
        assert np.allclose(q.sum(1), 1.0)
        assert np.abs(q.mean(0) - 0.25).max() < 0.01
        var = 0.25 * 0.75 / (4 * alpha + 1)  # Var q_c = (1/K)(1 - 1/K) / (K alpha + 1)
        assert abs(q[:, 0].var() / var - 1) < 0.06


def test_shards_one_class_per_client():
    for labels, m in ((LABELS, 10), (LABELS, 30), (RAGGED, 10), (RAGGED, 25)):
        parts = partition(labels, m, "shards", seed=0, classes_per_client=1)
        h = label_histograms(labels, parts, C)
        assert ((h > 0).sum(1) == 1).all()
        check_disjoint(parts, labels.size)
    h = label_histograms(RAGGED, partition(RAGGED, 20, "shards", seed=0, classes_per_client=2), C)
    assert ((h > 0).sum(1) <= 2).all()


def test_shards_fewer_shards_than_classes_still_cover():
    parts = partition(LABELS, 2, "shards", seed=0, classes_per_client=2)  # 4 shards for 10 classes
    check_disjoint(parts, LABELS.size)


@pytest.mark.parametrize("m, k", [(20, 2), (20, 5), (100, 2), (7, 10), (50, 1)])
def test_pathological_gives_k_distinct_classes_equal_sizes(m, k):
    """DisPFL's n_cls split: every client n = floor(N/m) samples of exactly k classes (about n/k each, a
    Multinomial), never a sample twice; reproducible in the seed. shards, by contrast, repeats classes."""
    parts = partition(RAGGED, m, "pathological", seed=3, classes_per_client=k)
    h = label_histograms(RAGGED, parts, C)
    assert [p.size for p in parts] == [RAGGED.size // m] * m
    assert ((h > 0).sum(1) == k).all()
    assert all(np.unique(p).size == p.size for p in parts)  # no sample twice in one client
    n = RAGGED.size // m
    assert np.abs(h[h > 0] - n / k).max() < 5 * np.sqrt(n) + 1  # shares about n / k
    assert partition(RAGGED, m, "pathological", seed=3, classes_per_client=k)[1].tolist() == parts[1].tolist()
    assert any(a.tolist() != b.tolist() for a, b in zip(parts, partition(RAGGED, m, "pathological", seed=4,
                                                                         classes_per_client=k)))


def test_pathological_reuses_samples_only_of_classes_asked_for_more_than_they_hold():
    """A class more clients chose than its samples carry is shared in proportion and then reused (as DisPFL's code
    does); classes asked for less give each sample to at most one client."""
    parts = partition(LABELS, 50, "pathological", seed=0, classes_per_client=2)
    flat = np.concatenate(parts)
    holders = np.bincount(flat, minlength=LABELS.size)
    demand = np.bincount(LABELS[flat], minlength=C)  # samples asked of each class
    for c in range(C):
        counts = holders[LABELS == c]
        if demand[c] <= 100:
            assert counts.max() <= 1 and counts.sum() == demand[c]
        else:
            assert (counts >= 1).all() and counts.sum() == demand[c]  # every sample used before any is reused
    assert (demand > 100).any() and (demand < 100).any()  # the seed exercises both cases


def test_pathological_refuses_more_classes_than_exist_and_oversized_clients():
    with pytest.raises(ValueError, match=r"classes_per_client = 11 exceeds the 10 classes"):
        partition(LABELS, 4, "pathological", seed=0, classes_per_client=11)
    with pytest.raises(ValueError, match=r"needs \d+ samples of class \d+, which has 100"):
        partition(LABELS, 2, "pathological", seed=0, classes_per_client=1)


def test_similarity_extremes():
    h0 = label_histograms(RAGGED, partition(RAGGED, 10, "similarity", seed=0, similarity=0.0), C)
    assert ((h0 > 0).sum(1) <= 2).all()
    h1 = label_histograms(LABELS, partition(LABELS, 10, "similarity", seed=0, similarity=1.0), C)
    assert ((h1 > 0).sum(1) >= 8).all()
    assert (np.abs(h1 / h1.sum(1, keepdims=True) - 0.1).max()) < 0.15
    assert ((h1 > 0).sum(1) > (h0 > 0).sum(1)).all()


def test_similarity_never_leaves_a_client_empty():
    labels = np.arange(10) % 3
    parts = partition(labels, 10, "similarity", seed=0, similarity=0.5)
    assert [p.size for p in parts] == [1] * 10


def test_natural_split_is_checked_and_kept():
    split = [np.array([3, 0]), np.array([1]), np.array([2, 4])]
    parts = partition(np.zeros(5, np.int64), 3, "natural", seed=0, split=split)
    assert [p.tolist() for p in parts] == [[0, 3], [1], [2, 4]]
    with pytest.raises(ValueError, match="natural split has 3 clients but num_clients=2"):
        partition(np.zeros(5, np.int64), 2, "natural", seed=0, split=split)
    with pytest.raises(ValueError, match="at most one client"):
        partition(np.zeros(5, np.int64), 2, "natural", seed=0, split=[np.array([0, 1]), np.array([1])])
    with pytest.raises(ValueError, match="train set has 5 samples"):
        partition(np.zeros(5, np.int64), 1, "natural", seed=0, split=[np.array([7])])
    with pytest.raises(ValueError, match="0 samples"):
        partition(np.zeros(5, np.int64), 2, "natural", seed=0, split=[np.array([0]), np.array([], np.int64)])
    with pytest.raises(ValueError, match="needs option split=.*synthetic"):
        partition(np.zeros(5, np.int64), 1, "natural", seed=0)


def test_accepts_torch_labels_and_lists_options():
    parts = partition(torch.tensor(LABELS), 4, "iid", seed=0)
    assert sum(p.size for p in parts) == LABELS.size
    assert set(PARTITIONS) == {"iid", "dirichlet", "dirichlet-class", "shards", "pathological", "similarity",
                               "natural"}
    assert partition_options("dirichlet") == {"alpha": 0.3, "sigma": 0.0}
    assert partition_options("similarity") == {"similarity": "required"}


@pytest.mark.parametrize(
    "args, options, message",
    [
        ((LABELS, 0, "iid"), {}, "num_clients must be an int >= 1"),
        ((LABELS, 2.5, "iid"), {}, "num_clients must be an int >= 1"),
        ((LABELS, 1001, "iid"), {}, "num_clients=1001 exceeds the 1000 training samples"),
        ((LABELS, 4, "random"), {}, "partition must be one of iid, dirichlet"),
        ((LABELS, 4, "iid"), {"alpha": 0.5}, r"unknown option\(s\) alpha for partition 'iid'; allowed options: none"),
        ((LABELS, 4, "dirichlet"), {"beta": 1}, r"unknown option\(s\) beta .*allowed options: alpha=0.3, sigma=0.0"),
        ((LABELS, 4, "dirichlet"), {"alpha": 0.0}, r"alpha must be a number in \(0.0, inf\)"),
        ((LABELS, 4, "dirichlet"), {"alpha": -1}, "alpha must be a number"),
        ((LABELS, 4, "dirichlet-class"), {"alpha": float("nan")}, "alpha must be a number"),
        ((LABELS, 4, "dirichlet"), {"sigma": -0.1}, r"sigma must be a number in \[0.0, inf\)"),
        ((LABELS, 4, "similarity"), {"similarity": 1.5}, r"similarity must be a number in \[0.0, 1.0\]"),
        ((LABELS, 4, "similarity"), {"similarity": -0.1}, r"similarity must be a number in \[0.0, 1.0\]"),
        ((LABELS, 4, "similarity"), {}, r"needs option similarity=s with s in \[0, 1\]"),
        ((LABELS, 4, "shards"), {"classes_per_client": 0}, "classes_per_client must be an int >= 1"),
        ((LABELS, 600, "shards"), {"classes_per_client": 2}, r"600 \* 2 = 1200 exceeds the 1000 training samples"),
        ((LABELS, 200, "dirichlet-class"), {"min_size": 10}, "min_size=10 x num_clients=200 exceeds"),
        ((LABELS, 4, "dirichlet-class"), {"min_size": 0}, "min_size must be an int >= 1"),
        ((LABELS, 4, "dirichlet-class"), {"self_balancing": "yes"}, "self_balancing must be true or false"),
        ((np.array([0.5, 1.0]), 1, "iid"), {}, "labels must be a 1-D integer array"),
        ((np.array([[0, 1]]), 1, "iid"), {}, "labels must be a 1-D integer array"),
        ((np.array([0, -1]), 1, "iid"), {}, "labels must be >= 0"),
    ],
)
def test_errors(args, options, message):
    with pytest.raises(ValueError, match=message):
        partition(*args, seed=0, **options)


def test_seed_must_be_a_non_negative_int():
    with pytest.raises(ValueError, match="seed must be an int >= 0"):
        partition(LABELS, 2, "iid", seed=-1)


def test_dirichlet_class_gives_up_with_a_clear_message():
    with pytest.raises(ValueError, match=r"could not reach min_size=50 .* after 3 retries .*; lower min_size or "
                                         "raise alpha"):
        partition(LABELS, 20, "dirichlet-class", seed=0, alpha=0.01, min_size=50, max_retries=3)


def test_dirichlet_sigma_that_empties_a_client_is_refused():
    with pytest.raises(ValueError, match=r"sigma=5.0 gives client\(s\) .* 0 samples; .*lower sigma"):
        partition(np.zeros(40, np.int64), 20, "dirichlet", seed=0, sigma=5.0)


def test_label_histograms_checks_num_classes():
    with pytest.raises(ValueError, match="labels go up to 9 but num_classes=5"):
        label_histograms(LABELS, [np.arange(3)], 5)
