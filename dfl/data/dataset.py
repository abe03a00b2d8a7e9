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
from dfl.data.builtin import BUILTINS, DatasetCard
from dfl.data.types import Dataset, DataShape
from dfl.errors import DataError
from dfl.registry import Registry
from dfl.specs import Param, Spec, checked

USAGE = "f(*, option=default, ...) -> Dataset, or f(root, *, option=default, ...) -> Dataset to read data_root"


def _check(name: str, loader: Any) -> int:
    """The number of positional inputs of `loader`: 0 (embedded) or 1 (root: local)."""
    return signatures.check("dataset", name, loader, (0, 1), USAGE)


def describe(name: str, loader: Any) -> DatasetCard:
    """The card of a registered loader, read from its signature: whether it takes root, and its options."""
    return DatasetCard(_check(name, loader) == 1, signatures.options(loader))


# the built-ins are declared by card (`dfl.data.builtin`): checking a config against one loads nothing
DATASETS: Registry = Registry("dataset", group="dfl.datasets", describe=describe)
"""Every dataset the config field `dataset` takes: name -> loader, with its card (`DatasetCard`) for validation."""
for _name, (_target, _card) in BUILTINS.items():
    DATASETS.declare(_name, _target, _card)
del _name, _target, _card


SPECS: dict[str, type[Spec]] = {name: card.spec for name, (_, card) in BUILTINS.items() if card.spec is not None}
"""The option specs of the datasets that declare them (`dfl.specs`: type, default, allowed values, help): each
built-in's, on its card (`dfl.data.builtin`), and a plug-in's given to `register(..., options=...)`; a plug-in without
one is known by its signature's defaults."""


def register(name: str, loader: Callable | None = None, *, replace: bool = False,
             options: type[Spec] | None = None) -> Any:
    """Register `loader` as dataset `name` (a decorator without `loader`).

    Its signature is checked here: f(*, option=default, ...) for an embedded dataset, f(root, *, ...) for one read
    from data_root. `options`: the spec of its keyword-only options (`dfl.specs.Spec`), whose names and defaults must
    be the signature's: `dfl list datasets` and `dfl.validate` read it (a value outside it is refused).
    """
    if loader is None:
        return lambda target: register(name, target, replace=replace, options=options)
    _check(name, loader)
    try:
        spec = checked("dataset", name, options, signatures.options(loader)) if options is not None else None
    except ValueError as exc:
        raise DataError(str(exc)) from None
    registered = DATASETS.register(name, loader, replace=replace)
    SPECS.pop(name, None)
    if spec is not None:
        SPECS[name] = spec
    return registered


# an entry point's loader: checked as `register` checks one, with the spec its `options` attribute declares
DATASETS.plugin = lambda name, loader: register(name, loader, options=getattr(loader, "options", None))


def dataset_specs(name: str) -> tuple[Param, ...]:
    """The specs of the options of dataset `name` (none for a dataset registered without `options`)."""
    DATASETS.card(name, "dataset")
    spec = SPECS.get(name)
    return spec.specs() if spec is not None else ()


def check_option_values(name: str, options: dict[str, Any]) -> None:
    """ValueError naming `dataset_options.NAME` and the allowed values for a value outside its spec."""
    spec = SPECS.get(name)
    if spec is not None:
        spec.check_values(options, "dataset_options")


def needs_root(name: str) -> bool:
    """Whether dataset `name` is read from a local directory (its loader takes `root`)."""
    return DATASETS.card(name, "dataset").root


def dataset_options(name: str) -> dict[str, Any]:
    """The options `name` accepts, with their defaults ("required" for one without a default)."""
    return dict(DATASETS.card(name, "dataset").options)


def with_clients(name: str, options: dict[str, Any], clients: int) -> dict[str, Any]:
    """The dataset options a run with `clients` clients loads `name` with.

    Synthetic's own client count (its natural split) is the run's unless the options set it.
    """
    return {"num_clients": clients, **options} if name == "synthetic" else dict(options)


def check_options(name: str, options: dict[str, Any]) -> tuple[DatasetCard, dict[str, Any]]:
    """(card, options completed with their defaults) of dataset `name`, before anything is loaded.

    Unknown or missing options, and a built-in's own checks of their values (ValueError naming the option).
    """
    card = DATASETS.card(name, "dataset")
    resolved = signatures.resolve_declared("dataset", name, card.options, options)
    if card.check is not None:
        resolved = card.check(**resolved)
    return card, resolved


def data_shape(name: str, options: dict[str, Any]) -> DataShape | None:
    """How large dataset `name` is with `options` (checked), before it is loaded.

    None when its card does not say (a registered loader).
    """
    card, resolved = check_options(name, options)
    return card.shape(resolved) if card.shape is not None else None


def load_dataset(name: str, root: str | None = None, **options: Any) -> Dataset:
    """Load dataset `name`. Embedded datasets ignore `root`; local ones read their files from it."""
    fn = DATASETS.get(name)
    takes_root = _check(name, fn) == 1  # entry points are not checked at registration
    signatures.resolve("dataset", name, fn, options)  # unknown or missing options: an error naming the allowed ones
    if takes_root:
        if root is None:
            raise DataError(
                f"dataset {name!r} is read from a local directory: pass root (config field data_root); "
                "nothing is downloaded"
            )
        ds = fn(root, **options)
    else:
        ds = fn(**options)
    if not isinstance(ds, Dataset):
        raise DataError(f"dataset {name!r}: its loader {DATASETS.source(name)} returned {type(ds).__name__}, "
                        "not a dfl.data.Dataset")
    for split, x in (("train", ds.train_x), ("test", ds.test_x)):  # e.g. a data folder whose test files are empty
        if len(x) == 0:
            raise DataError(f"dataset {name!r}: its {split} split holds no samples (loaded by "
                            f"{DATASETS.source(name)}{f' from {root}' if takes_root else ''}); training and "
                            "evaluation need at least one")
    # the run records the name it was asked for, whatever the loader called its data
    return ds if ds.name == name else dataclasses.replace(ds, name=name)
