"""`validate(config)`: everything a run checks before any work, in one place above the components.

`Config.validate()` checks each field on its own (the config layer knows no component). Here each component
checks the options it owns, where it is registered (`dfl.algorithms`, `dfl.graphs`, `dfl.data`,
`dfl.models`, `dfl.loggers`, `dfl.threads`, `dfl.network.settings` for link faults, compressed gossip and the
asynchronous mode, `dfl.network.byzantine_settings`, `dfl.training.privacy_settings`), and the rules that join
components are the table of `dfl.engine.combinations`. Every check raises `ConfigError`
naming the field and the allowed values.

Nothing here imports torch (the built-in components are declared by card, `dfl.registry.Registry.declare`), so
a wrong config is refused at once; only a plug-in named by entry point or "package.module:factory" is imported.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from dfl import algorithms, loggers, models, threads
from dfl import data as datasets
from dfl import graphs as topologies
from dfl.config import ADAM_DEFAULTS, LR_SCHEDULE_OPTIONS, Config, field_of, gather
from dfl.data.types import DataShape
from dfl.engine import combinations
from dfl.errors import ArgumentError, ConfigError
from dfl.network import byzantine_settings
from dfl.network import settings as network
from dfl.training import privacy_settings as privacy
from topologies import limits

if TYPE_CHECKING:  # annotations only: a caller's data is already loaded (torch), validation imports none of it
    from dfl.data import FederatedData


def validate(config: Config, data: FederatedData | None = None) -> Config:
    """Check `config` as a run would, before any work, and return it.

    Returning it lets a caller write `config = validate(config)`.

    Args:
        config: the run's options.
        data: the clients' own data a run will be given (`dfl.run(config, data=...)`), or None (the run loads the
            config's dataset). Given, the checks that depend on the data are made on it: the config's dataset,
            partition and their options (dataset, dataset_options, data_root, partition, partition_options, alpha)
            are then not used, so not checked, and a round's size is checked against the given data.

    Raises:
        ConfigError: one message listing every mistake (`problems`), each naming the field and what is allowed.
    """
    found = problems(config, data)
    if found:
        raise ConfigError("; ".join(found), found)
    return config


def problems(config: Config, data: FederatedData | None = None) -> list[str]:
    """Every mistake of `config` at once: each field on its own, the rules between fields, each component's checks.

    The components check a copy of `config` whose fields already found wrong are at their defaults, so that one
    mistake is said once (clients = 0 is not also every component's complaint about zero clients); a problem of such
    a field is said once (`dfl.config.gather`). `data` as `validate`'s.
    """
    if not isinstance(config, Config):
        raise ArgumentError(f"config must be a dfl.Config (dfl.Config(...), Config.from_toml(path) or "
                            f"Config.from_dict(table)), got {type(config).__name__}")
    found = config.all_problems()
    defaults = Config()
    wrong = {field_of(problem) for problem in found} & {f.name for f in fields(Config)}
    config = config.replace(**{name: getattr(defaults, name) for name in wrong})

    def the_topology() -> None:
        topologies.check_config(config, algorithms.is_centralized(config.algorithm))

    shape: list[DataShape | None] = []  # the data's size, once the_data knows it

    def the_data() -> None:
        shape.append(datasets.check_config(config) if data is None else _shape_of(data))
        _check_round_size(config, shape[0])

    def the_model_input() -> None:  # the samples the model will be given: the dataset card's, or the caller's
        if shape and shape[0] is not None:
            source = f"dataset {config.dataset}" if data is None else "the given data"
            models.check_input(config, shape[0].input_shape, source)

    checks = [lambda: algorithms.check_config(config), the_topology, the_data, lambda: models.check_config(config),
              the_model_input,
              lambda: loggers.check_config(config),
              lambda: threads.check_config(config),  # "auto" or N >= 1 (dfl.threads: no torch, so the CLI checks it)
              lambda: network.check_config(config),  # link faults, stragglers; compressed gossip; the async fields
              lambda: byzantine_settings.check_config(config),  # byzantine, attack, attack_scale, trim, clip_radius
              lambda: privacy.check_config(config),  # dp_clip, dp_noise, dp_delta
              lambda: combinations.check(config)]  # the rules between features (world = 1: a torchrun world's own)
    return gather(checks, found)


def _shape_of(data: FederatedData) -> DataShape:
    """The size of a caller's own data, as a dataset's card states it before loading (`dfl.data.DataShape`)."""
    return DataShape(train=int(data.sizes.sum()), test=int(data.test_y.shape[0]),
                     input_shape=tuple(data.input_shape), num_classes=int(data.num_classes))


def unread_fields(config: Config) -> list[str]:
    """The fields set in `config` that its run would not read, which `validate` refuses (one line each).

    An algorithm hyperparameter its algorithm does not declare (`rho` for dpsgd, `dfl.algorithms.unread_fields`),
    `data_root` for a dataset made in memory, the topology fields of a centralized algorithm. A sweep leaves such a
    `[base]` field out of the runs that do not read it (`dfl.workflows.sweep.Sweep.plan`). [] when the config names
    no registered algorithm or dataset (`validate` says so).
    """
    try:
        return [*algorithms.unread_fields(config), *datasets.unread_fields(config),
                *combinations.unread_topology_fields(config), *_switched_off(config)]
    except ConfigError:
        return []


def _switched_off(config: Config) -> list[str]:
    """The options set away from their defaults while the setting that reads them is off.

    Adam's with SGD, another lr schedule's, the stragglers' slowdown without stragglers, the Hessian's sample and
    iterations without its measurements (refused by the Config's and the network's own checks).
    """
    defaults = Config()
    switches = {**{name: config.local_optimizer == "sgd" for name in ADAM_DEFAULTS},
                **{name: config.lr_schedule != schedule for name, schedule in LR_SCHEDULE_OPTIONS.items()},
                "straggler_slowdown": not config.stragglers,
                "hessian_samples": not config.hessian_every, "hessian_iters": not config.hessian_every}
    return [name for name, off in switches.items() if off and getattr(config, name) != getattr(defaults, name)]


def resolved(config: Config) -> Config:
    """`config` with every default its run resolves written in: the Config a run directory's config.toml records.

    The algorithm's hyperparameters that are Config fields (momentum 0.9 of DFedSAM, gossip_steps 4 of DFedSAM-MGS,
    participation 1 of FedAvg, ...), its own options in `algorithm_options` (each at its default unless set), one local
    epoch when neither local_epochs nor local_steps is set, and a Dirichlet partition's alpha. Loading the result runs
    the same run (`dfl run RUN/config.toml`); a default that the checks would refuse as set (momentum with Adam, which
    has its own first moment; asam_eta outside ASAM) stays unset. A config that does not validate is returned as it is.
    """
    try:
        hp = algorithms.resolve_hyperparameters(config)
        card = algorithms.ALGORITHMS.card(config.algorithm, "algorithm")
    except (ConfigError, ValueError):
        return config
    changes: dict[str, Any] = {name: hp[name] for name in algorithms.HYPERPARAMETERS
                               if name in hp and getattr(config, name) is None}
    changes["algorithm_options"] = {name: hp[name] for name in algorithms.option_defaults(card)}
    if config.local_epochs is None and config.local_steps is None:
        changes["local_epochs"] = 1
    if config.partition in datasets.DIRICHLET and config.alpha is None:
        changes["alpha"] = datasets.ALPHA_DEFAULT
    for _ in range(len(changes) + 1):  # leave unset each default the checks would refuse as a set value
        candidate = config.replace(**changes)
        refused = {field_of(problem) for problem in problems(candidate)} & set(changes)
        if not refused:
            return candidate
        for name in refused:
            del changes[name]
    return config


# bytes a round's minibatch schedule keeps per sample a client visits: one row id (int64 at worst;
# `dfl.data.sampler`), its hash keys are made in bounded groups
SCHEDULE_BYTES = 8


# bytes a round's gossip keeps per step it mixes: the step's key, its nonzero count and its operator's reference
# (`dfl.network.gossip.Gossip.mix` lists them to choose dense, composed or step-by-step mixing)
GOSSIP_STEP_BYTES = 32


def _check_round_size(config: Config, shape) -> None:
    """The work of a round against the memory free.

    Its gossip keeps a record per step (so gossip_steps cannot be made arbitrarily large: 10^9 grew until killed),
    and its schedule keeps a row id per sample each client visits (`dfl.data.sampler`), so local_steps (or
    local_epochs) x clients x batch cannot either. The latter needs the dataset's size (`DataShape`), known for the
    built-in datasets.
    """
    steps = config.gossip_steps or 1
    need, free = GOSSIP_STEP_BYTES * steps, limits.available_memory()
    if need > free:
        raise ConfigError(f"gossip_steps = {steps:,}: a round keeps a record of each gossip step it mixes, "
                          f"~{limits.gib(need)}, more than the {limits.gib(free)} available; use fewer gossip steps")
    if shape is None:
        return
    m = max(1, config.clients)
    per_client = max(1, shape.train // m)
    mode, amount = config.epochs_or_steps
    if mode == "steps":
        batch = min(config.batch_size or per_client, per_client)
        visits = m * amount * batch
        what = f"{m:,} clients x {amount:,} steps x {batch:,} samples"
    else:
        visits = amount * shape.train
        what = f"{amount:,} epochs x {shape.train:,} samples"
    need, free = SCHEDULE_BYTES * visits, limits.available_memory()
    if need > free:
        field = "local_steps" if mode == "steps" else "local_epochs"
        raise ConfigError(f"{field} = {amount:,}: a round's minibatch schedule keeps one row id per sample a client "
                          f"visits, {what}, ~{limits.gib(need)}, more than the {limits.gib(free)} available; use "
                          f"fewer {mode} per round (or fewer clients, a smaller batch_size)")


def option_owner(key: str) -> str | None:
    """Where a key that is no Config field belongs, when it is an option of a component.

    "an option of topology custom: set it in [topology_options] ...", for the message that refuses it
    (`Config.from_toml(path, owner=option_owner)`); None when no component has such an option.
    """
    tables = (
        ("topology", "topology_options", lambda: ((n, topologies.topology_options(n)) for n in topologies.TOPOLOGIES)),
        ("dataset", "dataset_options",
         lambda: ((n, datasets.DATASETS.card(n).options) for n in datasets.DATASETS)),
        ("partition", "partition_options",
         lambda: ((n, datasets.partition_options(n)) for n in datasets.PARTITIONS)),
        ("model", "model_options", lambda: ((n, models.MODELS.card(n).options or {}) for n in models.MODELS)),
        ("algorithm", "algorithm_options",
         lambda: ((n, algorithms.option_defaults(algorithms.ALGORITHMS.card(n))) for n in algorithms.ALGORITHMS)),
    )
    for kind, table, listing in tables:
        try:
            owners = [name for name, options in listing() if key in options]
        except Exception:  # noqa: BLE001 (a broken plug-in must not hide the message this serves)
            continue
        if owners:
            shown = ", ".join(owners[:4]) + (", ..." if len(owners) > 4 else "")
            return (f"an option of {kind} {shown}: set it in [{table}] (TOML: {table} = {{ {key} = ... }}; flag: "
                    f"--{table.replace('_', '-')} {key}=...)")
    return None
