"""MNIST and Fashion-MNIST from the official IDX files in a local directory.

IDX format (LeCun): a big-endian header, two zero bytes, a type byte (0x08 = unsigned byte), the number of
dimensions, then one uint32 per dimension, then the data. Images have magic 0x00000803 ([N, 28, 28]),
labels 0x00000801 ([N]). Each file may be gzipped (name + ".gz"). Accepted places, like torchvision:
root itself, root/raw, root/MNIST/raw (mnist) or root/FashionMNIST/raw (fashion-mnist).
Pixels are scaled to [0, 1] and normalized with the train set's standard mean/std; images are [N, 1, 28, 28].
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from dfl.data.files import find_dir, find_file
from dfl.data.types import Dataset

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530


def read_idx(path: Path, magic: int) -> np.ndarray:
    """The uint8 array stored in an IDX file (optionally gzipped), checking magic number and size."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: cannot read IDX file: {exc}") from exc
    if len(raw) < 4 or int.from_bytes(raw[:4], "big") != magic:
        found = f"0x{int.from_bytes(raw[:4], 'big'):08x}" if len(raw) >= 4 else "a file shorter than 4 bytes"
        raise ValueError(f"{path}: expected IDX magic number 0x{magic:08x}, found {found}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        raise ValueError(f"{path}: header says shape {list(shape)} ({expected} bytes) but the file has {len(raw)}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _load(name: str, root, subdirs: tuple[str, ...], mean: float, std: float) -> Dataset:
    layout = (f"<root>/{subdirs[-1]}/ or <root>/ holding {', '.join(FILES)} (each may end in .gz)")
    d = find_dir(name, root, subdirs, FILES, layout, gz=True)
    x_tr, y_tr, x_te, y_te = (
        read_idx(find_file(d, f, gz=True), LABELS_MAGIC if "labels" in f else IMAGES_MAGIC) for f in FILES
    )
    for x, y, which in ((x_tr, y_tr, "train"), (x_te, y_te, "t10k")):
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{name} in {d}: {which} images has {x.shape[0]} samples but labels has {y.shape[0]}")
        if y.size and y.max() > 9:
            raise ValueError(f"{name} in {d}: {which} labels must be in [0, 9], found {int(y.max())}")
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise ValueError(f"{name} in {d}: train images {list(x_tr.shape[1:])} and t10k images "
                         f"{list(x_te.shape[1:])} differ in size")

    def images(x):
        return (torch.from_numpy(x.copy()).float().div_(255.0).unsqueeze(1) - mean) / std

    return Dataset(
        name=name,
        train_x=images(x_tr),
        train_y=torch.from_numpy(y_tr.astype(np.int64)),
        test_x=images(x_te),
        test_y=torch.from_numpy(y_te.astype(np.int64)),
        num_classes=10,
        input_shape=(1, *x_tr.shape[1:]),
    )


def load_mnist(root) -> Dataset:
    """MNIST from root, root/raw or root/MNIST/raw."""
    return _load("mnist", root, ("", "raw", "MNIST/raw"), MNIST_MEAN, MNIST_STD)


def load_fashion_mnist(root) -> Dataset:
    """Fashion-MNIST from root, root/raw or root/FashionMNIST/raw."""
    return _load("fashion-mnist", root, ("", "raw", "FashionMNIST/raw"), FASHION_MEAN, FASHION_STD)
