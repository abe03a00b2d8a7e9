"""Local-file datasets on tiny fixtures written here in the official formats: CIFAR python pickles and
IDX files (plain and gzipped), in every accepted layout, plus missing and malformed directories."""

from __future__ import annotations

import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from dfl.data import load_dataset
from dfl.data.cifar import CIFAR10_MEAN, CIFAR10_STD
from dfl.data.idx import MNIST_MEAN, MNIST_STD, read_idx


# ---------------------------------------------------------------------------- fixture writers
def write_cifar_batch(path, n, label_key, num_classes, seed, protocol=2):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = [int(v) for v in rng.integers(0, num_classes, n)]  # the official files store a list
    batch = {b"batch_label": b"fixture", label_key: labels, b"data": data, b"filenames": [b"x.png"] * n}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        pickle.dump(batch, fh, protocol=protocol)
    return data, np.array(labels)


def write_cifar10(root, n=3):
    d = root / "cifar-10-batches-py"
    parts = [write_cifar_batch(d / f"data_batch_{i}", n, b"labels", 10, i) for i in range(1, 6)]
    test = write_cifar_batch(d / "test_batch", n, b"labels", 10, 9)
    return parts, test


def write_cifar100(root, n=4):
    d = root / "cifar-100-python"
    train = write_cifar_batch(d / "train", n, b"fine_labels", 100, 1)
    test = write_cifar_batch(d / "test", n, b"fine_labels", 100, 2)
    return train, test


def idx_bytes(array, magic):
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", s) for s in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_set(d, n_train=5, n_test=3, gz=False, side=28):
    rng = np.random.default_rng(0)
    d.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train-images-idx3-ubyte": (rng.integers(0, 256, (n_train, side, side)), 0x803),
        "train-labels-idx1-ubyte": (rng.integers(0, 10, n_train), 0x801),
        "t10k-images-idx3-ubyte": (rng.integers(0, 256, (n_test, side, side)), 0x803),
        "t10k-labels-idx1-ubyte": (rng.integers(0, 10, n_test), 0x801),
    }
    for name, (a, magic) in arrays.items():
        raw = idx_bytes(a, magic)
        if gz:
            (d / (name + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (d / name).write_bytes(raw)
    return {k: v[0] for k, v in arrays.items()}


# ---------------------------------------------------------------------------- CIFAR
@pytest.mark.parametrize("where", ["parent", "folder"])
def test_cifar10_reads_official_pickles(tmp_path, where):
    parts, (test_data, test_labels) = write_cifar10(tmp_path)
    root = tmp_path if where == "parent" else tmp_path / "cifar-10-batches-py"
    ds = load_dataset("cifar10", root=str(root))
    assert ds.train_x.shape == (15, 3, 32, 32) and ds.train_x.dtype == torch.float32
    assert ds.test_x.shape == (3, 3, 32, 32) and ds.train_y.dtype == torch.int64
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32) and ds.augment == "crop-flip"
    assert ds.train_y.tolist() == np.concatenate([p[1] for p in parts]).tolist()
    # pixel (c, h, w) of sample 0 of batch 2 = data[c * 1024 + h * 32 + w], normalized per channel
    data = parts[1][0]
    c, h, w = 2, 5, 7
    expected = (data[0, c * 1024 + h * 32 + w] / 255.0 - CIFAR10_MEAN[c]) / CIFAR10_STD[c]
    assert ds.train_x[3, c, h, w].item() == pytest.approx(expected, abs=1e-5)
    assert ds.test_y.tolist() == test_labels.tolist()


def test_cifar100_uses_fine_labels(tmp_path):
    (train, train_labels), _ = write_cifar100(tmp_path)
    ds = load_dataset("cifar100", root=tmp_path)
    assert ds.num_classes == 100 and ds.train_x.shape == (4, 3, 32, 32) and ds.test_x.shape == (4, 3, 32, 32)
    assert ds.train_y.tolist() == train_labels.tolist()
    ds2 = load_dataset("cifar100", root=tmp_path / "cifar-100-python")
    assert torch.equal(ds.train_x, ds2.train_x)


def test_cifar_protocol_5_pickle(tmp_path):
    write_cifar10(tmp_path)
    write_cifar_batch(tmp_path / "cifar-10-batches-py" / "test_batch", 2, b"labels", 10, 3, protocol=5)
    assert load_dataset("cifar10", root=tmp_path).test_x.shape == (2, 3, 32, 32)


def test_cifar_missing_directory_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"cifar10: data root .* is not a directory.*cifar-10-batches-py"
                                                r".*Nothing is downloaded"):
        load_dataset("cifar10", root=tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"no complete set of files.*data_batch_1\.\.data_batch_5, test_batch"
                                                r".*Nothing is downloaded"):
        load_dataset("cifar10", root=tmp_path)
    write_cifar10(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "data_batch_4").unlink()
    with pytest.raises(FileNotFoundError, match="missing there: data_batch_4"):
        load_dataset("cifar10", root=tmp_path)
    with pytest.raises(FileNotFoundError, match=r"cifar-100-python/\{train, test\}"):
        load_dataset("cifar100", root=tmp_path)


def test_cifar_needs_a_root():
    with pytest.raises(ValueError, match="read from a local directory: pass root.*nothing is downloaded"):
        load_dataset("cifar10")


def test_cifar_malformed_files(tmp_path):
    write_cifar10(tmp_path)
    d = tmp_path / "cifar-10-batches-py"
    (d / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="test_batch: is not a CIFAR python pickle"):
        load_dataset("cifar10", root=tmp_path)
    with (d / "test_batch").open("wb") as fh:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8)}, fh)
    with pytest.raises(ValueError, match=r"expected a dict with keys b'data' and b'labels'"):
        load_dataset("cifar10", root=tmp_path)
    with (d / "test_batch").open("wb") as fh:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, fh)
    with pytest.raises(ValueError, match=r"b'data' must be uint8 \[N, 3072\]"):
        load_dataset("cifar10", root=tmp_path)
    with (d / "test_batch").open("wb") as fh:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, fh)
    with pytest.raises(ValueError, match=r"labels must be in \[0, 9\]"):
        load_dataset("cifar10", root=tmp_path)
    with (d / "test_batch").open("wb") as fh:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, fh)
    with pytest.raises(ValueError, match="must hold 2 integer labels"):
        load_dataset("cifar10", root=tmp_path)


def test_cifar_pickle_cannot_run_code(tmp_path):
    write_cifar10(tmp_path)

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with (tmp_path / "cifar-10-batches-py" / "test_batch").open("wb") as fh:
        pickle.dump({b"data": Evil(), b"labels": []}, fh)
    with pytest.raises(ValueError, match=r"refusing to load builtins\.print"):
        load_dataset("cifar10", root=tmp_path)


# ---------------------------------------------------------------------------- MNIST / Fashion-MNIST
@pytest.mark.parametrize("name, sub", [("mnist", ""), ("mnist", "MNIST/raw"), ("mnist", "raw"),
                                       ("fashion-mnist", ""), ("fashion-mnist", "FashionMNIST/raw")])
@pytest.mark.parametrize("gz", [False, True])
def test_idx_layouts(tmp_path, name, sub, gz):
    arrays = write_idx_set(tmp_path / sub if sub else tmp_path, gz=gz)
    ds = load_dataset(name, root=tmp_path)
    assert ds.train_x.shape == (5, 1, 28, 28) and ds.test_x.shape == (3, 1, 28, 28)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10 and ds.augment is None
    assert ds.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert ds.test_y.dtype == torch.int64
    if name == "mnist":
        raw = arrays["train-images-idx3-ubyte"][2, 10, 11]
        assert ds.train_x[2, 0, 10, 11].item() == pytest.approx((raw / 255.0 - MNIST_MEAN) / MNIST_STD, abs=1e-5)


def test_idx_prefers_plain_file_when_both_exist(tmp_path):
    plain = write_idx_set(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(b"garbage, would fail if read")
    assert load_dataset("mnist", root=tmp_path).train_y.tolist() == plain["train-labels-idx1-ubyte"].tolist()


def test_idx_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no complete set of files.*MNIST/raw.*train-images-idx3-ubyte.*"
                                                r"\.gz.*Nothing is downloaded"):
        load_dataset("mnist", root=tmp_path)
    write_idx_set(tmp_path / "FashionMNIST" / "raw")
    (tmp_path / "FashionMNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="missing there: t10k-labels-idx1-ubyte"):
        load_dataset("fashion-mnist", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_dataset("fashion-mnist", root=tmp_path / "absent")


def test_idx_malformed(tmp_path):
    write_idx_set(tmp_path)
    labels = tmp_path / "train-labels-idx1-ubyte"
    images = tmp_path / "train-images-idx3-ubyte"
    good = labels.read_bytes()
    labels.write_bytes(idx_bytes(np.zeros(5), 0x803)[:12])
    with pytest.raises(ValueError, match="expected IDX magic number 0x00000801, found 0x00000803"):
        load_dataset("mnist", root=tmp_path)
    labels.write_bytes(good[:-1])
    with pytest.raises(ValueError, match=r"header says shape \[5\] \(5 bytes of data\) but the file holds 4"):
        load_dataset("mnist", root=tmp_path)
    labels.write_bytes(idx_bytes(np.zeros(4), 0x801))
    with pytest.raises(ValueError, match="train images has 5 samples but labels has 4"):
        load_dataset("mnist", root=tmp_path)
    labels.write_bytes(idx_bytes(np.full(5, 12), 0x801))
    with pytest.raises(ValueError, match=r"labels must be in \[0, 9\], found 12"):
        load_dataset("mnist", root=tmp_path)
    labels.write_bytes(good)
    images.write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match="shorter than 4 bytes"):
        load_dataset("mnist", root=tmp_path)
    images.unlink()
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz: cannot be read: Not a gzipped file"):
        load_dataset("mnist", root=tmp_path)


def test_read_idx_round_trip(tmp_path):
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "f.gz").write_bytes(gzip.compress(idx_bytes(a, 0x803)))
    assert np.array_equal(read_idx(tmp_path / "f.gz", 0x803), a)


def test_local_datasets_take_no_options(tmp_path):
    with pytest.raises(ValueError, match=r"unknown option\(s\) num_samples for dataset 'mnist'; allowed options: none"):
        load_dataset("mnist", root=tmp_path, num_samples=10)
