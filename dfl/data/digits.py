"""scikit-learn's bundled handwritten digits (UCI optdigits test set): 1797 real 8x8 images, 10 classes."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import numpy as np

from dfl.data.checks import check_float, check_int
from dfl.data.types import Dataset, DataShape
from dfl.errors import DataError
from dfl.specs import Spec, param

SAMPLES, SHAPE, CLASSES = 1797, (1, 8, 8), 10


@dataclass(frozen=True)
class DigitsOptions(Spec):
    """The options of dataset digits."""

    test_fraction: float = param(0.2, "the share held out as the test set by a stratified split (every class in "
                                 "both parts)", interval="(0, 1)")
    seed: int = param(0, "the seed of the train/test split", interval="[0, inf)")


def digits_options(*, test_fraction: float = 0.2, seed: int = 0) -> dict:
    """The options of `load_digits`, checked (ValueError naming the option) before anything is loaded.

    The stratified split needs every class in both parts.
    """
    options = {"test_fraction": check_float("test_fraction", test_fraction, 0.0, 1.0),
               "seed": check_int("seed", seed, 0)}
    shape = digits_shape(options)
    if min(shape.train, shape.test) < CLASSES:
        raise DataError(f"test_fraction={test_fraction} cannot give a stratified split of digits: the "
                        f"{shape.test} test and {shape.train} train samples must each hold all {CLASSES} classes")
    return options


def digits_shape(options: dict) -> DataShape:
    """scikit-learn's split of the 1797 samples: ceil(test_fraction * 1797) test samples, the rest train."""
    test = math.ceil(options["test_fraction"] * SAMPLES)
    return DataShape(SAMPLES - test, test, SHAPE, CLASSES)


def load_digits(*, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """Digits: scikit-learn's 1,797 handwritten digits as (1, 8, 8) images, 10 classes (embedded).

    The UCI optical recognition of handwritten digits set (Alpaydin & Kaynak, 1998), as `sklearn.datasets.
    load_digits` ships it. Pixels are scaled from 0..16 to [0, 1], then standardized with the train set's global
    mean and std, x ← (x − mean)/std (one scalar each: corner pixels are constant, so a per-pixel std would be 0).
    """
    import torch  # here (and scikit-learn): the module is imported when a config is checked
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    options = digits_options(test_fraction=test_fraction, seed=seed)
    test_fraction, seed = options["test_fraction"], options["seed"]
    bunch = sk_load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    try:
        x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=seed)
    except ValueError as exc:  # too small a test set to hold every class
        raise DataError(f"test_fraction={test_fraction} cannot give a stratified split of digits: {exc}") from exc
    mean, std = float(x_tr.mean()), float(x_tr.std())
    shape = SHAPE
    return Dataset(
        name="digits",
        train_x=torch.tensor((x_tr - mean) / std).reshape(-1, *shape),
        train_y=torch.tensor(y_tr),
        test_x=torch.tensor((x_te - mean) / std).reshape(-1, *shape),
        test_y=torch.tensor(y_te),
        num_classes=10,
        input_shape=shape,
        options={"test_fraction": test_fraction, "seed": seed},
    )


# its Args section is generated from the spec, the one place each option is described
load_digits.__doc__ = inspect.cleandoc(load_digits.__doc__ or "") + "\n\n" + DigitsOptions.docstring_args()
