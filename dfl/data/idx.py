"""MNIST and Fashion-MNIST from the official IDX files in a local directory.

IDX format (LeCun): a big-endian header, two zero bytes, a type byte (0x08 = unsigned byte), the number of
dimensions, then one uint32 per dimension, then the data. Images have magic 0x00000803 ([N, 28, 28]),
labels 0x00000801 ([N]). Each file may be gzipped (name + ".gz"). Accepted places, like torchvision:
root itself, root/raw, root/MNIST/raw (mnist) or root/FashionMNIST/raw (fashion-mnist).
Pixels are scaled to [0, 1] and normalized with the train set's standard mean/std; images are [N, 1, 28, 28].
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from dfl.data.files import find_dir, find_file
from dfl.data.types import Dataset
from dfl.errors import FileReadError
from dfl.files import check_input_file
from dfl.sysmem import available_memory, human_bytes

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
IMAGES_MAGIC, LABELS_MAGIC = 0x00000803, 0x00000801
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530


def read_idx(path: Path, magic: int, what: str = "IDX file") -> np.ndarray:
    """The uint8 array stored in an IDX file (optionally gzipped), checked before it is read.

    The magic number, and the size the header claims against the file and the memory available, are checked
    before the data is read; every failure is one `FileReadError` line naming the file.
    """
    path = check_input_file(path, what)
    gz = path.suffix == ".gz"
    try:
        with (gzip.open if gz else open)(path, "rb") as fh:
            head = fh.read(4)
            if len(head) < 4 or int.from_bytes(head, "big") != magic:
                found = f"0x{int.from_bytes(head, 'big'):08x}" if len(head) == 4 else "a file shorter than 4 bytes"
                raise FileReadError(path, f"expected IDX magic number 0x{magic:08x}, found {found}", what)
            ndim = magic & 0xFF
            dims = fh.read(4 * ndim)
            if len(dims) < 4 * ndim:
                raise FileReadError(path, "truncated IDX header", what)
            shape = tuple(int.from_bytes(dims[4 * i: 4 * i + 4], "big") for i in range(ndim))
            expected = math.prod(shape)
            claim = f"header says shape {list(shape)} ({expected:,} bytes of data)"
            if not gz and path.stat().st_size - 4 - 4 * ndim != expected:
                raise FileReadError(path, f"{claim} but the file holds {path.stat().st_size - 4 - 4 * ndim:,}", what)
            if expected > available_memory():
                raise FileReadError(path, f"{claim}, more than the {human_bytes(available_memory())} of memory "
                                          "available", what)
            raw = _read_exactly(fh, expected)
    except FileReadError:
        raise
    except (OSError, EOFError, zlib.error) as exc:  # a corrupt or truncated gzip stream, a read error
        raise FileReadError(path, f"cannot be read: {exc}", what) from None
    if len(raw) != expected:
        holds = f"{len(raw):,}" if len(raw) <= expected else f"more than {expected:,}"
        raise FileReadError(path, f"{claim} but the {'decompressed ' if gz else ''}file holds {holds}", what)
    return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


def _read_exactly(fh, size: int, block: int = 1 << 24) -> bytes:
    """Up to size + 1 bytes of `fh`, read in blocks.

    Block by block, so a header that overstates the size allocates only what the file holds.
    """
    parts, total = [], 0
    while total <= size:
        part = fh.read(min(block, size + 1 - total))
        if not part:
            break
        parts.append(part)
        total += len(part)
    return b"".join(parts)


def _load(name: str, root, subdirs: tuple[str, ...], mean: float, std: float) -> Dataset:
    layout = (f"<root>/{subdirs[-1]}/ or <root>/ holding {', '.join(FILES)} (each may end in .gz)")
    d = find_dir(name, root, subdirs, FILES, layout, gz=True)
    # find_dir returned d because every file is there: no file is left out
    paths = [p for p in (find_file(d, f, gz=True) for f in FILES) if p is not None]
    x_tr, y_tr, x_te, y_te = (
        read_idx(p, LABELS_MAGIC if "labels" in f else IMAGES_MAGIC, f"{name} {'labels' if 'labels' in f else 'images'}"
                 " file") for p, f in zip(paths, FILES)
    )
    for x, y, which, images_file in ((x_tr, y_tr, "train", paths[0]), (x_te, y_te, "t10k", paths[2])):
        if x.shape[0] == 0:
            raise FileReadError(images_file, f"holds 0 images: the {which} split would be empty", f"{name} images file")
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
    """MNIST: 70,000 28×28 grey-scale handwritten digits (LeCun et al., 1998), read from local IDX files.

    The four IDX files (gzipped or not) from root, root/raw or root/MNIST/raw; 60,000 train and 10,000 test
    images, normalized with the train set's mean and std.

    Args:
        root: the folder holding the files (the config's `data_root`).
    """
    return _load("mnist", root, ("", "raw", "MNIST/raw"), MNIST_MEAN, MNIST_STD)


def load_fashion_mnist(root) -> Dataset:
    """Fashion-MNIST: 70,000 28×28 grey-scale images of clothing in 10 classes (Xiao et al., 2017), local files.

    The four IDX files from root, root/raw or root/FashionMNIST/raw, laid out as MNIST's; normalized with the
    train set's mean and std.

    Args:
        root: the folder holding the files (the config's `data_root`).
    """
    return _load("fashion-mnist", root, ("", "raw", "FashionMNIST/raw"), FASHION_MEAN, FASHION_STD)
