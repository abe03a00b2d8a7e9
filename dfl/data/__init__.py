"""Datasets (embedded, local files, in-memory arrays), partitioners, and the `FederatedData` container.

Both datasets and partitions are registries (`dfl.registry.Registry`): `@dfl.data.register("name")` adds a
dataset loader, `@dfl.data.register_partition("name")` a partition method (entry-point groups `dfl.datasets`
and `dfl.partitions`).

Import graph, one direction: types, checks, files <- the loaders <- dataset (the dataset registry);
dirichlet <- partitioners; dataset, partitioners <- federated.
"""

from __future__ import annotations

from dfl.data.augment import crop_flip, random_crop_flip
from dfl.data.dataset import DATASETS, dataset_options, load_dataset, needs_root, register
from dfl.data.federated import FederatedData
from dfl.data.partitioners import PARTITIONS, label_histograms, partition, partition_options
from dfl.data.partitioners import register as register_partition
from dfl.data.types import Dataset

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "Dataset",
    "FederatedData",
    "check_config",
    "crop_flip",
    "dataset_options",
    "label_histograms",
    "load_dataset",
    "needs_root",
    "partition",
    "partition_options",
    "random_crop_flip",
    "register",
    "register_partition",
]


def check_config(config) -> None:
    """The data's part of `dfl.validate`: `dataset` and `partition` are registered. Whether a partition fits the
    dataset and the client count is known only when the data is built (`FederatedData.build`)."""
    DATASETS.require(config.dataset, "dataset")
    PARTITIONS.require(config.partition, "partition")
