"""`partition(labels, num_clients, method, *, seed, **options)`: split a train set's indices among clients.

Each built-in method is described once, below: its docstring says what it does, and its options class
(`DirichletOptions`, ...) declares each option's type, default, range and help, from which its docstring's option
lines, `dfl list partitions` and the options page's "Partition options" are generated.

Each method is a function registered in `PARTITIONS` (entry-point group `dfl.partitions`; add your own with
`@dfl.data.register_partition("name")`):

    f(labels, num_clients, rng, *, option=default, ...) -> one index array per client

labels: int64 [N]; rng: a numpy Generator seeded by `seed`; keyword-only parameters are the options. `partition`
checks the options and what comes back: every method returns one sorted int64 index array per client, in
[0, N), and every client gets at least one sample.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from dfl import signatures
from dfl.data.dirichlet import dirichlet_balanced, dirichlet_per_class, format_ids
from dfl.errors import DataError
from dfl.registry import Registry
from dfl.specs import REQUIRED, Param, Spec, checked, param

PARTITIONS: Registry = Registry("partition", group="dfl.partitions")
"""Every partition the config field `partition` takes: name -> method f(labels, num_clients, rng, *, options)."""
USAGE = "f(labels, num_clients, rng, *, option=default, ...) -> one index array per client"
# options a partition takes from the dataset, never from a config: the natural split (`Dataset.natural_split`)
FROM_DATASET = ("split",)
_REQUIRED_HINTS = {  # how to give a built-in's required option
    "similarity": "similarity=s with s in [0, 1]",
    "split": "split=<one index array per client>; only datasets with a natural client split (synthetic) provide one",
}
_HINTS = {  # what to change when a client is left empty
    "dirichlet": "raise alpha or use fewer clients",
    "dirichlet-class": "raise alpha or min_size, or use fewer clients",
    "shards": "use fewer clients or fewer classes_per_client",
    "pathological": "use fewer clients",
    "similarity": "use fewer clients",
    "natural": "fix the split",
    "iid": "use fewer clients",
}


SPECS: dict[str, type[Spec]] = {}
"""The option specs of the partitions that declare them (`dfl.specs`: type, default, allowed values, help): each
built-in's, given to `register(..., options=...)`; a plug-in without one is known by its signature's defaults."""


def register(name: str, fn: Any = None, *, replace: bool = False, options: type[Spec] | None = None) -> Any:
    """Register partition method `fn` as `name` (a decorator without `fn`); its signature is checked here.

    `options`: the spec of its keyword-only options (`dfl.specs.Spec`), declared once: the option lines of its
    docstring's "Args:" section, `dfl list partitions` and the options page are generated from it, and
    `dfl.validate` refuses a value outside it. Its names and defaults must be the signature's.
    """
    if fn is None:
        return lambda target: register(name, target, replace=replace, options=options)
    signatures.check("partition", name, fn, (3,), USAGE)
    try:
        spec = checked("partition", name, options, signatures.options(fn)) if options is not None else None
    except ValueError as exc:
        raise DataError(str(exc)) from None
    SPECS.pop(name, None)
    if spec is not None:
        SPECS[name] = spec
        args = "\n".join(line for line in spec.docstring_args().splitlines()[1:])
        if fn.__doc__ and args:
            fn.__doc__ = inspect.cleandoc(fn.__doc__) + "\n" + args
    return PARTITIONS.register(name, fn, replace=replace)


# an entry point's method: checked as `register` checks one, with the spec its `options` attribute declares
PARTITIONS.plugin = lambda name, fn: register(name, fn, options=getattr(fn, "options", None))


def partition_specs(method: str) -> tuple[Param, ...]:
    """The specs of the options a config gives `method` (none for a method registered without `options`)."""
    _method(method)
    spec = SPECS.get(method)
    return tuple(p for p in spec.specs() if p.name not in FROM_DATASET) if spec is not None else ()


def check_option_values(method: str, options: dict[str, Any]) -> None:
    """ValueError naming `partition_options.NAME` and the allowed values for a value outside its spec."""
    _method(method)
    spec = SPECS.get(method)
    if spec is not None:
        spec.check_values(options, "partition_options")


def _method(name: str) -> Any:
    fn = PARTITIONS.get(name)
    signatures.check("partition", name, fn, (3,), USAGE)  # entry points are not checked at registration
    return fn


def partition_options(method: str) -> dict[str, Any]:
    """The options a config gives `method` (`partition_options`), with their defaults ("required" for one without).

    Its keyword-only parameters, less those the dataset supplies (FROM_DATASET: natural's split), which a run passes
    itself and refuses from a config.
    """
    return {key: value for key, value in signatures.options(_method(method)).items() if key not in FROM_DATASET}


def dataset_supplied(method: str) -> list[str]:
    """The options of partition `method` that the dataset supplies (FROM_DATASET), in its signature's order."""
    return [key for key in signatures.options(_method(method)) if key in FROM_DATASET]


def check_partition_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options of partition `method`, checked and completed with their defaults.

    `options` checked against the options of `method` (unknown or missing ones: ValueError naming the allowed ones)
    and completed with their defaults, before any labels are split.
    """
    return signatures.resolve_declared("partition", method, partition_options(method), options, _REQUIRED_HINTS)


def _number(name: str, value: Any, *, low: float, high: float | None = None, low_open: bool = True) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and np.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        rng = f"{'(' if low_open else '['}{low}, {'inf)' if high is None else f'{high}]'}"
        raise DataError(f"{name} must be a number in {rng}, got {value!r}")
    return float(value)


def _integer(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def as_labels(labels: Any) -> np.ndarray:
    """Labels as a 1-D int64 numpy array of non-negative class ids (numpy, torch or a sequence)."""
    if hasattr(labels, "detach"):
        labels = labels.detach().cpu().numpy()
    arr = np.asarray(labels)
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer)) or arr.dtype == np.bool_:
        raise DataError(f"labels must be a 1-D integer array, got dtype {arr.dtype} and shape {list(arr.shape)}")
    if arr.size and arr.min() < 0:
        raise DataError(f"labels must be >= 0, found {int(arr.min())}")
    return arr.astype(np.int64, copy=False)


def partition(labels: Any, num_clients: int, method: str, *, seed: int, **options: Any) -> list[np.ndarray]:
    """Split indices 0..N-1 of `labels` among `num_clients` clients by `method` (see the module docstring)."""
    labels = as_labels(labels)
    fn = _method(method)
    opts = signatures.resolve("partition", method, fn, options, _REQUIRED_HINTS)
    num_clients = _integer("num_clients", num_clients, 1)
    seed = _integer("seed", seed, 0)
    n = labels.shape[0]
    if num_clients > n:
        raise DataError(f"num_clients={num_clients} exceeds the {n} training samples; use at most {n} clients")
    parts = fn(labels, num_clients, np.random.default_rng(seed), **opts)
    return _checked(parts, method, num_clients, n)


def _checked(parts: Any, method: str, num_clients: int, n: int) -> list[np.ndarray]:
    """What a method returned, as sorted int64 arrays: one per client, indices in [0, n), none empty."""
    if not isinstance(parts, (list, tuple)) or len(parts) != num_clients:
        got = f"{len(parts)} arrays" if isinstance(parts, (list, tuple)) else type(parts).__name__
        raise DataError(f"partition {method!r} must return a list of {num_clients} index arrays (one per "
                        f"client), got {got}")
    out = []
    for i, p in enumerate(parts):
        arr = np.asarray(p.detach().cpu().numpy() if hasattr(p, "detach") else p)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise DataError(f"partition {method!r} gave client {i} indices of dtype {arr.dtype} and shape "
                            f"{list(arr.shape)}; each client needs a 1-D integer array")
        out.append(np.sort(arr.astype(np.int64, copy=False)))
    sizes = np.array([p.size for p in out])
    flat = np.concatenate(out)
    outside = np.flatnonzero((flat < 0) | (flat >= n))
    if outside.size:
        client = int(np.searchsorted(np.cumsum(sizes), outside[0], side="right"))
        raise DataError(f"partition {method!r} gave client {client} index {int(flat[outside[0]])}, outside the "
                        f"train set's [0, {n - 1}]")
    empty = np.flatnonzero(sizes == 0)
    if empty.size:
        raise DataError(f"partition {method!r} leaves client(s) {format_ids(empty)} with 0 samples; every client needs "
                        f"at least 1: {_HINTS.get(method, 'change the partition or use fewer clients')}")
    return out


# ------------------------------------------------------------------------------------------------ the methods
@register("iid", options=Spec)
def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """IID: a random permutation of the train set cut into m near-equal parts.

    Every client's data follows the pooled distribution; sizes differ by at most one sample.

    Args:
        labels: the train set's labels, int64 [N].
        num_clients: the number of clients m.
        rng: the generator seeded by the run's seed.
    """
    return np.array_split(rng.permutation(labels.shape[0]), num_clients)


@dataclass(frozen=True)
class DirichletOptions(Spec):
    """The options of partition dirichlet."""

    alpha: float = param(0.3, "the concentration α (the config field `alpha`)", interval="(0, inf)")
    sigma: float = param(0.0, "the spread of log-normal client sizes; 0 gives equal sizes", interval="[0, inf)")


@register("dirichlet", options=DirichletOptions)
def dirichlet(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, alpha: float = 0.3,
              sigma: float = 0.0) -> list[np.ndarray]:
    """Dirichlet: label skew with balanced sizes, each client's class mix drawn from Dir(α) (Hsu et al., FedDyn).

    Hsu, Qi & Brown, "Measuring the effects of non-identical data distribution for federated visual
    classification", 2019; the sampler of FedDyn's code (docs/reference/update-rules.md#dirichlet-partition).
    Client i's prior is q_i ~ Dir(α 1_C); until every client is full, a non-full client i is picked uniformly and
    given one sample of a class c ~ q_i among the classes not yet exhausted. A small α gives each client few
    classes; α → ∞ tends to IID.

    Args:
        labels: the train set's labels, int64 [N].
        num_clients: the number of clients m.
        rng: the generator seeded by the run's seed.
    """
    alpha = _number("alpha", alpha, low=0.0)
    sigma = _number("sigma", sigma, low=0.0, low_open=False)
    return dirichlet_balanced(labels, num_clients, alpha, sigma, rng)


@dataclass(frozen=True)
class DirichletClassOptions(Spec):
    """The options of partition dirichlet-class."""

    alpha: float = param(0.3, "the concentration α (the config field `alpha`)", interval="(0, inf)")
    min_size: int = param(10, "the samples every client must hold", interval="[1, inf)")
    max_retries: int = param(10, "how many times the draw is repeated before giving up", interval="[0, inf)")
    self_balancing: bool = param(False, "give no more of the next classes to clients that already hold N/m samples")


@register("dirichlet-class", options=DirichletClassOptions)
def dirichlet_class(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, alpha: float = 0.3,
                    min_size: int = 10, max_retries: int = 10, self_balancing: bool = False) -> list[np.ndarray]:
    """Dirichlet per class: each class split over the clients by p ~ Dir(α) (Flower's DirichletPartitioner).

    Yurochkin et al., ICML 2019 and NIID-Bench (Li, Diao, Chen & He, ICDE 2022): for every class c the shuffled
    samples of c are cut at ⌊cumsum(p)·n_c⌋ with p ~ Dir(α 1_m), so both the labels and the sizes are skewed.
    The whole draw is repeated until every client holds `min_size` samples.

    Args:
        labels: the train set's labels, int64 [N].
        num_clients: the number of clients m.
        rng: the generator seeded by the run's seed.
    """
    alpha = _number("alpha", alpha, low=0.0)
    min_size = _integer("min_size", min_size, 1)
    max_retries = _integer("max_retries", max_retries, 0)
    if not isinstance(self_balancing, (bool, np.bool_)):
        raise DataError(f"self_balancing must be true or false, got {self_balancing!r}")
    n = labels.shape[0]
    if min_size * num_clients > n:
        raise DataError(f"min_size={min_size} x num_clients={num_clients} exceeds the {n} training samples; "
                        "lower min_size or use fewer clients")
    return dirichlet_per_class(labels, num_clients, alpha, min_size, max_retries, bool(self_balancing), rng)


@dataclass(frozen=True)
class ShardsOptions(Spec):
    """The options of partition shards."""

    classes_per_client: int = param(2, "the shards k of every client (at most k labels each)", interval="[1, inf)")


@register("shards", options=ShardsOptions)
def shards(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *,
           classes_per_client: int = 2) -> list[np.ndarray]:
    """Shards: the train set sorted by label and cut into m·k shards, k per client (McMahan et al.).

    McMahan et al., AISTATS 2017, the pathological non-IID split: sort by label (random order within a class), cut
    into m*k shards, give each client k random shards. Shards are cut inside classes (class c gets shards in
    proportion to its size, at least one each, greedily giving the next shard to the class with the largest shards),
    so a client holds at most k labels and k = 1 is exactly one label per client. When m*k is smaller than the
    number of classes, the sorted array is cut into m*k equal contiguous pieces instead.

    Args:
        labels: the train set's labels, int64 [N].
        num_clients: the number of clients m.
        rng: the generator seeded by the run's seed.
    """
    k = _integer("classes_per_client", classes_per_client, 1)
    n = labels.shape[0]
    total = num_clients * k
    if total > n:
        raise DataError(f"shards: num_clients * classes_per_client = {num_clients} * {k} = {total} exceeds the {n} "
                        "training samples; lower classes_per_client or use fewer clients")
    perm = rng.permutation(n)
    ordered = perm[np.argsort(labels[perm], kind="stable")]
    classes, counts = np.unique(labels, return_counts=True)
    if total < classes.size:
        pieces = np.array_split(ordered, total)
    else:
        per_class = np.ones(classes.size, dtype=np.int64)
        for _ in range(total - classes.size):
            per_class[np.argmax(counts / per_class)] += 1
        pieces = []
        for block, s in zip(np.split(ordered, np.cumsum(counts)[:-1]), per_class):
            pieces.extend(np.array_split(block, s))
    assignment = rng.permutation(total).reshape(num_clients, k)
    return [np.concatenate([pieces[s] for s in row]) for row in assignment]


@dataclass(frozen=True)
class PathologicalOptions(Spec):
    """The options of partition pathological."""

    classes_per_client: int = param(2, "the classes k of every client, at most the number of classes",
                                    interval="[1, inf)")


@register("pathological", options=PathologicalOptions)
def pathological(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *,
                 classes_per_client: int = 2) -> list[np.ndarray]:
    """Pathological: every client draws k distinct classes and holds them in about equal shares, equal sizes (DisPFL).

    The `n_cls` split of DisPFL's code (Dai et al., ICML 2022; rong-dai/DisPFL, the code base of the DFedSAM paper;
    docs/reference/update-rules.md#pathological-partition). Client i draws k distinct classes uniformly at random
    and holds n = ⌊N/m⌋ samples, each of a class drawn uniformly among its k, so its class counts are
    Multinomial(n, 1/k). A class asked for more samples than it has (more clients chose it than its size carries)
    gives each of its clients a share of its samples in proportion to what the client asked for, and the client's
    rest are samples of that class drawn at random among those not already its own: as in the code, some samples
    are then held by two clients, never twice by one. Unlike `shards`, a client has k classes (fewer only when a
    Multinomial draw leaves one of them empty, which takes clients of a few samples), never a repeated one (k
    random shards of a sorted set can repeat a class: about 4.1 distinct classes for k = 5 of 10) and every client
    has the same size; unlike the code, which restarts an exhausted class at a random point of its pool, the
    reused samples are spread over the class's clients.

    Args:
        labels: the train set's labels, int64 [N].
        num_clients: the number of clients m.
        rng: the generator seeded by the run's seed.
    """
    k = _integer("classes_per_client", classes_per_client, 1)
    classes = np.unique(labels)
    if k > classes.size:
        raise DataError(f"pathological: classes_per_client = {k} exceeds the {classes.size} classes of the train "
                        f"set; use classes_per_client <= {classes.size}")
    n = labels.shape[0] // num_clients
    if n < 1:
        raise DataError(f"pathological: {labels.shape[0]} training samples cannot give each of {num_clients} "
                        "clients one; use fewer clients")
    chosen = classes[np.argsort(rng.random((num_clients, classes.size)), axis=1)[:, :k]]  # k distinct per client
    counts = rng.multinomial(n, np.full(k, 1.0 / k), size=num_clients)  # [m, k]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in classes:
        holders, slot = np.nonzero(chosen == c)
        if holders.size == 0:
            continue
        want = counts[holders, slot]
        pool = rng.permutation(np.flatnonzero(labels == c))
        if want.max(initial=0) > pool.size:
            worst = int(holders[np.argmax(want)])
            raise DataError(f"pathological: client {worst} needs {int(want.max())} samples of class {int(c)}, "
                            f"which has {pool.size}; use more clients or a larger classes_per_client")
        fresh = _apportion(want, min(pool.size, int(want.sum())), rng)
        starts = np.cumsum(fresh) - fresh
        for client, asked, given, start in zip(holders, want, fresh, starts):
            own = pool[start:start + given]
            if asked > given:  # the class is exhausted: reuse samples this client does not hold yet
                others = np.concatenate([pool[:start], pool[start + given:]])
                own = np.concatenate([own, rng.choice(others, asked - given, replace=False)])
            parts[client].append(own)
    return [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]


def _apportion(weights: np.ndarray, total: int, rng: np.random.Generator) -> np.ndarray:
    """Integers proportional to `weights` that sum to `total` (largest remainder, ties broken at random)."""
    whole = int(weights.sum())
    if total >= whole:
        return weights.copy()
    base, rem = np.divmod(weights * total, whole)
    order = np.lexsort((rng.random(weights.size), -rem))  # largest remainder first
    base[order[: total - int(base.sum())]] += 1
    return base


@dataclass(frozen=True)
class SimilarityOptions(Spec):
    """The options of partition similarity."""

    similarity: float = param(REQUIRED, "the share s dealt IID (1: IID, 0: fully sorted)", interval="[0, 1]")


@register("similarity", options=SimilarityOptions)
def similarity(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *,
               similarity: float) -> list[np.ndarray]:
    """Similarity: SCAFFOLD's split, a share s of the data dealt IID and the rest sorted by label.

    Karimireddy et al., "SCAFFOLD", ICML 2020, Sec. 7 (docs/reference/update-rules.md#similarity-partition): a
    random floor(s N) subset is dealt evenly at random, the rest is sorted by label and cut into m contiguous
    chunks; client i gets iid chunk i and sorted chunk i. The iid chunks are dealt in reverse order, so the clients
    that miss a remainder sample of one part get one of the other: no client is empty when N >= m.

    Args:
        labels: the train set's labels, int64 [N].
        num_clients: the number of clients m.
        rng: the generator seeded by the run's seed.
    """
    s = _number("similarity", similarity, low=0.0, high=1.0, low_open=False)
    n = labels.shape[0]
    perm = rng.permutation(n)
    n_iid = int(np.floor(s * n))
    dealt, rest = perm[:n_iid], perm[n_iid:]
    sorted_rest = rest[np.argsort(labels[rest], kind="stable")]
    iid_chunks = np.array_split(dealt, num_clients)[::-1]
    sorted_chunks = np.array_split(sorted_rest, num_clients)
    return [np.concatenate([a, b]) for a, b in zip(iid_chunks, sorted_chunks)]


@dataclass(frozen=True)
class NaturalOptions(Spec):
    """The options of partition natural."""

    split: Any = param(REQUIRED, "one index array per client, supplied by the dataset (synthetic), never by a config")


@register("natural", options=NaturalOptions)
def natural(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, split: Any) -> list[np.ndarray]:
    """Natural: a dataset's own per-client split (synthetic's clients), checked and used as it is.

    The split must hold m disjoint index arrays into the train set.

    Args:
        labels: the train set's labels, int64 [N].
        num_clients: the number of clients m.
        rng: the generator seeded by the run's seed.
    """
    n = labels.shape[0]
    if isinstance(split, (str, bytes)) or not hasattr(split, "__len__"):
        raise DataError("split must be a list with one index array per client")
    if len(split) != num_clients:
        raise DataError(f"the natural split has {len(split)} clients but num_clients={num_clients}; use "
                        f"num_clients={len(split)} (for synthetic, the dataset option num_clients sets it)")
    parts = [as_labels(p).copy() for p in split]
    flat = np.concatenate(parts) if parts else np.empty(0, np.int64)
    if flat.size and flat.max() >= n:
        raise DataError(f"split holds index {int(flat.max())} but the train set has {n} samples")
    if np.unique(flat).size != flat.size:
        raise DataError("split must give every sample to at most one client (found an index twice)")
    return parts


def label_histograms(labels: Any, parts: list[Any], num_classes: int | None = None) -> np.ndarray:
    """counts[i, c] = number of samples of class c held by client i; int64 [num_clients, num_classes]."""
    labels = as_labels(labels)
    top = int(labels.max()) + 1 if labels.size else 0
    if num_classes is None:
        num_classes = top
    elif top > num_classes:
        raise DataError(f"labels go up to {top - 1} but num_classes={num_classes}")
    out = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        p = p.detach().cpu().numpy() if hasattr(p, "detach") else np.asarray(p, dtype=np.int64)
        out[i] = np.bincount(labels[p], minlength=num_classes)[:num_classes]
    return out
