"""`FederatedData`: the pooled train set, one index tensor per client, and the test set, as torch tensors.

This is what the engine consumes: schedules gather every client's minibatch from `train_x` through
`flat_indices()` (all clients' indices concatenated, computed once) in one indexing op. Client indices always
stay on the CPU (schedules are built there and the gathered row ids are moved to the data's device);
`to(device)` moves the x/y tensors. `client_indices` is treated as immutable after construction (assign a new
list, or build a new FederatedData, to change the split).

`split_local_test(f, seed)` cuts every client's data into a local train part (what `client_indices` then holds,
so training and its schedules see the reduced n_i) and a local test part (`local_test_indices`, rows of the same
pooled train set), stratified by label (`dfl.data.local_test`), for personalized evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from dfl.data.dataset import load_dataset
from dfl.data.local_test import check_fraction, stratified_split
from dfl.data.partitioners import label_histograms
from dfl.data.partitioners import partition as split_indices  # renamed: build() has arguments of these names
from dfl.data.partitioners import partition_options as method_options
from dfl.errors import DataError

AUGMENTATIONS = (None, "crop-flip")


@dataclass
class FederatedData:
    """A dataset split among clients: the pooled train and test sets and each client's rows of the train set."""

    train_x: torch.Tensor  # float [N, *input_shape], every client's training samples pooled
    train_y: torch.Tensor  # int64 [N]
    client_indices: list[torch.Tensor]  # int64 CPU tensors, client i's rows of train_x
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    input_shape: tuple[int, ...]
    augment: str | None = None  # None or "crop-flip" (dfl.data.augment)
    name: str = "arrays"
    partition_method: str | None = None
    partition_options: dict[str, Any] = field(default_factory=dict)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    # client i's local test set (rows of train_x, CPU), or None; set by split_local_test(fraction), which
    # also records the fraction
    local_test_indices: list[torch.Tensor] | None = None
    local_test_fraction: float = 0.0
    # (client_indices list it was built from, flat, offsets, sizes): see flat_indices()
    _flat: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(s) for s in self.input_shape)
        self.client_indices = [torch.as_tensor(i, dtype=torch.long).cpu().reshape(-1) for i in self.client_indices]
        if self.augment not in AUGMENTATIONS:
            raise DataError(f"augment must be one of {AUGMENTATIONS}, got {self.augment!r}")
        for which, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if tuple(x.shape[1:]) != self.input_shape:
                raise DataError(f"{which}_x has sample shape {list(x.shape[1:])}, expected {list(self.input_shape)}")
            if y.dim() != 1 or y.shape[0] != x.shape[0]:
                raise DataError(f"{which}_y must be [{x.shape[0]}], got {list(y.shape)}")
        if not self.client_indices:
            raise DataError("client_indices must hold at least one client")
        n = self.train_x.shape[0]
        flat, offsets, sizes = self.flat_indices()  # validated in bulk: no per-client tensor ops at 100k clients
        empty = (sizes == 0).nonzero()
        if empty.numel():
            raise DataError(f"client {int(empty[0])} has no samples; every client needs at least 1")
        bad = ((flat < 0) | (flat >= n)).nonzero()
        if bad.numel():
            client = int(torch.searchsorted(offsets, bad[0], right=True)) - 1
            raise DataError(f"client {client} has indices outside [0, {n - 1}]")
        if self.local_test_indices is not None:
            self.local_test_indices = [torch.as_tensor(i, dtype=torch.long).cpu().reshape(-1)
                                       for i in self.local_test_indices]
            if len(self.local_test_indices) != self.num_clients:
                raise DataError(f"local_test_indices must hold one index tensor per client ({self.num_clients}), "
                                f"got {len(self.local_test_indices)}")
            flat = torch.cat(self.local_test_indices)
            test_sizes = _sizes_of(self.local_test_indices)
            if (test_sizes == 0).any():
                raise DataError(f"client {int((test_sizes == 0).nonzero()[0])} has an empty local test set")
            if ((flat < 0) | (flat >= n)).any():
                raise DataError(f"local_test_indices hold indices outside [0, {n - 1}]")

    # ------------------------------------------------------------------ views
    @property
    def num_clients(self) -> int:
        """The number of clients m."""
        return len(self.client_indices)

    @property
    def sizes(self) -> torch.Tensor:
        """n_i, int64 [m]."""
        return self.flat_indices()[2].clone()

    @property
    def local_test_sizes(self) -> torch.Tensor | None:
        """Client i's local test set size, int64 [m]; None without local test sets."""
        return None if self.local_test_indices is None else _sizes_of(self.local_test_indices)

    def label_histograms(self) -> np.ndarray:
        """int64 [m, num_classes]: samples of each class per client."""
        return label_histograms(self.train_y, self.client_indices, self.num_classes)

    def flat_indices(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every client's train indices, flat, with where each client starts and how many it has.

        (flat LongTensor [Σ n_i]: every client's indices concatenated in client order; offsets LongTensor [m]:
        where client i starts in flat; sizes LongTensor [m]), on the CPU. Computed once per `client_indices`
        list and cached; treat the returned tensors as read-only.
        """
        cached = self._flat
        if cached is None or cached[0] is not self.client_indices or len(cached[3]) != len(self.client_indices):
            parts = self.client_indices
            sizes = torch.tensor([i.numel() for i in parts], dtype=torch.long)
            flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
            offsets = torch.cumsum(sizes, 0) - sizes
            cached = self._flat = (parts, flat, offsets, sizes)
        return cached[1], cached[2], cached[3]

    def padded_indices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(LongTensor [m, max n_i], rows padded with 0; LongTensor sizes [m]), both on the CPU.

        Materializes [m, max n_i]: with a skewed split this is much larger than the data; the schedules use
        `flat_indices()` instead.
        """
        flat, _, sizes = self.flat_indices()
        padded = torch.zeros(self.num_clients, int(sizes.max()), dtype=torch.long)
        padded[torch.arange(padded.shape[1]) < sizes[:, None]] = flat  # row-major mask order = client order
        return padded, sizes.clone()

    def partition_info(self) -> dict[str, Any]:
        """JSON-serialisable description of the split, written to the run's partition.json.

        With local test sets, `sizes` and `label_histograms` describe the local train parts, and
        `local_test_fraction`, `local_test_sizes` and `local_test_label_histograms` the local test parts.
        """
        local = {} if self.local_test_indices is None else {
            "local_test_fraction": self.local_test_fraction,
            "local_test_sizes": _sizes_of(self.local_test_indices).tolist(),
            "local_test_label_histograms": label_histograms(self.train_y, self.local_test_indices,
                                                            self.num_classes).tolist(),
        }
        return _jsonable({
            "dataset": self.name,
            "dataset_options": self.dataset_options,
            "method": self.partition_method,
            "options": self.partition_options,
            "num_clients": self.num_clients,
            "num_classes": self.num_classes,
            "num_train": int(self.train_x.shape[0]),
            "num_test": int(self.test_x.shape[0]),
            "sizes": self.sizes.tolist(),
            "label_histograms": self.label_histograms().tolist(),
            **local,
        })

    def split_local_test(self, fraction: float, seed: int) -> FederatedData:
        """A copy whose clients keep a local train part and hold out a local test part of their data.

        Fraction f of each client's samples, stratified by label (`dfl.data.local_test` has the rounding rules:
        every client keeps >= 1 training and gets >= 1 test sample; ValueError for a client with < 2 samples).
        Deterministic in (the split, f, seed); the pooled arrays are shared, not copied.
        """
        fraction = check_fraction(fraction)
        if self.local_test_indices is not None:
            raise DataError(f"the data already has local test sets (local_test_fraction = "
                            f"{self.local_test_fraction}); split the unsplit data once")
        flat, _, sizes = self.flat_indices()
        mask = torch.from_numpy(stratified_split(self.train_y.cpu().numpy(), flat.numpy(), sizes.numpy(),
                                                 fraction, seed))
        owner = torch.repeat_interleave(torch.arange(self.num_clients), sizes)
        test_sizes = torch.bincount(owner[mask], minlength=self.num_clients)
        return replace(self, client_indices=list(torch.split(flat[~mask], (sizes - test_sizes).tolist())),
                       local_test_indices=list(torch.split(flat[mask], test_sizes.tolist())),
                       local_test_fraction=fraction)

    def to(self, device: str | torch.device) -> FederatedData:
        """A copy whose x/y tensors live on `device` (client indices stay on the CPU)."""
        return replace(self, train_x=self.train_x.to(device), train_y=self.train_y.to(device),
                       test_x=self.test_x.to(device), test_y=self.test_y.to(device))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def build(cls, dataset: str, num_clients: int, partition: str, *, seed: int, root: str | None = None,
              dataset_options: dict[str, Any] | None = None,
              partition_options: dict[str, Any] | None = None) -> FederatedData:
        """Load `dataset` and split its train set among `num_clients` clients with `partition` (seeded by `seed`).

        For `synthetic` the dataset's own num_clients defaults to `num_clients`. Only `synthetic` supports the
        `natural` partition; with any other partition its train set is pooled and re-split.
        """
        dataset_options = dict(dataset_options or {})
        popts = dict(partition_options or {})
        if dataset == "synthetic":
            dataset_options.setdefault("num_clients", num_clients)
        method_options(partition)  # validates the method name before loading anything
        if partition == "natural" and "split" in popts:
            raise DataError("partition 'natural' takes the split from the dataset; do not pass option split")
        ds = load_dataset(dataset, root, **dataset_options)
        if partition == "natural":
            if ds.natural_split is None:
                raise DataError(f"partition 'natural' needs a dataset with its own client split; only synthetic has "
                                f"one, dataset {dataset!r} does not: use iid, dirichlet, dirichlet-class, shards or "
                                "similarity")
            parts = split_indices(ds.train_y, num_clients, "natural", seed=seed, split=ds.natural_split)
            recorded: dict[str, Any] = {}
        else:
            parts = split_indices(ds.train_y, num_clients, partition, seed=seed, **popts)
            recorded = {**method_options(partition), **popts}
        return cls(
            train_x=ds.train_x, train_y=ds.train_y,
            client_indices=[torch.from_numpy(p) for p in parts],
            test_x=ds.test_x, test_y=ds.test_y,
            num_classes=ds.num_classes, input_shape=ds.input_shape, augment=ds.augment, name=ds.name,
            partition_method=partition, partition_options={**recorded, "seed": seed},
            dataset_options=ds.options,
        )

    @classmethod
    def from_arrays(cls, train: list[tuple[Any, Any]], test: tuple[Any, Any], num_classes: int | None = None,
                    name: str = "arrays", augment: str | None = None) -> FederatedData:
        """Users' own data: `train` holds one (x_i, y_i) pair per client, `test` one (x, y) pair (numpy or torch).

        x arrays are real-valued [n, *input_shape] with the same input_shape everywhere; y arrays are integer
        class ids [n] in [0, num_classes) (num_classes defaults to the largest label + 1). Clients keep
        their data as given; the pooled train set is their concatenation in client order.
        """
        if isinstance(train, tuple) and len(train) == 2 and not isinstance(train[0], (tuple, list)):
            raise DataError("train must be a list of (x, y) pairs, one per client, not a single (x, y) pair")
        if not isinstance(train, (list, tuple)) or len(train) == 0:
            raise DataError("train must be a non-empty list of (x, y) pairs, one per client")
        xs, ys = [], []
        for i, pair in enumerate(train):
            x, y = _pair(f"train[{i}]", pair)
            xs.append(x)
            ys.append(y)
        tx, ty = _pair("test", test)
        shape = xs[0].shape[1:]
        for where, x in [*((f"train[{i}]", x) for i, x in enumerate(xs)), ("test", tx)]:
            if x.shape[1:] != shape:
                raise DataError(f"{where} x has sample shape {list(x.shape[1:])} but train[0] has {list(shape)}; "
                                "every x must share the same input shape")
        top = max(int(y.max()) for y in [*ys, ty] if y.numel()) + 1
        if num_classes is None:
            num_classes = top
        elif isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise DataError(f"num_classes must be a positive int, got {num_classes!r}")
        elif top > num_classes:
            raise DataError(f"labels go up to {top - 1} but num_classes={num_classes}; labels must be in "
                            f"[0, {num_classes - 1}]")
        if augment == "crop-flip" and len(shape) != 3:
            raise DataError(f"augment='crop-flip' needs image inputs [C, H, W], got input shape {list(shape)}")
        offsets = np.cumsum([0] + [x.shape[0] for x in xs])
        return cls(
            train_x=torch.cat(xs), train_y=torch.cat(ys),
            client_indices=[torch.arange(offsets[i], offsets[i + 1]) for i in range(len(xs))],
            test_x=tx, test_y=ty, num_classes=int(num_classes), input_shape=tuple(shape), augment=augment,
            name=name, partition_method="given",
        )


def _pair(where: str, pair: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise DataError(f"{where} must be an (x, y) pair")
    x, y = (_tensor(v) for v in pair)
    if x.dtype == torch.bool or x.is_complex() or not (x.is_floating_point() or _is_int(x.dtype)):
        raise DataError(f"{where} x must be real-valued (float or int), got {x.dtype}")
    if x.dim() < 2 or x.shape[0] < 1:
        raise DataError(f"{where} x must be [n, *input_shape] with n >= 1, got shape {list(x.shape)}")
    if not _is_int(y.dtype):
        raise DataError(f"{where} y must hold integer class ids, got dtype {y.dtype}; cast it, e.g. y.astype(int)")
    if y.dim() != 1 or y.shape[0] != x.shape[0]:
        raise DataError(f"{where} y must be 1-D with one label per sample of x ({x.shape[0]}), got shape "
                        f"{list(y.shape)}")
    if int(y.min()) < 0:
        raise DataError(f"{where} y has negative label {int(y.min())}; labels must be >= 0")
    x = x.to(torch.float32)
    if not torch.isfinite(x).all():
        raise DataError(f"{where} x contains NaN or inf")
    return x, y.to(torch.int64)


def _tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    arr = np.asarray(value)
    if arr.dtype == object:
        raise DataError(f"expected a numeric array, got an object array of shape {list(arr.shape)}")
    return torch.from_numpy(np.ascontiguousarray(arr))


def _is_int(dtype: torch.dtype) -> bool:
    return dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.generic, torch.Tensor, np.ndarray)):
        return _jsonable(value.tolist())
    return value


def _sizes_of(indices: list[torch.Tensor]) -> torch.Tensor:
    """int64 [m]: the number of indices of each client."""
    return torch.tensor([i.numel() for i in indices], dtype=torch.long)
