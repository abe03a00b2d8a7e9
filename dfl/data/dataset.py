"""`Dataset` and `load_dataset(name, root=None, **options)`: one name table for every dataset.

Embedded datasets (`mnist1d`, `digits`, `synthetic`) are generated or read from installed packages;
the others are read from a local directory in their official formats. Nothing is ever downloaded.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class Dataset:
    """A train/test pair as tensors: x float32 [N, *input_shape], y int64 [N].

    `natural_split` is set only for naturally federated datasets (synthetic): one int64 index array per
    client into the train set, used by the `natural` partition.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    augment: str | None = None
    natural_split: list[np.ndarray] | None = None
    options: dict[str, Any] = field(default_factory=dict)


def _embedded() -> dict[str, Callable[..., Dataset]]:
    from dfl.data.digits import load_digits
    from dfl.data.mnist1d import load_mnist1d
    from dfl.data.synthetic import load_synthetic

    return {"mnist1d": load_mnist1d, "digits": load_digits, "synthetic": load_synthetic}


def _local() -> dict[str, Callable[..., Dataset]]:
    from dfl.data.cifar import load_cifar10, load_cifar100
    from dfl.data.idx import load_fashion_mnist, load_mnist

    return {"cifar10": load_cifar10, "cifar100": load_cifar100, "mnist": load_mnist,
            "fashion-mnist": load_fashion_mnist}


EMBEDDED = ("mnist1d", "digits", "synthetic")
LOCAL = ("cifar10", "cifar100", "mnist", "fashion-mnist")
DATASETS = EMBEDDED + LOCAL


def dataset_options(name: str) -> dict[str, Any]:
    """The options `name` accepts, with their defaults."""
    loader = _loader(name)
    params = inspect.signature(loader).parameters
    return {k: p.default for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _loader(name: str) -> Callable[..., Dataset]:
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(DATASETS)}; got {name!r}")
    return {**_embedded(), **_local()}[name]


def load_dataset(name: str, root: str | None = None, **options: Any) -> Dataset:
    """Load dataset `name`. Embedded datasets ignore `root`; local ones read their files from it."""
    loader = _loader(name)
    allowed = dataset_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        listed = ", ".join(f"{k}={v!r}" for k, v in allowed.items()) or "none"
        raise ValueError(f"unknown option(s) {', '.join(unknown)} for dataset {name!r}; allowed options: {listed}")
    if name in LOCAL:
        if root is None:
            raise ValueError(
                f"dataset {name!r} is read from a local directory: pass root (config field data_root); "
                "nothing is downloaded"
            )
        return loader(root, **options)
    return loader(**options)


# ---------------------------------------------------------------------------- option checks shared by loaders
def check_int(field_name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{field_name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_float(field_name: str, value: Any, low: float, high: float | None = None, *, open_low: bool = True,
                open_high: bool = True) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = np.isfinite(v) and (v > low if open_low else v >= low)
        if ok and high is not None:
            ok = v < high if open_high else v <= high
    if not ok:
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        raise ValueError(f"{field_name} must be a number in {lo}{low}, {'inf' if high is None else high}{hi}, "
                         f"got {value!r}")
    return float(value)
