"""The types of a dataset before and after loading: `Dataset` and `DataShape`.

`Dataset` is what a dataset loader returns (a train/test pair as tensors), and `DataShape`: how large a dataset will be,
known from its options before it is loaded. It imports no loader (and no torch), so every loader and the dataset
registry (`dfl.data.dataset`) can import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch


@dataclass
class Dataset:
    """A train/test pair as tensors: x float32 [N, *input_shape], y int64 [N].

    `natural_split` is set only for naturally federated datasets (synthetic): one int64 index array per
    client into the train set, used by the `natural` partition. `load_dataset` sets `name` to the name the
    loader is registered under.
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


@dataclass(frozen=True)
class DataShape:
    """How large a dataset is, before it is loaded: train and test samples, a sample's shape, the classes.

    `nbytes` is what loading it holds at its peak: every sample as float32 with an int64 label, twice (the
    loader's numpy arrays and the tensors made from them exist together for a moment).
    """

    train: int
    test: int
    input_shape: tuple[int, ...]
    num_classes: int

    @property
    def nbytes(self) -> int:
        """The bytes loading the dataset holds at its peak (see the class docstring)."""
        return 2 * (self.train + self.test) * (4 * math.prod(self.input_shape) + 8)
