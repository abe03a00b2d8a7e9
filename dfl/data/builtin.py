"""The built-in datasets as the registry declares them: where each loader lives, and its card.

A card is what validation reads of a dataset before loading it (`dfl.data.check_config`): whether it is read
from `data_root`, its options with their defaults, and, for the built-ins, the check of the options' values and
the size of the data they ask for (`DataShape`: samples, sample shape, classes), so a wrong option or a dataset
that cannot fit in memory is refused before torch loads and before anything is generated or read. A registered
loader's card is read from its signature (`dfl.data.dataset.describe`); `tests/test_fast_refusals.py` keeps each
built-in's card equal to that of the loader it declares.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dfl import signatures
from dfl.data.digits import DigitsOptions, digits_options, digits_shape
from dfl.data.mnist1d import Mnist1dOptions, mnist1d_options, mnist1d_shape
from dfl.data.synthetic import SyntheticOptions, synthetic_options, synthetic_shape
from dfl.data.types import DataShape
from dfl.specs import Spec, checked


@dataclass(frozen=True)
class DatasetCard:
    """What validation reads of a dataset.

    `root` (read from data_root), `options` (name -> default, or "required"), and for a built-in `check(**options)
    -> options` (completed; ValueError naming a bad one), `shape(options) -> DataShape`, the options that make it
    large (`size_options`, named when it does not fit), whether it has its own client split (`natural`, for the
    partition of that name) and the spec of its options (`spec`, `dfl.specs`: type, default, range, help).
    """

    root: bool
    options: dict[str, Any] = field(default_factory=dict)
    check: Callable[..., dict[str, Any]] | None = field(default=None, compare=False)
    shape: Callable[[dict[str, Any]], DataShape] | None = field(default=None, compare=False)
    size_options: tuple[str, ...] = field(default=(), compare=False)
    natural: bool | None = field(default=None, compare=False)  # has its own client split (None: not known)
    spec: type[Spec] | None = field(default=None, compare=False)


def _card(name: str, spec: type[Spec], check: Callable[..., dict[str, Any]], shape: Callable[[dict], DataShape],
          *sizes: str, natural: bool = False) -> DatasetCard:
    declared = signatures.options(check)
    return DatasetCard(False, declared, check, shape, sizes, natural, checked("dataset", name, spec, declared))


def _files(shape: DataShape) -> DatasetCard:
    """A dataset read from data_root in its official format, whose files hold `shape`."""
    return DatasetCard(True, {}, lambda: {}, lambda options: shape, (), False)


# name -> ("module:loader", card), in the order `dfl list datasets` shows them
BUILTINS: dict[str, tuple[str, DatasetCard]] = {
    "mnist1d": ("dfl.data.mnist1d:load_mnist1d", _card("mnist1d", Mnist1dOptions, mnist1d_options, mnist1d_shape,
                                                       "num_samples")),
    "digits": ("dfl.data.digits:load_digits", _card("digits", DigitsOptions, digits_options, digits_shape)),
    "synthetic": ("dfl.data.synthetic:load_synthetic", _card(
        "synthetic", SyntheticOptions, synthetic_options, synthetic_shape, "num_clients", "min_samples",
        "size_log_mean", "size_log_sigma",
        natural=True)),
    "cifar10": ("dfl.data.cifar:load_cifar10", _files(DataShape(50_000, 10_000, (3, 32, 32), 10))),
    "cifar100": ("dfl.data.cifar:load_cifar100", _files(DataShape(50_000, 10_000, (3, 32, 32), 100))),
    "mnist": ("dfl.data.idx:load_mnist", _files(DataShape(60_000, 10_000, (1, 28, 28), 10))),
    "fashion-mnist": ("dfl.data.idx:load_fashion_mnist", _files(DataShape(60_000, 10_000, (1, 28, 28), 10))),
}
