"""Embedded datasets, the on-device crop/flip augmentation, and the FederatedData container."""

from __future__ import annotations

import json
import random
import socket

import numpy as np
import pytest
import torch

from dfl.data import (
    DATASETS,
    PARTITIONS,
    Dataset,
    FederatedData,
    crop_flip,
    dataset_options,
    label_histograms,
    load_dataset,
    partition,
    random_crop_flip,
)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Any network connection fails the test; the working directory is empty so stray files show up."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- embedded datasets
@pytest.mark.parametrize(
    "name, options, shape, n_train, n_test",
    [
        ("mnist1d", {"num_samples": 1000}, (1, 40), 800, 200),
        ("digits", {}, (1, 8, 8), 1437, 360),
        ("synthetic", {"num_clients": 5}, (60,), None, None),
    ],
)
def test_embedded_shapes(offline, name, options, shape, n_train, n_test):
    ds = load_dataset(name, **options)
    assert isinstance(ds, Dataset) and ds.name == name and ds.input_shape == shape and ds.num_classes == 10
    assert ds.train_x.dtype == torch.float32 and ds.train_y.dtype == torch.int64
    assert tuple(ds.train_x.shape[1:]) == shape and tuple(ds.test_x.shape[1:]) == shape
    assert ds.train_y.shape == (ds.train_x.shape[0],) and ds.test_y.shape == (ds.test_x.shape[0],)
    if n_train is not None:
        assert (ds.train_x.shape[0], ds.test_x.shape[0]) == (n_train, n_test)
    assert int(ds.train_y.min()) >= 0 and int(ds.train_y.max()) < 10
    assert torch.isfinite(ds.train_x).all() and ds.augment is None


@pytest.mark.parametrize("name, options", [("mnist1d", {"num_samples": 600}), ("digits", {}),
                                           ("synthetic", {"num_clients": 4})])
def test_embedded_determinism(name, options):
    a = load_dataset(name, **options)
    b = load_dataset(name, **options)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    a.train_x.add_(1.0)  # callers may mutate what they get; the next load is unaffected
    c = load_dataset(name, **options, seed=7)
    assert not torch.equal(load_dataset(name, **options).train_x, c.train_x)
    assert torch.equal(load_dataset(name, **options).train_x, b.train_x)


def test_mnist1d_keeps_global_rng_state():
    np.random.seed(123)
    random.seed(123)
    expected_np, expected_py = np.random.rand(), random.random()
    np.random.seed(123)
    random.seed(123)
    load_dataset("mnist1d", num_samples=300, seed=5)
    assert np.random.rand() == expected_np and random.random() == expected_py


def test_mnist1d_is_standardized_and_balanced():
    ds = load_dataset("mnist1d", num_samples=2000)
    x = torch.cat([ds.train_x, ds.test_x])
    assert abs(x.mean().item()) < 1e-3 and abs(x.std().item() - 1) < 1e-2
    counts = torch.bincount(torch.cat([ds.train_y, ds.test_y]))
    assert counts.tolist() == [200] * 10


def test_digits_split_is_stratified_and_standardized():
    ds = load_dataset("digits", test_fraction=0.25, seed=3)
    assert ds.train_x.shape[0] + ds.test_x.shape[0] == 1797
    share = torch.bincount(ds.test_y, minlength=10).float() / torch.bincount(ds.train_y, minlength=10).float()
    assert ((share - 1 / 3).abs() < 0.05).all()
    assert abs(ds.train_x.mean().item()) < 1e-4 and abs(ds.train_x.std().item() - 1) < 1e-3


def test_synthetic_natural_split_and_generator():
    ds = load_dataset("synthetic", alpha=0.5, beta=0.5, num_clients=6, seed=1)
    split = ds.natural_split
    assert len(split) == 6
    flat = np.concatenate(split)
    assert np.array_equal(flat, np.arange(ds.train_x.shape[0]))  # contiguous ranges in client order
    assert all(s.size >= 45 for s in split)  # n_k >= min_samples = 50, 90% of it in train
    h = label_histograms(ds.train_y, split, 10)
    assert (h.max(1) / h.sum(1)).mean() > 0.3  # each client has its own W_k, so labels are skewed


def test_synthetic_covariance_is_power_law():
    """Within a client x ~ N(v_k, diag(j^-1.2)), j = 1..60."""
    ds = load_dataset("synthetic", num_clients=1, size_log_mean=np.log(20000), size_log_sigma=0.0)
    var = ds.train_x.double().var(0).numpy()
    assert np.abs(var / np.arange(1, 61) ** -1.2 - 1).max() < 0.1


def test_synthetic_sizes_follow_options():
    ds = load_dataset("synthetic", num_clients=10, size_log_sigma=0.0, size_log_mean=np.log(30.5), min_samples=20,
                      test_fraction=0.2)
    # n_k = floor(exp(log 30.5)) + 20 = 50 exactly: 40 train + 10 test each
    assert [s.size for s in ds.natural_split] == [40] * 10 and ds.test_x.shape[0] == 100


def test_dataset_errors():
    with pytest.raises(ValueError, match="dataset must be one of mnist1d, digits, synthetic, cifar10"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match=r"unknown option\(s\) alpha for dataset 'mnist1d'; allowed options: "
                                         r"num_samples=4000, seed=42, test_fraction=0.2"):
        load_dataset("mnist1d", alpha=1)
    with pytest.raises(ValueError, match="num_samples must be an int >= 20"):
        load_dataset("mnist1d", num_samples=5)
    with pytest.raises(ValueError, match=r"test_fraction must be a number in \(0.0, 1.0\)"):
        load_dataset("digits", test_fraction=1.0)
    with pytest.raises(ValueError, match=r"alpha must be a number in \[0.0, inf\)"):
        load_dataset("synthetic", alpha=-1)
    with pytest.raises(ValueError, match="num_clients must be an int >= 1"):
        load_dataset("synthetic", num_clients=0)
    assert set(DATASETS) == {"mnist1d", "digits", "synthetic", "cifar10", "cifar100", "mnist", "fashion-mnist"}
    assert dataset_options("synthetic")["alpha"] == 1.0 and dataset_options("cifar10") == {}


# ---------------------------------------------------------------------------- augmentation
def reference_crop_flip(img, dy, dx, flip, p=4):
    padded = torch.nn.functional.pad(img, (p, p, p, p))
    H, W = img.shape[-2:]
    out = padded[:, dy: dy + H, dx: dx + W]
    return out.flip(-1) if flip else out


def test_crop_flip_matches_explicit_crops():
    x = torch.randn(2, 3, 3, 8, 6)
    shifts = torch.tensor([[[0, 0], [8, 8], [3, 5]], [[4, 4], [1, 7], [8, 0]]])
    flips = torch.tensor([[False, True, False], [True, False, True]])
    out = crop_flip(x, shifts, flips)
    assert out.shape == x.shape
    for i in range(2):
        for j in range(3):
            ref = reference_crop_flip(x[i, j], int(shifts[i, j, 0]), int(shifts[i, j, 1]), bool(flips[i, j]))
            assert torch.equal(out[i, j], ref)
    assert torch.equal(crop_flip(x, torch.full((2, 3, 2), 4), torch.zeros(2, 3, dtype=torch.bool)), x)


def test_random_crop_flip_shape_reproducibility_and_shifts():
    x = torch.randn(4, 16, 3, 32, 32)
    a = random_crop_flip(x, torch.Generator().manual_seed(0))
    b = random_crop_flip(x, torch.Generator().manual_seed(0))
    c = random_crop_flip(x, torch.Generator().manual_seed(1))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c)
    # every output is one of the 9 x 9 x 2 crops of its zero-padded input, and several different ones occur
    used = set()
    for i in range(4):
        for j in range(16):
            matches = [(dy, dx, f) for dy in range(9) for dx in range(9) for f in (False, True)
                       if torch.equal(a[i, j], reference_crop_flip(x[i, j], dy, dx, f))]
            assert len(matches) == 1
            used.add(matches[0])
    assert len(used) > 30 and {f for *_, f in used} == {False, True}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_random_crop_flip_on_cuda_matches_cpu():
    x = torch.randn(3, 5, 3, 32, 32)
    cpu = random_crop_flip(x, torch.Generator().manual_seed(4))
    gpu = random_crop_flip(x.cuda(), torch.Generator().manual_seed(4))
    assert gpu.device.type == "cuda" and torch.equal(gpu.cpu(), cpu)


def test_random_crop_flip_errors():
    with pytest.raises(ValueError, match=r"x must have shape \[..., C, H, W\]"):
        random_crop_flip(torch.zeros(3, 4), torch.Generator())
    with pytest.raises(ValueError, match="shifts must be"):
        crop_flip(torch.zeros(2, 1, 4, 4), torch.zeros(3, 2, dtype=torch.long), torch.zeros(2, dtype=torch.bool))


# ---------------------------------------------------------------------------- FederatedData
def test_build_mnist1d_dirichlet():
    fd = FederatedData.build("mnist1d", 16, "dirichlet", seed=0, dataset_options={"num_samples": 1600},
                             partition_options={"alpha": 0.3})
    assert fd.num_clients == 16 and fd.sizes.tolist() == [80] * 16 and fd.sizes.dtype == torch.int64
    assert fd.input_shape == (1, 40) and fd.num_classes == 10 and fd.name == "mnist1d"
    h = fd.label_histograms()
    assert h.shape == (16, 10) and (h.sum(1) == 80).all()
    info = json.loads(json.dumps(fd.partition_info()))
    assert info["method"] == "dirichlet" and info["options"] == {"alpha": 0.3, "sigma": 0.0, "seed": 0}
    assert info["sizes"] == [80] * 16 and info["label_histograms"] == h.tolist()
    assert info["dataset_options"]["num_samples"] == 1600
    again = FederatedData.build("mnist1d", 16, "dirichlet", seed=0, dataset_options={"num_samples": 1600},
                                partition_options={"alpha": 0.3})
    assert all(torch.equal(a, b) for a, b in zip(fd.client_indices, again.client_indices))


def test_padded_indices_and_to():
    fd = FederatedData.build("digits", 5, "dirichlet", seed=1, partition_options={"alpha": 0.5, "sigma": 0.5})
    padded, sizes = fd.padded_indices()
    assert padded.dtype == torch.long and padded.shape == (5, int(sizes.max()))
    for i, idx in enumerate(fd.client_indices):
        assert torch.equal(padded[i, : sizes[i]], idx) and (padded[i, sizes[i]:] == 0).all()
    moved = fd.to("cpu")
    assert moved is not fd and torch.equal(moved.train_x, fd.train_x) and moved.client_indices[0].device.type == "cpu"
    # the one-op gather the engine does
    rows = fd.train_x[padded[:, :3]]
    assert rows.shape == (5, 3, 1, 8, 8) and torch.equal(rows[2, 1], fd.train_x[fd.client_indices[2][1]])


@pytest.mark.parametrize("method, options", [("iid", {}), ("dirichlet-class", {"alpha": 1.0, "min_size": 5}),
                                             ("shards", {"classes_per_client": 1}),
                                             ("similarity", {"similarity": 0.5})])
def test_build_every_partition(method, options):
    fd = FederatedData.build("digits", 8, method, seed=0, partition_options=options)
    assert fd.partition_info()["method"] == method and sum(fd.sizes.tolist()) <= fd.train_x.shape[0]
    assert set(PARTITIONS) >= {method}


def test_build_synthetic_natural_and_pooled():
    fd = FederatedData.build("synthetic", 7, "natural", seed=0)
    ds = load_dataset("synthetic", num_clients=7)
    assert fd.num_clients == 7
    assert [len(i) for i in fd.client_indices] == [len(s) for s in ds.natural_split]
    assert fd.partition_info()["options"] == {"seed": 0}
    pooled = FederatedData.build("synthetic", 7, "iid", seed=0)
    assert torch.equal(pooled.train_x, fd.train_x) and max(pooled.sizes) - min(pooled.sizes) <= 1
    with pytest.raises(ValueError, match="natural split has 7 clients but num_clients=5"):
        FederatedData.build("synthetic", 5, "natural", seed=0, dataset_options={"num_clients": 7})


def test_build_errors():
    with pytest.raises(ValueError, match="only synthetic has one, dataset 'digits' does not"):
        FederatedData.build("digits", 4, "natural", seed=0)
    with pytest.raises(ValueError, match="partition must be one of"):
        FederatedData.build("digits", 4, "pathologic", seed=0)
    with pytest.raises(ValueError, match="do not pass option split"):
        FederatedData.build("synthetic", 4, "natural", seed=0, partition_options={"split": []})
    with pytest.raises(ValueError, match="num_clients=2000 exceeds the 1437 training samples"):
        FederatedData.build("digits", 2000, "iid", seed=0)


def test_from_arrays():
    rng = np.random.default_rng(0)
    train = [(rng.normal(size=(n, 5)).astype(np.float64), rng.integers(0, 3, n)) for n in (4, 7, 1)]
    train[1] = (torch.tensor(train[1][0]), torch.tensor(train[1][1], dtype=torch.int32))
    fd = FederatedData.from_arrays(train=train, test=(rng.normal(size=(6, 5)), np.array([0, 1, 2, 3, 0, 1])))
    assert fd.num_classes == 4 and fd.input_shape == (5,) and fd.sizes.tolist() == [4, 7, 1]
    assert fd.train_x.dtype == torch.float32 and fd.train_y.dtype == torch.int64
    assert torch.equal(fd.train_x[fd.client_indices[1]], train[1][0].float())
    assert fd.partition_info()["method"] == "given" and fd.name == "arrays"
    images = FederatedData.from_arrays([(np.zeros((2, 3, 8, 8), np.uint8), [0, 1])], (np.zeros((1, 3, 8, 8)), [1]),
                                       num_classes=10, name="mine", augment="crop-flip")
    assert images.num_classes == 10 and images.augment == "crop-flip" and images.name == "mine"


X, Y = np.zeros((3, 2)), np.array([0, 1, 1])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"train": [], "test": (X, Y)}, "train must be a non-empty list"),
        ({"train": (X, Y), "test": (X, Y)}, "not a single"),
        ({"train": [(X,)], "test": (X, Y)}, r"train\[0\] must be an \(x, y\) pair"),
        ({"train": [(X, Y), (np.zeros((3, 4)), Y)], "test": (X, Y)}, r"train\[1\] x has sample shape \[4\]"),
        ({"train": [(X, Y)], "test": (np.zeros((3, 3)), Y)}, r"test x has sample shape \[3\]"),
        ({"train": [(X, Y.astype(float))], "test": (X, Y)}, r"train\[0\] y must hold integer class ids"),
        ({"train": [(X, Y[:2])], "test": (X, Y)}, "one label per sample of x"),
        ({"train": [(X, np.array([0, -1, 1]))], "test": (X, Y)}, "negative label -1"),
        ({"train": [(np.zeros(3), Y)], "test": (X, Y)}, r"must be \[n, \*input_shape\]"),
        ({"train": [(np.zeros((0, 2)), np.zeros(0, int))], "test": (X, Y)}, "with n >= 1"),
        ({"train": [(np.full((3, 2), np.nan), Y)], "test": (X, Y)}, "contains NaN or inf"),
        ({"train": [(X.astype(bool), Y)], "test": (X, Y)}, "must be real-valued"),
        ({"train": [(X, Y)], "test": (X, Y), "num_classes": 1}, r"labels go up to 1 but num_classes=1"),
        ({"train": [(X, Y)], "test": (X, Y), "num_classes": 0}, "num_classes must be a positive int"),
        ({"train": [(X, Y)], "test": (X, Y), "augment": "crop-flip"}, "needs image inputs"),
        ({"train": [(X, Y)], "test": (X, Y), "augment": "mixup"}, "augment must be one of"),
        ({"train": [(np.array([["a"]], dtype=object), [0])], "test": (X, Y)}, "object array"),
    ],
)
def test_from_arrays_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FederatedData.from_arrays(**kwargs)


def test_direct_construction_is_validated():
    x, y = torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="client 1 has no samples"):
        FederatedData(x, y, [torch.tensor([0, 1]), torch.tensor([], dtype=torch.long)], x, y, 2, (2,))
    with pytest.raises(ValueError, match=r"client 0 has indices outside \[0, 3\]"):
        FederatedData(x, y, [torch.tensor([4])], x, y, 2, (2,))
    with pytest.raises(ValueError, match=r"train_x has sample shape \[2\], expected \[3\]"):
        FederatedData(x, y, [torch.tensor([0])], x, y, 2, (3,))


def test_partition_of_dataset_labels_matches_build():
    ds = load_dataset("digits")
    parts = partition(ds.train_y, 6, "shards", seed=2, classes_per_client=2)
    fd = FederatedData.build("digits", 6, "shards", seed=2, partition_options={"classes_per_client": 2})
    assert all(np.array_equal(p, i.numpy()) for p, i in zip(parts, fd.client_indices))
