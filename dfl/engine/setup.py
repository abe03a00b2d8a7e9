"""Setting a run up from its config.

The device, the data, the topology and the algorithm (synchronous rounds or the asynchronous mode), each built the one
way every run, sweep and command builds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import topologies
from dfl import graphs as topology_registry
from dfl.algorithms import algorithm_class, is_centralized, mixes_by_push_sum
from dfl.config import Config
from dfl.data import FederatedData, run_partition_options
from dfl.errors import ConfigError

# (x, y): samples and their labels
Pair = tuple[torch.Tensor, torch.Tensor]
# (pooled train x, train y, (index, offsets, sizes)): clients' local test sets (`local_test_sets`)
LocalTest = tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def resolve_device(name: str) -> torch.device:
    """The torch device of `config.device`: "auto" is CUDA when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} requested but CUDA is not available; use device = 'cpu' or 'auto'")
    return torch.device(name)


def build_topology(config: Config, n: int, sizes: Sequence[int] | None = None):
    """The topology a run mixes with.

    The complete graph for a centralized algorithm (the configured graph plays no part), else the configured
    topology on n clients (a built-in or a registered one). Sample-count weights (da-dpfl's w_ij ∝ n_j) take
    `sizes`, the clients' training-sample counts, unless the topology's options give their own.
    """
    if is_centralized(config.algorithm):
        return topologies.build("full", n)
    options = topology_registry.run_options(config)  # random graphs follow the run's seed unless options set one
    if config.weights == "sample-count" and "sizes" not in options:  # `dfl.graphs.RUN_FILLED` (dfl list)
        if sizes is None:
            raise ConfigError("weights = sample-count needs the clients' sample counts: topology_options sizes = "
                              "[n_1, ..., n_m], one per client, or a run, which passes its partition's")
        options["sizes"] = [int(size) for size in sizes]
    try:
        return topology_registry.build(config.topology, n, config.weights,
                                       push_sum=mixes_by_push_sum(config.algorithm), **options)
    except ValueError as exc:
        raise ConfigError(f"topology: {exc}") from exc


def build_data(config: Config) -> FederatedData:
    """The run's dataset, split among its clients.

    `config.partition` deals it to `config.clients` clients, seeded by `config.seed` (Dirichlet partitions take
    `alpha`, default 0.3: `dfl.data.run_partition_options`).
    """
    return FederatedData.build(
        config.dataset,
        config.clients,
        config.partition,
        seed=config.seed,
        root=config.data_root,
        dataset_options=dict(config.dataset_options),
        partition_options=run_partition_options(config),
    )


def make_algorithm(config: Config, ctx, X0: torch.Tensor, topology):
    """The algorithm a run steps through, round by round.

    The configured one in lock-step rounds, or, with `mode = "async"`, every client on its own clock
    (`dfl.engine.asynchronous.AsyncGossip`). Both answer `round(t)`, `state()` and `metrics()`, so the round loop
    does not branch on the mode.
    """
    if config.mode == "async":
        from dfl.engine.asynchronous import AsyncGossip

        return AsyncGossip(ctx, X0.clone(), topology)
    return algorithm_class(config.algorithm)(ctx, X0.clone())


def gossip_lambda(topology, steps: int) -> float:
    """‖W^Q − J‖₂ (static) or the contraction of Q steps from step 0 (time-varying)."""
    return float(topology.gossip_lambda(steps))


def train_subset(data, config: Config, samples: int | None = None) -> Pair | None:
    """A fixed (seeded) subset of the pooled training data: `train_eval_samples` or `samples` of them."""
    k = config.train_eval_samples if samples is None else samples
    return seeded_subset(data.train_x, data.train_y, k, config.seed) if k else None


def seeded_subset(x: torch.Tensor, y: torch.Tensor, k: int, seed: int) -> Pair:
    """The first min(k, n) samples of a permutation drawn from `seed`: the same subset on every process."""
    n = x.shape[0]
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: min(k, n)].to(x.device)
    return x[idx], y[idx]


def split_local_test(data, config: Config):
    """The data with each client's local test part held out when `local_test_fraction` > 0.

    The split is `FederatedData.split_local_test`, seeded by `seed`; the run does it, so config.toml reproduces it.
    """
    if data.local_test_indices is not None:
        raise ConfigError(f"the given data already has local test sets (local_test_fraction = "
                          f"{data.local_test_fraction}); pass it unsplit and set local_test_fraction instead")
    if not config.local_test_fraction:
        return data
    try:
        return data.split_local_test(config.local_test_fraction, config.seed)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def local_test_sets(data, client_ids: Sequence[int]) -> LocalTest:
    """(x, y, (index, offsets, sizes)) of the given clients' local test sets, on the data's device.

    The pooled train set, their rows of it concatenated in client order, where each client starts, how many it has
    (the arguments of `evaluate.local_accuracies`).
    """
    return _client_sets(data, [data.local_test_indices[i] for i in client_ids])


def local_train_sets(data, client_ids: Sequence[int]) -> LocalTest:
    """(x, y, (index, offsets, sizes)) of the given clients' training data (`personal_train_eval`).

    The same arrays as `local_test_sets` gives for the local test sets.
    """
    return _client_sets(data, [data.client_indices[i] for i in client_ids])


def _client_sets(data, parts: list[torch.Tensor]) -> LocalTest:
    sizes = torch.tensor([p.numel() for p in parts], dtype=torch.long)
    device = data.train_x.device
    local = torch.cat(parts).to(device), (torch.cumsum(sizes, 0) - sizes).to(device), sizes.to(device)
    return data.train_x, data.train_y, local
