"""`Dataset`: what a dataset loader returns (a train/test pair as tensors). It imports no loader, so every
loader and the dataset registry (`dfl.data.dataset`) can import it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
