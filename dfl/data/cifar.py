"""CIFAR-10 / CIFAR-100 from the official "python version" pickles in a local directory.

Layouts (root may be the folder itself or its parent):
    cifar-10-batches-py/data_batch_1 .. data_batch_5, test_batch     (keys b"data", b"labels")
    cifar-100-python/train, test                                      (keys b"data", b"fine_labels")
b"data" is uint8 [N, 3072], channel-major (1024 red, 1024 green, 1024 blue, rows of 32), so it reshapes to
NCHW [N, 3, 32, 32]. Pixels are scaled to [0, 1] and normalized per channel with the train set's standard
mean/std. The pickles are read with an unpickler that only admits numpy arrays and plain containers.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from dfl.data.files import find_dir
from dfl.data.types import Dataset
from dfl.errors import FileReadError
from dfl.files import check_input_file

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}


class _NumpyUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only numpy arrays are expected")
        return super().find_class(module, name)


def _read_batch(path: Path, label_key: bytes, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch file.

    uint8 images [N, 3, 32, 32] and int64 labels [N], N >= 1; every failure is one `FileReadError` line naming the
    file.
    """
    what = "CIFAR batch file"
    check_input_file(path, what)
    try:
        with path.open("rb") as fh:
            batch = _NumpyUnpickler(fh, encoding="bytes").load()
    except Exception as exc:  # noqa: BLE001 - truncated, random bytes, a forbidden global: one line naming the file
        detail = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise FileReadError(path, f"is not a CIFAR python pickle ({type(exc).__name__}: {detail})", what) from None
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        keys = sorted(map(repr, batch))[:10] if isinstance(batch, dict) else type(batch).__name__
        raise FileReadError(path, f"expected a dict with keys b'data' and {label_key!r}, found {keys}", what)
    try:
        data = np.asarray(batch[b"data"])
        labels = np.asarray(batch[label_key])
    except (TypeError, ValueError) as exc:
        raise FileReadError(path, f"b'data' or {label_key!r} is not an array: {exc}", what) from None
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise FileReadError(path, f"b'data' must be uint8 [N, 3072], got {data.dtype} {list(data.shape)}", what)
    if data.shape[0] == 0:
        raise FileReadError(path, "holds 0 images: its split would be empty", what)
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise FileReadError(path, f"{label_key!r} must hold {data.shape[0]} integer labels, got {labels.dtype} "
                                  f"{list(labels.shape)}", what)
    if labels.min() < 0 or labels.max() >= num_classes:
        raise FileReadError(path, f"labels must be in [0, {num_classes - 1}], got [{labels.min()}, {labels.max()}]",
                            what)
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _to_dataset(name, train, test, num_classes, mean, std) -> Dataset:
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)

    def images(parts):
        x = torch.from_numpy(np.concatenate([p[0] for p in parts]))
        return (x.float().div_(255.0) - m) / s

    return Dataset(
        name=name,
        train_x=images(train),
        train_y=torch.from_numpy(np.concatenate([p[1] for p in train])),
        test_x=images(test),
        test_y=torch.from_numpy(np.concatenate([p[1] for p in test])),
        num_classes=num_classes,
        input_shape=(3, 32, 32),
        augment="crop-flip",
    )


def load_cifar10(root) -> Dataset:
    """CIFAR-10: 60,000 32×32 colour images in 10 classes (Krizhevsky, 2009), read from local files.

    The python version's batches, from root/cifar-10-batches-py or root itself; 50,000 train and 10,000 test
    images, normalized per channel with the train set's mean and std.

    Args:
        root: the folder holding the batches (the config's `data_root`).
    """
    train_files = tuple(f"data_batch_{i}" for i in range(1, 6))
    layout = "<root>/cifar-10-batches-py/{data_batch_1..data_batch_5, test_batch}"
    d = find_dir("cifar10", root, ("cifar-10-batches-py", ""), (*train_files, "test_batch"), layout)
    train = [_read_batch(d / f, b"labels", 10) for f in train_files]
    test = [_read_batch(d / "test_batch", b"labels", 10)]
    return _to_dataset("cifar10", train, test, 10, CIFAR10_MEAN, CIFAR10_STD)


def load_cifar100(root) -> Dataset:
    """CIFAR-100: 60,000 32×32 colour images in 100 classes, fine labels (Krizhevsky, 2009), from local files.

    The python version's train and test files, from root/cifar-100-python or root itself, normalized per
    channel with the train set's mean and std.

    Args:
        root: the folder holding the files (the config's `data_root`).
    """
    layout = "<root>/cifar-100-python/{train, test}"
    d = find_dir("cifar100", root, ("cifar-100-python", ""), ("train", "test"), layout)
    train = [_read_batch(d / "train", b"fine_labels", 100)]
    test = [_read_batch(d / "test", b"fine_labels", 100)]
    return _to_dataset("cifar100", train, test, 100, CIFAR100_MEAN, CIFAR100_STD)
