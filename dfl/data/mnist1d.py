"""MNIST-1D (Greydanus 2020), generated offline with the `mnist1d` package's own generator.

`mnist1d.data.make_dataset` draws from numpy's and Python's global RNGs after seeding them; both global
states are saved and restored so loading a dataset never perturbs the caller's randomness. The package's
`get_dataset` (which may download a pickle) is never called.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from dfl.data.checks import check_float, check_int
from dfl.data.types import Dataset, DataShape
from dfl.errors import DataError
from dfl.specs import Spec, param

INPUT_SHAPE, CLASSES = (1, 40), 10


@lru_cache(maxsize=4)
def _generate(num_samples: int, seed: int, test_fraction: float) -> tuple[np.ndarray, ...]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    args.seed = seed
    args.train_split = 1.0 - test_fraction
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = make_dataset(args)
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    arrays = (d["x"].astype(np.float32), d["y"].astype(np.int64), d["x_test"].astype(np.float32),
              d["y_test"].astype(np.int64))
    for a in arrays:
        a.flags.writeable = False  # cached: handed out as copies only
    return arrays


@dataclass(frozen=True)
class Mnist1dOptions(Spec):
    """The options of dataset mnist1d."""

    num_samples: int = param(4000, "the samples in all, rounded down to a multiple of 10 (equal per class), then "
                             "split into train and test (the package's default is 5000)", interval="[20, inf)")
    seed: int = param(42, "the seed of the generator, which fixes the data (the partition's seed is separate)",
                      interval="[0, inf)")
    test_fraction: float = param(0.2, "the share of the samples held out as the test set", interval="(0, 1)")


def mnist1d_options(*, num_samples: int = 4000, seed: int = 42, test_fraction: float = 0.2) -> dict:
    """The options of `load_mnist1d`, checked (ValueError naming the option) before anything is generated."""
    num_samples = check_int("num_samples", num_samples, 20)
    seed = check_int("seed", seed, 0)
    test_fraction = check_float("test_fraction", test_fraction, 0.0, 1.0)
    shape = mnist1d_shape({"num_samples": num_samples, "test_fraction": test_fraction})
    if shape.train < 1 or shape.test < 1:
        raise DataError(f"test_fraction={test_fraction} leaves an empty train or test set of "
                        f"num_samples={num_samples // 10 * 10}")
    return {"num_samples": num_samples, "seed": seed, "test_fraction": test_fraction}


def mnist1d_shape(options: dict) -> DataShape:
    """Train and test samples of `options` (as `mnist1d_options` returns them).

    num_samples rounded down to a multiple of 10, split by test_fraction.
    """
    n = options["num_samples"] // 10 * 10
    split = int(n * (1.0 - options["test_fraction"]))
    return DataShape(split, n - split, INPUT_SHAPE, CLASSES)


def load_mnist1d(*, num_samples: int = 4000, seed: int = 42, test_fraction: float = 0.2) -> Dataset:
    """MNIST-1D: 10 classes of 1-D signals of length 40, shape (1, 40), generated on the fly (embedded).

    Greydanus & Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024 (the `mnist1d` package): each
    digit's 1-D template is padded, sheared, scaled, shifted, blurred and noised; the generator standardizes it.
    """
    import torch  # here: the module is imported when a config is checked, before torch is needed

    options = mnist1d_options(num_samples=num_samples, seed=seed, test_fraction=test_fraction)
    num_samples, seed, test_fraction = options["num_samples"], options["seed"], options["test_fraction"]
    x, y, xt, yt = _generate(num_samples, seed, test_fraction)
    return Dataset(
        name="mnist1d",
        train_x=torch.tensor(x).unsqueeze(1),
        train_y=torch.tensor(y),
        test_x=torch.tensor(xt).unsqueeze(1),
        test_y=torch.tensor(yt),
        num_classes=CLASSES,
        input_shape=(1, x.shape[1]),
        options=options,
    )


# its Args section is generated from the spec, the one place each option is described
load_mnist1d.__doc__ = inspect.cleandoc(load_mnist1d.__doc__ or "") + "\n\n" + Mnist1dOptions.docstring_args()
