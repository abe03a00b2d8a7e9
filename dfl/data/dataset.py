"""The dataset registry and `load_dataset(name, root=None, **options)`.

A dataset is a loader registered under a name (`DATASETS`, entry-point group `dfl.datasets`), of one of two
shapes, told apart by its signature:

    f(*, option=default, ...) -> Dataset          embedded: generated, or read from an installed package
    f(root, *, option=default, ...) -> Dataset    local: read from the directory `root` (config field data_root)

Its keyword-only parameters are its options. Built in: `mnist1d`, `digits`, `synthetic` (embedded) and
`cifar10`, `cifar100`, `mnist`, `fashion-mnist` (local, in their official formats). Nothing is ever
downloaded. Register your own with `@dfl.data.register("name")`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from dfl import signatures
from dfl.data.cifar import load_cifar10, load_cifar100
from dfl.data.digits import load_digits
from dfl.data.idx import load_fashion_mnist, load_mnist
from dfl.data.mnist1d import load_mnist1d
from dfl.data.synthetic import load_synthetic
from dfl.data.types import Dataset
from dfl.registry import Registry

DATASETS: Registry[Callable[..., Dataset]] = Registry("dataset", group="dfl.datasets")
USAGE = "f(*, option=default, ...) -> Dataset, or f(root, *, option=default, ...) -> Dataset to read data_root"


def _check(name: str, loader: Any) -> int:
    """The number of positional inputs of `loader`: 0 (embedded) or 1 (root: local)."""
    return signatures.check("dataset", name, loader, (0, 1), USAGE)


def register(name: str, loader: Callable[..., Dataset] | None = None, *, replace: bool = False) -> Any:
    """Register `loader` as dataset `name` (a decorator without `loader`). Its signature is checked here:
    f(*, option=default, ...) for an embedded dataset, f(root, *, ...) for one read from data_root."""
    if loader is None:
        return lambda target: register(name, target, replace=replace)
    _check(name, loader)
    return DATASETS.register(name, loader, replace=replace)


for _name, _loader in (("mnist1d", load_mnist1d), ("digits", load_digits), ("synthetic", load_synthetic),
                       ("cifar10", load_cifar10), ("cifar100", load_cifar100), ("mnist", load_mnist),
                       ("fashion-mnist", load_fashion_mnist)):
    register(_name, _loader)
del _name, _loader


def needs_root(name: str) -> bool:
    """Whether dataset `name` is read from a local directory (its loader takes `root`)."""
    return _check(name, DATASETS.get(name)) == 1


def dataset_options(name: str) -> dict[str, Any]:
    """The options `name` accepts, with their defaults ("required" for one without a default)."""
    fn = DATASETS.get(name)
    _check(name, fn)  # entry points are not checked at registration
    return signatures.options(fn)


def load_dataset(name: str, root: str | None = None, **options: Any) -> Dataset:
    """Load dataset `name`. Embedded datasets ignore `root`; local ones read their files from it."""
    fn = DATASETS.get(name)
    takes_root = _check(name, fn) == 1  # entry points are not checked at registration
    signatures.resolve("dataset", name, fn, options)  # unknown or missing options: an error naming the allowed ones
    if takes_root:
        if root is None:
            raise ValueError(
                f"dataset {name!r} is read from a local directory: pass root (config field data_root); "
                "nothing is downloaded"
            )
        ds = fn(root, **options)
    else:
        ds = fn(**options)
    if not isinstance(ds, Dataset):
        raise ValueError(f"dataset {name!r}: its loader {DATASETS.source(name)} returned {type(ds).__name__}, "
                         "not a dfl.data.Dataset")
    for split, x in (("train", ds.train_x), ("test", ds.test_x)):  # e.g. a data folder whose test files are empty
        if len(x) == 0:
            raise ValueError(f"dataset {name!r}: its {split} split holds no samples (loaded by "
                             f"{DATASETS.source(name)}{f' from {root}' if takes_root else ''}); training and "
                             "evaluation need at least one")
    # the run records the name it was asked for, whatever the loader called its data
    return ds if ds.name == name else dataclasses.replace(ds, name=name)
