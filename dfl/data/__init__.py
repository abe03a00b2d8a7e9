"""Datasets (embedded, local files, in-memory arrays), partitioners, and the `FederatedData` container."""

from __future__ import annotations

from dfl.data.augment import crop_flip, random_crop_flip
from dfl.data.dataset import DATASETS, EMBEDDED, LOCAL, Dataset, dataset_options, load_dataset
from dfl.data.federated import FederatedData
from dfl.data.partitioners import PARTITIONS, label_histograms, partition, partition_options

__all__ = [
    "DATASETS",
    "EMBEDDED",
    "LOCAL",
    "PARTITIONS",
    "Dataset",
    "FederatedData",
    "crop_flip",
    "dataset_options",
    "label_histograms",
    "load_dataset",
    "partition",
    "partition_options",
    "random_crop_flip",
]
