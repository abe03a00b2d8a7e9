"""Datasets (embedded, local files, in-memory arrays), partitioners, and the `FederatedData` container.

Both datasets and partitions are registries (`dfl.registry.Registry`): `@dfl.data.register("name")` adds a
dataset loader, `@dfl.data.register_partition("name")` a partition method (entry-point groups `dfl.datasets`
and `dfl.partitions`).

Import graph, one direction: types, checks, files <- the loaders <- builtin (their cards) <- dataset (the dataset
registry); dirichlet <- partitioners; dataset, partitioners <- federated. Checking a config (`check_config`)
imports no torch: the built-in datasets are declared by card (`dfl.data.builtin`), and `FederatedData`, the
augmentations and the loaders themselves load on first use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfl.config import Config
from dfl.data.dataset import (
    DATASETS,
    check_options,
    data_shape,
    dataset_options,
    dataset_specs,
    load_dataset,
    needs_root,
    register,
    with_clients,
)
from dfl.data.dataset import check_option_values as check_dataset_option_values
from dfl.data.partitioners import (
    PARTITIONS,
    check_option_values,
    check_partition_options,
    dataset_supplied,
    label_histograms,
    partition,
    partition_options,
    partition_specs,
)
from dfl.data.partitioners import register as register_partition
from dfl.data.types import Dataset, DataShape
from dfl.errors import ConfigError
from dfl.lazy import submodules
from topologies import limits

DIRICHLET = ("dirichlet", "dirichlet-class")  # the partitions that take the Config field alpha
ALPHA_DEFAULT = 0.3
# partition options that a Config field gives: the field, and how to set it
FIELD_OPTIONS = {"alpha": "alpha (--alpha)", "seed": "seed (--seed: the partition is drawn from the run's seed)"}

# what imports torch, on first use
__getattr__ = submodules(__name__, {"FederatedData": "dfl.data.federated", "crop_flip": "dfl.data.augment",
                                    "random_crop_flip": "dfl.data.augment"})

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "DataShape",
    "Dataset",
    "FederatedData",
    "check_config",
    "crop_flip",
    "data_shape",
    "dataset_options",
    "dataset_specs",
    "label_histograms",
    "load_dataset",
    "needs_root",
    "partition",
    "partition_options",
    "partition_specs",
    "unread_fields",
    "random_crop_flip",
    "register",
    "register_partition",
    "run_partition_options",
]


def unread_fields(config: Config) -> list[str]:
    """The data fields set in `config` that its dataset does not read: ["data_root"] for a dataset made in memory."""
    return ["data_root"] if config.data_root is not None and not DATASETS.card(config.dataset).root else []


def check_config(config: Config) -> DataShape | None:
    """The data's part of `dfl.validate`, before anything is loaded; the dataset's size when its card knows it.

    `dataset` and `partition` are registered, their options known (a built-in's in range), each setting given once (the
    dataset's directory is `data_root`, never `dataset_options.root`; alpha and seed are Config fields, not partition
    options), a dataset read from a directory has `data_root` and one made in memory has none, alpha goes with a
    Dirichlet partition, every client can get a sample and the dataset fits in the memory free; partitions meet the
    labels at build time.
    """
    options = config.dataset_options
    if "root" in options:
        raise ConfigError(f"dataset_options.root = {options['root']!r}: a dataset's directory is the field data_root "
                          f"(--data-root), set once; remove root from dataset_options")
    DATASETS.card(config.dataset, "dataset")  # a registered name (or the one meant)
    try:  # each option against its declared range or choices: one line naming it and the allowed values
        check_dataset_option_values(config.dataset, options)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        card, resolved = check_options(config.dataset, with_clients(config.dataset, options, config.clients))
    except ValueError as exc:
        raise ConfigError(f"dataset_options: {exc}") from None
    if unread_fields(config):  # refused, never ignored, as every field a run would not read
        readers = [name for name in DATASETS.names() if DATASETS.card(name).root]
        raise ConfigError(f"data_root = {config.data_root!r} is not read by dataset {config.dataset!r} (made in "
                          f"memory, not read from a directory); remove it, or use a dataset read from one: "
                          f"{', '.join(readers)}")
    if card.root:
        if config.data_root is None:
            raise ConfigError(f"dataset {config.dataset!r} is read from a local directory: pass root (config field "
                              "data_root, --data-root DIR); nothing is downloaded")
        if not Path(config.data_root).is_dir():
            what = "is not a directory" if Path(config.data_root).exists() else "does not exist"
            raise ConfigError(f"data_root = {config.data_root!r} {what}; it must be the directory that holds the "
                              f"{config.dataset} files")
    _check_partition(config)
    if config.partition == "natural":
        if card.natural is False:
            raise ConfigError(f"partition 'natural' needs a dataset with its own client split; dataset "
                              f"{config.dataset!r} has none (synthetic has): use iid, dirichlet, dirichlet-class, "
                              "shards or similarity")
        if "num_clients" in resolved and resolved["num_clients"] != config.clients:
            raise ConfigError(f"partition 'natural': the natural split of {config.dataset} has num_clients = "
                              f"{resolved['num_clients']} clients but clients = {config.clients}; set them equal "
                              "(or leave dataset_options num_clients out: it follows clients)")
    shape = card.shape(resolved) if card.shape is not None else None
    if shape is None:
        return None
    sizes = ", ".join(f"{k} = {resolved[k]:,}" for k in card.size_options if k in resolved)
    of = f"{config.dataset}{f' ({sizes})' if sizes else ''}"
    if config.partition != "natural" and config.clients > shape.train:
        raise ConfigError(f"clients = {config.clients:,} exceeds the {shape.train:,} training samples of {of}: every "
                          f"client needs at least one; use at most {shape.train:,} clients"
                          f"{' or raise ' + card.size_options[0] if sizes else ''}")
    free = limits.available_memory()
    if shape.nbytes > free:
        raise ConfigError(f"dataset_options: {of} needs ~{limits.gib(shape.nbytes)} of memory to load "
                          f"({shape.train + shape.test:,} samples of shape {shape.input_shape}), more than the "
                          f"{limits.gib(free)} available{'; lower ' + card.size_options[0] if sizes else ''}")
    return shape


def _check_partition(config: Config) -> None:
    PARTITIONS.require(config.partition, "partition")
    given = config.partition_options
    for key, field in FIELD_OPTIONS.items():
        if key in given:
            raise ConfigError(f"partition_options.{key} = {given[key]!r}: {key} is a Config field; set it once, as "
                              f"{field}, not in partition_options")
    if config.alpha is not None and config.partition not in DIRICHLET:
        raise ConfigError(f"alpha applies only to the dirichlet partitions ({', '.join(DIRICHLET)}), not to "
                          f"partition = {config.partition!r}; remove alpha")
    supplied = [key for key in dataset_supplied(config.partition) if key in given]
    if supplied:
        raise ConfigError(f"partition {config.partition!r} takes the {supplied[0]} from the dataset; do not pass "
                          f"option {supplied[0]}")
    try:  # each option against its declared range or choices: one line naming it and the allowed values
        check_option_values(config.partition, given)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        run_partition_options(config, check=True)
    except ValueError as exc:
        raise ConfigError(f"partition_options: {exc}") from None


def run_partition_options(config: Config, check: bool = False) -> dict[str, Any]:
    """The options the run passes to its partition.

    `partition_options`, with `alpha` for a Dirichlet partition (default 0.3). `check`: also that they are the
    partition's (unknown or missing ones: ValueError).
    """
    options = dict(config.partition_options)
    if config.partition in DIRICHLET:
        options["alpha"] = ALPHA_DEFAULT if config.alpha is None else config.alpha
    if check:
        check_partition_options(config.partition, options)
    return options


