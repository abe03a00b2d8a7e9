"""Setting a run up from its config: the steps `dfl.engine.experiment.Experiment` calls, one job each, in order.

checkpoint to resume → hyperparameters → device → data → topology → network → model → client block → trainer →
(gossip, algorithm: `Context`, `make_algorithm`) → client chunk. Each step checks what it builds, so a bad run fails
here, before the first round, with the message of the step that found it.

Below the steps, the builders every run, sweep and command shares, each the one way it is built: the device
(`resolve_device`), the data (`build_data`, `split_local_test`), the topology (`build_topology`), and the fixed
evaluation subsets (`train_subset`, `local_test_sets`, `local_train_sets`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import topologies
from dfl import graphs as topology_registry
from dfl.algorithms import (
    Hyperparameters,
    algorithm_class,
    card,
    is_centralized,
    mixes_by_push_sum,
    resolve_hyperparameters,
)
from dfl.algorithms.base import EngineCommunicator
from dfl.algorithms.server import sample_participants
from dfl.config import Config
from dfl.data import FederatedData, data_shape, run_partition_options
from dfl.data.dataset import with_clients
from dfl.engine import checkpoint as ckpt
from dfl.errors import ConfigError
from dfl.models import build_model, model_for_run
from dfl.network import byzantine_settings
from dfl.network.run_network import Network
from dfl.training import memory
from dfl.training.clients import ParamLayout, common_start
from dfl.training.local import LocalTrainer
from topologies import Topology

# (x, y): samples and their labels
Pair = tuple[torch.Tensor, torch.Tensor]
# (pooled train x, train y, (index, offsets, sizes)): clients' local test sets (`local_test_sets`)
LocalTest = tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def checkpoint_to_resume(config: Config, out: str | Path | None, resume: bool) -> dict[str, Any] | None:
    """The checkpoint a resumed run continues from, checked against the config; None for a fresh run.

    Called before any work, so a missing checkpoint or a changed config fails fast, on every rank alike.
    """
    if not resume:
        return None
    if out is None:
        raise ConfigError("resume=True needs out= (the run directory holding checkpoint.pt)")
    saved = ckpt.load(out)
    ckpt.check_config(saved, config, out)
    return saved


def hyperparameters(config: Config) -> Hyperparameters:
    """The algorithm's resolved hyperparameters (a set field it does not read was refused by `dfl.validate`)."""
    return resolve_hyperparameters(config)


def device(config: Config, comm: EngineCommunicator) -> torch.device:
    """The run's device (the communicator's, under torchrun), checked against `precision`.

    On the CPU freed heap is kept for reuse instead of zero-filled fresh mappings every round. precision = tf32
    turns TF32 matmuls and convolutions on while the rounds go (`Experiment.status`, `dfl.models.kernels`) and needs
    CUDA; fp32 and bf16 turn TF32 off for fp32 products then; gossip averages in IEEE fp32 either way
    (`dfl.network.gossip.exact_matmul`). The caller's settings are put back when the run ends.
    """
    dev = comm.device or resolve_device(config.device)
    if dev.type == "cpu":
        memory.keep_freed_memory()
    if config.precision == "tf32" and dev.type != "cuda":
        raise ConfigError(f"precision = tf32 needs a CUDA device (the run is on {dev}); use fp32 or bf16")
    return dev


def data_on_device(config: Config, data: FederatedData | None, comm, dev: torch.device) -> FederatedData:
    """The run's data (built from the config, or the given data checked), local test parts held out, on `dev`.

    The local test split comes before the trainer: training sees only the local train parts.
    """
    if data is None:
        data = build_data(config)
    elif data.num_clients != config.clients:
        raise ConfigError(f"clients = {config.clients} but the given data has {data.num_clients} clients")
    data = split_local_test(data, config)
    if comm.num_clients != data.num_clients:
        raise ConfigError(f"the communicator hosts {comm.num_clients} clients but the data has {data.num_clients}")
    return data.to(dev)


def topology(config: Config, data: FederatedData) -> Topology:
    """The graph the run mixes with (`build_topology`; the complete graph for a centralized one)."""
    return build_topology(config, data.num_clients, data.sizes.tolist())


def network(config: Config, graph: Topology, data: FederatedData, hp: Hyperparameters) -> Network:
    """The unreliable network (link failures, offline clients, stragglers, compressed gossip) over `graph`.

    For a centralized algorithm, stragglers and the deadline apply to the clients the server samples in round t.
    """
    participants = None
    if is_centralized(config.algorithm):
        m = data.num_clients

        def participants(t: int) -> np.ndarray:
            return sample_participants(config.seed, t, m, hp.get("participation", 1.0),
                                       hp.get("participation_mode", "uniform"))

    return Network(config, graph, data, participants)


def model(config: Config, data: FederatedData, dev: torch.device, given: Any = None) -> tuple[nn.Module, ParamLayout]:
    """The template model and its flat parameter layout.

    The template model (seeded, built or the given one copied, on `dev`, in train mode, checked on two samples) and
    its flat parameter layout: a model that cannot run fails here, not in a round.
    """
    net = model_for_run(config.model, config.model_options, tuple(data.input_shape), data.num_classes,
                        config.seed, dev, (data.train_x[:2], data.train_y[:2]), given)
    return net, ParamLayout.of(net)


def stacks_fit_before_data(config: Config, comm, dev: torch.device, data: FederatedData | None, given: Any) -> None:
    """Refuse, before any data is made, a run whose client stacks would not fit (`memory.check_stacks`).

    The dataset's card gives its shape (`dfl.data.data_shape`) and the model, built on the meta device (no memory),
    its parameter count, so a run of 200,000 clients that cannot hold its stacks is refused at once rather than after
    minutes of data generation. Skipped where the config alone does not say (data or a model given, a dataset or
    factory without a card); `client_block` checks again with the real model.
    """
    if data is not None or given is not None:
        return
    try:
        shape = data_shape(config.dataset, with_clients(config.dataset, dict(config.dataset_options), config.clients))
        if shape is None:
            return
        with torch.device("meta"):
            net = build_model(config.model, tuple(shape.input_shape), shape.num_classes, **config.model_options)
    except Exception:  # noqa: BLE001 (a model or dataset the config does not describe: checked with the real one)
        return
    dim = sum(p.numel() for p in net.parameters())
    extra = int(config.compressor != "none") + int(byzantine_settings.threatened(config))
    memory.check_stacks(len(comm.client_ids), dim, dev, extra, round_bytes=round_bytes(config.algorithm, dim),
                        algorithm=config.algorithm)  # as client_block counts them


def round_bytes(algorithm: str, dim: int, itemsize: int = 4) -> int:
    """The bytes a client that `algorithm`'s round holds beyond the plan's stacks (its card's `round_bytes`)."""
    own = card(algorithm).round_bytes
    return own(dim, itemsize) if own is not None else 0


def client_block(net: nn.Module, layout: ParamLayout, comm, dev: torch.device, run_network: Network,
                 algorithm: str) -> torch.Tensor:
    """X_0 of this process's block of clients, once its stacks (and `algorithm`'s round) are known to fit in memory.

    Every client starts from the same x_0, so the block is x_0 repeated: a view of one row (the algorithm's X is its
    own copy), the same numbers as the rows of the whole stack.
    """
    extra = int(run_network.compressor is not None) + int(run_network.threat is not None)  # x̂; the messages
    memory.check_stacks(len(comm.client_ids), layout.dim, dev, extra, round_bytes=round_bytes(algorithm, layout.dim),
                        algorithm=algorithm)
    return common_start(net, len(comm.client_ids), dev)


def trainer(net: nn.Module, layout: ParamLayout, data: FederatedData, comm, config: Config,
            run_network: Network) -> LocalTrainer:
    """The local trainer of this process's clients; stragglers stop at the round deadline (`Network.step_cap`)."""
    local = LocalTrainer(net, layout, data, comm.client_ids, config)
    local.step_cap = run_network.step_cap  # None: no deadline
    return local


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


def client_chunk(local: LocalTrainer, algorithm, comm: EngineCommunicator, layout: ParamLayout,
                 X0: torch.Tensor) -> int:
    """The clients per vectorized call, resolved before any training (`LocalTrainer.plan_chunk`).

    A run that cannot fit one client stops here, with the estimate. The plan counts every per-client stack this
    process holds: X, the algorithm's and the gossip's state, the async pool and its next growth, under all-gather
    gossip the rows a round receives from every process, and a multi-process communicator's cache of exchange plans
    (its bound).
    """
    engine = getattr(algorithm, "engine", None)  # the asynchronous mode's: its message pool
    held = memory.held_bytes(ckpt.local_rows(algorithm), engine)
    per_client = algorithm.card.round_bytes  # the round's own temporaries (async's wrapper: none)
    own = len(comm.client_ids) * per_client(layout.dim, X0.element_size()) if per_client is not None else 0
    held += own
    if comm.gossip_mode == "allgather" and comm.world_size > 1:
        held += comm.num_clients * layout.dim * X0.element_size()
    cache = int(getattr(comm, "cache_limit", 0))  # a multi-process communicator's exchange plans, at most
    chunk = local.plan_chunk(algorithm.X, held_bytes=held + cache)
    if local.memory_estimate is not None:  # counted in held_bytes; shown on their own
        if own:
            local.memory_estimate["round_bytes"] = own
        if engine is not None:
            local.memory_estimate["async_pool_bytes"] = engine.planned_pool_bytes()
        if cache:
            local.memory_estimate["exchange_cache_bytes"] = cache
    return chunk


# ------------------------------------------------------------------------------------ the shared builders
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
    if config.weights == "sample-count" and "sizes" not in options:  # `dfl.graphs.SampleCountOptions`
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
