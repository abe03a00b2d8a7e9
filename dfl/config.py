"""`Config`: every knob of a run, with defaults that run, TOML load/save, and validation.

Algorithm hyperparameters (`rho`, `momentum`, `gossip_steps`, ...) default to `None`, meaning "the
algorithm's own default". A value set explicitly for an algorithm that does not use it is reported as
ignored (warning + `summary.json`), never silently dropped: see `dfl.algorithms.resolve_hyperparameters`.
An algorithm's own options (registered algorithms: `dfl.algorithms.base`) go in `algorithm_options`, checked
against the defaults it declares.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from dfl.registry import Registry

# fp32: true fp32 everywhere (TF32 off: exact-averaging tests need it). bf16: the clients' forward and backward
# passes run under torch.autocast(bfloat16); parameters, updates, gossip and evaluation stay fp32. tf32: fp32
# tensors with TF32 matmuls and convolutions (CUDA only; ~1e-3 relative error per product).
PRECISIONS = ("fp32", "bf16", "tf32")
# Learning-rate schedules (`dfl.algorithms.base.Context.lr` has the formulas) and the options each one reads:
# an option set to a non-default value for a schedule that does not read it is an error, never ignored.
LR_SCHEDULES = ("exponential", "cosine", "step")
LR_SCHEDULE_OPTIONS = {"lr_decay": "exponential", "lr_min": "cosine", "lr_milestones": "step", "lr_step_factor": "step"}
# SAM radius schedules (`dfl.algorithms.base.Context.rho`): "linear" ramps up over `rho_ramp_rounds`.
RHO_SCHEDULES = ("constant", "linear")
# Local optimizers (`dfl.local`, `dfl.adam`) and what happens to Adam's moments between rounds.
LOCAL_OPTIMIZERS = ("sgd", "adam", "adamw")
LOCAL_OPTIMIZER_STATES = ("reset", "keep")
ADAM_DEFAULTS = {"adam_betas": [0.9, 0.999], "adam_eps": 1e-8, "local_optimizer_state": "reset"}


# `name` becomes a directory (runs/<name> by default) and a sweep run's name: letters, digits and . _ - = , only
# (`dfl.sweep.run_name` builds names such as "algorithm=dfedsam,seed=0"), not starting with "." (no "." / ".."
# path tricks, no hidden directories), at most MAX_NAME characters (directory names stop at 255 bytes).
NAME_ALLOWED = 'letters, digits and "._-=,"'
NAME_RE = re.compile(r"[A-Za-z0-9_=,-][A-Za-z0-9._=,-]*")
MAX_NAME = 200
# Seeds reach torch.manual_seed (< 2^64), numpy SeedSequence (any), the sampler's 64-bit hash and config.toml,
# whose integers are signed 64-bit: the largest seed that is valid everywhere is 2^63 - 1.
MAX_SEED = 2**63 - 1


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the allowed values."""


@dataclass
class Config:
    # experiment
    name: str = "default"
    seed: int = 0
    rounds: int = 200
    # algorithm and its hyperparameters (None = the algorithm's default)
    algorithm: str = "dfedsam-mgs"
    rho: float | None = None
    sam: str | None = None  # "sam" or "asam"
    asam_eta: float | None = None
    momentum: float | None = None
    gossip_steps: int | None = None
    # centralized FL (ALGORITHMS.md §4; None = the algorithm's default)
    participation: float | None = None  # fraction f of clients per round, in (0, 1]; default 1 (all)
    participation_mode: str | None = None  # "uniform": round(f·N) without replacement; "bernoulli": each w.p. f
    aggregation: str | None = None  # server weights p_i: "uniform" (1/|S_t|) or "size" (n_i / Σ_{S_t} n_j)
    server_lr: float | None = None  # η_g (1 = plain averaging)
    server_momentum: float | None = None  # β in [0, 1): FedAvgSM/SLM, DOMO server momentum, MimeLite momentum
    fedcm_alpha: float | None = None  # FedCM/MoFedSAM weight of the local gradient, in [0, 1] (1 = FedAvg/FedSAM)
    domo_alpha: float | None = None  # DOMO/DOMO-S fusion coefficient α >= 0 (0 = FedAvgSLM-Z)
    feddyn_alpha: float | None = None  # FedDyn regularisation α > 0
    fedgloss_beta: float | None = None  # FedGLoSS β > 0 (ADMM penalty 1/β)
    server_rho: float | None = None  # FedGLoSS server SAM radius ρ >= 0 (the client radius is `rho`)
    # SAM radius schedule of every SAM algorithm (rho; FedGLoSS: also server_rho): "constant" or "linear" (None =
    # the algorithm's default: linear for FedGLoSS, constant for the others)
    rho_schedule: str | None = None
    rho_ramp_rounds: int | None = None  # linear: T_s, rounds of the ramp from min(0.001, ρ) up to ρ; 0 or 1 = no ramp
    # the algorithm's own options (its `hyperparameters` that are not Config fields), checked against its defaults
    algorithm_options: dict[str, Any] = field(default_factory=dict)
    # topology
    topology: str = "ring"
    weights: str | None = None  # None = metropolis (for `custom` with a matrix: that matrix)
    topology_options: dict[str, Any] = field(default_factory=dict)
    # unreliable network (dfl.network): drawn from the seed per gossip step (links, clients) and per round (stragglers)
    link_failure: float = 0.0  # probability that a link is down in a gossip step, in [0, 1); 0 = reliable links
    offline: float = 0.0  # probability that a client is offline in a gossip step (no send, no receive), in [0, 1)
    link_failure_burst: float = 0.0  # 0 = links fail independently per step; B = bursts (Gilbert–Elliott), mean B steps
    offline_burst: float = 0.0  # the same for offline clients: 0 = independent per step, B = mean outage in steps
    stragglers: float = 0.0  # probability that a client is slow in a round, in [0, 1]
    straggler_slowdown: float = 4.0  # simulated seconds per local step of a slow client (1 for the others), >= 1
    round_deadline: float = 0.0  # simulated seconds per round: a client sends after the steps it finished; 0 = none
    # compressed gossip (dfl.choco, dfl.compression): CHOCO-GOSSIP with error feedback, decentralized algorithms
    compressor: str = "none"  # "none" (exact gossip), "top-k", "random-k" or "qsgd"
    compression: float | None = None  # top-k/random-k: fraction kept in (0, 1] (unset 0.1); qsgd: bits in [2, 16] (8)
    consensus_lr: float | None = None  # CHOCO's consensus step size gamma in (0, 1] (unset = ω of the compressor)
    # asynchronous gossip in simulated time (dfl.asynchronous, dfl.async_events); 1 local step = 1 simulated second
    mode: str = "sync"  # "sync" (rounds in lock-step) or "async" (every client on its own clock, AD-PSGD style)
    link_latency: float = 0.1  # async: simulated seconds a message travels on a link, after it is sent
    link_bandwidth: float = 1e6  # async: bytes per simulated second of a client's uplink, one message at a time; 0 = ∞
    max_staleness: int = -1  # async: a client mixes neighbour models at most this many updates behind its own
    #                          (it waits for them otherwise); -1 = unbounded, never wait
    # clients and data
    clients: int = 16
    dataset: str = "mnist1d"
    data_root: str | None = None
    dataset_options: dict[str, Any] = field(default_factory=dict)
    partition: str = "dirichlet"
    alpha: float | None = None  # Dirichlet concentration; dirichlet partitions default to 0.3
    partition_options: dict[str, Any] = field(default_factory=dict)
    # model
    model: str = "cnn1d"  # a registered name or "package.module:factory" (dfl.models.custom)
    model_options: dict[str, Any] = field(default_factory=dict)
    # local training
    lr: float = 0.1
    lr_schedule: str = "exponential"  # "exponential" (lr * lr_decay**t), "cosine" (to lr_min) or "step"
    lr_decay: float = 0.998  # exponential: per round, lr_t = lr * lr_decay**t
    lr_min: float = 0.0  # cosine: the floor it anneals to over the run, in [0, lr)
    lr_milestones: list[int] = field(default_factory=list)  # step: rounds (after warmup) at which lr *= factor
    lr_step_factor: float = 0.1  # step: the factor in (0, 1] applied at each milestone
    warmup_rounds: int = 0  # any schedule: linear warmup lr * (t + 1) / W over the first W rounds; 0 = off
    weight_decay: float = 0.0  # sgd, adam: L2 added to the gradient; adamw: decoupled decay y ← y − lr·λ·y
    clip_grad_norm: float = 0.0  # per client; 0 = off
    local_optimizer: str = "sgd"  # "sgd" (with `momentum`), "adam" or "adamw" (torch semantics, `dfl.adam`)
    adam_betas: list[float] = field(default_factory=lambda: list(ADAM_DEFAULTS["adam_betas"]))  # (β1, β2) in [0, 1)
    adam_eps: float = 1e-8  # ε > 0 added to √v̂
    local_optimizer_state: str = "reset"  # Adam's moments: "reset" (fresh every round) or "keep" (per client)
    batch_size: int = 32  # 0 = full-batch gradient descent
    local_epochs: int | None = None  # exactly one of local_epochs / local_steps; default 1 epoch
    local_steps: int | None = None
    client_chunk: int | str = "auto"  # clients per vmapped call: "auto" (measured: fits and fast), 0 = all, or N
    compile: bool = False  # torch.compile the vmapped per-client gradient: faster rounds after ~10 s of compiling
    precision: str = "fp32"  # "fp32"; "bf16": local forward/backward under bf16 autocast; "tf32": TF32 on CUDA
    # evaluation and output
    eval_every: int = 5
    eval_batch_size: int = 1024
    train_eval_samples: int = 2000  # training samples for the averaged model's train accuracy/loss
    client_eval_samples: int = 0  # test samples (a fixed seeded subset) for each client's accuracy; 0 = all
    # personalized evaluation: each client holds out this fraction of its data (stratified by label) as its local
    # test set, and trains on the rest; adds personal_acc_* and global_acc_* (dfl.data.local_test). 0 = off
    local_test_fraction: float = 0.0
    checkpoint_every: int = 0  # rounds; 0 = at every evaluation
    hessian_every: int = 0  # rounds between top-Hessian-eigenvalue measurements of the averaged model; 0 = off
    hessian_samples: int = 1000  # training samples (a fixed subset) the Hessian is taken on
    hessian_iters: int = 20  # power-iteration steps (Hessian-vector products) per measurement
    device: str = "auto"
    progress: bool = True
    # live metrics and early stopping (`dfl.hooks`, `dfl.loggers`)
    loggers: list[str] = field(default_factory=list)  # names in dfl.loggers.LOGGERS: "tensorboard", "wandb", ...
    target_accuracy: float | None = None  # test_acc in (0, 1]: summary.json records rounds_to_target
    stop_at_target: bool = False  # stop (status "stopped") after the first evaluation reaching target_accuracy
    # multi-process (torchrun); a plain `dfl run` is a world of one
    backend: str = "auto"  # "auto" (nccl with CUDA, else gloo), "nccl" or "gloo"
    gossip_mode: str = "p2p"  # "p2p" (neighbours only) or "allgather" (whole stack, then W^Q locally)
    dist_timeout: float = 300.0  # seconds before a collective that waits on a dead rank fails

    # ------------------------------------------------------------------ conversion
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown config field(s) {', '.join(unknown)}; known fields: {', '.join(sorted(known))}"
            )
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path) -> Config:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        with path.open("rb") as fh:
            try:
                values = tomllib.load(fh)
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        return cls.from_dict(values)

    def to_toml(self) -> str:
        """TOML text; `None` fields are omitted (TOML has no null), so loading it back restores them."""
        return tomli_w.dumps({k: v for k, v in self.to_dict().items() if v is not None})

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ validation
    def validate(self) -> Config:
        """Check every field; raise `ConfigError` naming the field and the allowed values."""
        from dfl.algorithms import ALGORITHMS
        from dfl.data import DATASETS, PARTITIONS
        from dfl.models import MODELS, check_spec
        from dfl.topologies import TOPOLOGIES
        from topologies import SCHEMES as WEIGHTS

        _registered("algorithm", self.algorithm, ALGORITHMS)
        _choice("topology", self.topology, TOPOLOGIES)
        if self.weights is not None:
            _choice("weights", self.weights, WEIGHTS)
        _choice("dataset", self.dataset, DATASETS)
        _choice("partition", self.partition, PARTITIONS)
        try:  # a registered name, or "package.module:factory" (imported now, so a typo fails at once)
            check_spec(self.model, MODELS)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        _choice("device", self.device.split(":")[0], ("auto", "cpu", "cuda"))
        _choice("backend", self.backend, ("auto", "nccl", "gloo"))
        _choice("gossip_mode", self.gossip_mode, ("p2p", "allgather"))
        _number("dist_timeout", self.dist_timeout, minimum=0.0, strict=True)
        if self.sam is not None:
            _choice("sam", self.sam, ("sam", "asam"))
        _name(self.name)
        _integer("seed", self.seed, minimum=0)
        if self.seed > MAX_SEED:
            raise ConfigError(f"seed must be an integer in [0, 2^63 - 1] (0 .. {MAX_SEED}), got {self.seed}")
        _integer("rounds", self.rounds, minimum=1)
        _integer("clients", self.clients, minimum=1)
        _integer("batch_size", self.batch_size, minimum=0)
        if self.client_chunk != "auto":
            if isinstance(self.client_chunk, str):
                raise ConfigError(f"client_chunk must be \"auto\", 0 (all clients in one call) or a positive "
                                  f"integer, got {self.client_chunk!r}")
            _integer("client_chunk", self.client_chunk, minimum=0)
            if isinstance(self.clients, int) and self.client_chunk > self.clients:
                raise ConfigError(f"client_chunk = {self.client_chunk} is larger than clients = {self.clients}; "
                                  "use a chunk <= clients, 0 (all at once) or \"auto\"")
        _boolean("compile", self.compile)
        _choice("precision", self.precision, PRECISIONS)
        _boolean("progress", self.progress)
        self._validate_hooks()
        _integer("eval_every", self.eval_every, minimum=1)
        _integer("eval_batch_size", self.eval_batch_size, minimum=1)
        _integer("train_eval_samples", self.train_eval_samples, minimum=0)
        _integer("client_eval_samples", self.client_eval_samples, minimum=0)
        _number("local_test_fraction", self.local_test_fraction, minimum=0.0)
        if self.local_test_fraction >= 1:
            raise ConfigError(f"local_test_fraction must be in [0, 1) (0 = off), got {self.local_test_fraction}")
        _integer("checkpoint_every", self.checkpoint_every, minimum=0)
        _integer("hessian_every", self.hessian_every, minimum=0)
        _integer("hessian_samples", self.hessian_samples, minimum=1)
        _integer("hessian_iters", self.hessian_iters, minimum=1)
        if self.gossip_steps is not None:
            _integer("gossip_steps", self.gossip_steps, minimum=1)
        self._validate_centralized()
        if self.local_epochs is not None and self.local_steps is not None:
            raise ConfigError("set only one of local_epochs and local_steps (got both)")
        if self.local_epochs is not None:
            _integer("local_epochs", self.local_epochs, minimum=1)
        if self.local_steps is not None:
            _integer("local_steps", self.local_steps, minimum=1)
        _number("lr", self.lr, minimum=0.0, strict=True)
        _number("lr_decay", self.lr_decay, minimum=0.0, strict=True)
        self._validate_lr_schedule()
        _number("weight_decay", self.weight_decay, minimum=0.0)
        _number("clip_grad_norm", self.clip_grad_norm, minimum=0.0)
        for name in ("rho", "asam_eta"):
            if getattr(self, name) is not None:
                _number(name, getattr(self, name), minimum=0.0)
        if self.momentum is not None:
            _number("momentum", self.momentum, minimum=0.0)
            if self.momentum >= 1:
                raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.alpha is not None:
            _number("alpha", self.alpha, minimum=0.0, strict=True)
        for name in ("topology_options", "dataset_options", "partition_options", "model_options"):
            if not isinstance(getattr(self, name), dict):
                raise ConfigError(f"{name} must be a table of key = value, got {getattr(self, name)!r}")
        self._validate_algorithm_options()
        self._validate_rho_schedule()  # these two read the resolved hyperparameters: after algorithm_options
        self._validate_local_optimizer()
        from dfl.network import check_config as check_network

        check_network(self)  # link_failure, offline, stragglers, straggler_slowdown, round_deadline
        from dfl.choco import check_config as check_compression

        check_compression(self)  # compressor, compression, consensus_lr
        from dfl.asynchronous import check_config as check_async

        check_async(self)  # mode, link_latency, link_bandwidth, max_staleness
        if self.mode == "async" and self.compressor != "none":
            raise ConfigError(f"compressor = {self.compressor} is not modelled in mode = async (CHOCO's public "
                              "copies need every neighbour to see every message in order); use mode = sync")
        return self

    def _validate_algorithm_options(self) -> None:
        """`algorithm_options` fit the algorithm's declared defaults, and its `check_hyperparameters` accepts
        the resolved values (after every field is checked, so it sees valid Config fields)."""
        from dfl.algorithms import resolve_hyperparameters

        if not isinstance(self.algorithm_options, dict):
            raise ConfigError(f"algorithm_options must be a table of key = value, got {self.algorithm_options!r}")
        try:
            resolve_hyperparameters(self, warn=False)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def _validate_centralized(self) -> None:
        from dfl.algorithms import algorithm_class
        from dfl.algorithms.server import AGGREGATIONS, PARTICIPATION_MODES

        if self.participation is not None:
            _number("participation", self.participation, minimum=0.0, strict=True)
            if self.participation > 1:
                raise ConfigError(f"participation must be in (0, 1], got {self.participation}")
            if self.participation < 1 and not getattr(algorithm_class(self.algorithm), "centralized", False):
                raise ConfigError(
                    f"participation = {self.participation} applies only to the centralized algorithms; the "
                    f"decentralized {self.algorithm!r} trains and gossips every client each round (use 1 or unset)"
                )
        if self.participation_mode is not None:
            _choice("participation_mode", self.participation_mode, PARTICIPATION_MODES)
        if self.aggregation is not None:
            _choice("aggregation", self.aggregation, AGGREGATIONS)
        for name, strict in (("server_lr", True), ("domo_alpha", False), ("feddyn_alpha", True),
                             ("fedgloss_beta", True), ("server_rho", False)):
            if getattr(self, name) is not None:
                _number(name, getattr(self, name), minimum=0.0, strict=strict)
        for name, upper in (("server_momentum", "1)"), ("fedcm_alpha", "1]")):
            value = getattr(self, name)
            if value is not None:
                _number(name, value, minimum=0.0)
                if value > 1 or (value == 1 and upper == "1)"):
                    raise ConfigError(f"{name} must be in [0, {upper}, got {value}")

    def _validate_rho_schedule(self) -> None:
        from dfl.algorithms import resolve_hyperparameters

        if self.rho_schedule is not None:
            _choice("rho_schedule", self.rho_schedule, RHO_SCHEDULES)
        if self.rho_ramp_rounds is not None:
            _integer("rho_ramp_rounds", self.rho_ramp_rounds, minimum=0)
        hp, _ = resolve_hyperparameters(self, warn=False)
        if "rho_schedule" not in hp:  # not a SAM algorithm: both are reported as ignored options
            return
        if hp["rho_schedule"] == "constant" and self.rho_ramp_rounds not in (None, 0):
            raise ConfigError(f"rho_ramp_rounds = {self.rho_ramp_rounds} applies only to rho_schedule = linear, but "
                              f"{self.algorithm}'s rho_schedule is constant; set rho_schedule = \"linear\" or "
                              "remove it")
        if self.rho_schedule == "linear" and hp["rho_ramp_rounds"] <= 1:
            raise ConfigError(f"rho_schedule = linear needs rho_ramp_rounds >= 2 (the rounds of the ramp up to rho), "
                              f"got {hp['rho_ramp_rounds']}")

    def _validate_local_optimizer(self) -> None:
        from dfl.algorithms import ALGORITHMS, algorithm_class

        _choice("local_optimizer", self.local_optimizer, LOCAL_OPTIMIZERS)
        _choice("local_optimizer_state", self.local_optimizer_state, LOCAL_OPTIMIZER_STATES)
        betas = self.adam_betas
        if not isinstance(betas, (list, tuple)) or len(betas) != 2 or any(
                isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < 1 for b in betas):
            raise ConfigError(f"adam_betas must be two numbers (beta1, beta2) in [0, 1), got {betas!r}")
        _number("adam_eps", self.adam_eps, minimum=0.0, strict=True)
        if self.local_optimizer == "sgd":
            for name, default in ADAM_DEFAULTS.items():
                value = getattr(self, name)
                if (list(value) if name == "adam_betas" else value) != default:
                    raise ConfigError(f"{name} = {value!r} applies only to local_optimizer = adam or adamw, but "
                                      f"local_optimizer = sgd; remove it (or set it to its default {default!r})")
            return
        cls = algorithm_class(self.algorithm)
        if self.local_optimizer not in cls.local_optimizers:
            able = [name for name, c in ALGORITHMS.items()
                    if self.local_optimizer in getattr(c, "local_optimizers", ("sgd",))]
            raise ConfigError(f"local_optimizer = {self.local_optimizer} is not defined for {self.algorithm}, whose "
                              f"update rule is written in SGD steps; use local_optimizer = sgd, or one of "
                              f"{', '.join(able)}")
        # an algorithm's default momentum is SGD's and does not apply to Adam (`Context.rule`); a set one is an error
        if self.momentum is not None and self.momentum > 0:
            raise ConfigError(f"momentum = {self.momentum} is SGD's heavy ball; local_optimizer = "
                              f"{self.local_optimizer} has its own first moment (adam_betas[0]): remove momentum")

    def _validate_hooks(self) -> None:
        from dfl.loggers import LOGGERS

        names = self.loggers
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"loggers must be a list of logger names ({', '.join(LOGGERS.names())}), got {names!r}")
        for name in names:
            try:
                LOGGERS.get(name, field="loggers")  # "loggers must be one of ...; got ... (did you mean ...?)"
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        if len(set(names)) < len(names):
            raise ConfigError(f"loggers names a logger twice: {list(names)}")
        if self.target_accuracy is not None:
            _number("target_accuracy", self.target_accuracy, minimum=0.0, strict=True)
            if self.target_accuracy > 1:
                raise ConfigError(f"target_accuracy must be in (0, 1] (a test accuracy fraction, e.g. 0.8 for 80%), "
                                  f"got {self.target_accuracy}")
        _boolean("stop_at_target", self.stop_at_target)
        if self.stop_at_target and self.target_accuracy is None:
            raise ConfigError("stop_at_target = true needs target_accuracy (the test accuracy in (0, 1] to stop at, "
                              "e.g. --target-accuracy 0.8)")

    def _validate_lr_schedule(self) -> None:
        _choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        _number("lr_min", self.lr_min, minimum=0.0)
        _number("lr_step_factor", self.lr_step_factor, minimum=0.0, strict=True)
        if self.lr_step_factor > 1:
            raise ConfigError(f"lr_step_factor must be in (0, 1], got {self.lr_step_factor}")
        milestones = self.lr_milestones
        if not isinstance(milestones, (list, tuple)) or any(
                isinstance(m, bool) or not isinstance(m, int) for m in milestones):
            raise ConfigError(f"lr_milestones must be a list of integers (rounds), got {milestones!r}")
        _integer("warmup_rounds", self.warmup_rounds, minimum=0)
        if self.warmup_rounds >= self.rounds:
            raise ConfigError(f"warmup_rounds must be < rounds = {self.rounds} (the schedule runs on the rounds "
                              f"after the warmup), got {self.warmup_rounds}")
        defaults = {f.name: f.default for f in fields(Config) if f.name in LR_SCHEDULE_OPTIONS}
        for name, schedule in LR_SCHEDULE_OPTIONS.items():
            value = getattr(self, name)
            unset = not value if name == "lr_milestones" else value == defaults[name]
            if schedule != self.lr_schedule and not unset:
                default = "[]" if name == "lr_milestones" else defaults[name]
                raise ConfigError(f"{name} = {value!r} applies only to lr_schedule = {schedule}, but lr_schedule = "
                                  f"{self.lr_schedule}; remove it (or set it to its default {default})")
        if self.lr_schedule == "cosine" and self.lr_min >= self.lr:
            raise ConfigError(f"lr_min must be in [0, lr) = [0, {self.lr}) for lr_schedule = cosine, got {self.lr_min}")
        if self.lr_schedule == "step":
            if not milestones:
                raise ConfigError("lr_schedule = step needs lr_milestones, e.g. [100, 150] (rounds after the warmup "
                                  "at which lr is multiplied by lr_step_factor)")
            span = self.rounds - self.warmup_rounds
            for before, m in zip([0, *milestones], milestones):
                if m <= before:
                    raise ConfigError(f"lr_milestones must be strictly increasing positive integers, got "
                                      f"{list(milestones)}")
                if m >= span:
                    raise ConfigError(f"lr_milestones must be < rounds - warmup_rounds = {span} (milestones count "
                                      f"the rounds after the warmup; a later one would never apply), got {m}")

    @property
    def epochs_or_steps(self) -> tuple[str, int]:
        """("epochs", E) or ("steps", K): the local work per round."""
        if self.local_steps is not None:
            return "steps", self.local_steps
        return "epochs", self.local_epochs if self.local_epochs is not None else 1


# One line per Config field: the `dfl run --FIELD` help text (the CLI appends the default). A test checks that
# every field has one, and that the lists of names here match the registries (which import torch).
FIELD_HELP: dict[str, str] = {
    "name": f"run name; the run directory is runs/<name> unless --out is given ({NAME_ALLOWED}; "
            f"not starting with '.'; at most {MAX_NAME} characters)",
    "seed": "seed of every random draw (model init, partition, sampling, random topologies); 0 .. 2^63 - 1",
    "rounds": "communication rounds to run",
    "algorithm": "dpsgd, dfedavg, dfedavgm, dfedsam, dfedsam-mgs (decentralized) or fedavg, fedsam, mofedsam, "
                 "fedcm, scaffold, fedavgsm, fedavglm, fedavglm-z, fedavgslm, fedavgslm-z, domo, domo-s, mimelite, "
                 "feddyn, fedgloss (centralized), or a registered one (dfl list algorithms)",
    "rho": "SAM perturbation radius (unset = the algorithm's default)",
    "sam": "SAM variant: sam or asam (unset = the algorithm's default)",
    "asam_eta": "ASAM eta (unset = the algorithm's default)",
    "momentum": "local momentum in [0, 1) (unset = the algorithm's default)",
    "gossip_steps": "gossip steps Q per round, >= 1 (unset = the algorithm's default)",
    "participation": "centralized: fraction of clients per round, in (0, 1] (unset = 1, all)",
    "participation_mode": "centralized: uniform (round(f*N) without replacement) or bernoulli (each w.p. f)",
    "aggregation": "centralized server weights: uniform (1/|S_t|) or size (n_i / sum of n_j)",
    "server_lr": "centralized server learning rate > 0 (1 = plain averaging)",
    "server_momentum": "server momentum in [0, 1) (FedAvgSM/SLM, DOMO, MimeLite)",
    "fedcm_alpha": "FedCM/MoFedSAM weight of the local gradient, in [0, 1] (1 = FedAvg/FedSAM)",
    "domo_alpha": "DOMO/DOMO-S fusion coefficient >= 0 (0 = FedAvgSLM-Z)",
    "feddyn_alpha": "FedDyn regularisation alpha > 0",
    "fedgloss_beta": "FedGLoSS beta > 0 (ADMM penalty 1/beta)",
    "server_rho": "FedGLoSS server SAM radius >= 0 (the client radius is --rho)",
    "rho_schedule": "SAM radius schedule: constant or linear (ramp from min(0.001, rho) up to rho over "
                    "--rho-ramp-rounds; FedGLoSS: both radii) (unset = the algorithm's: linear for fedgloss, else "
                    "constant)",
    "rho_ramp_rounds": "linear rho schedule: rounds of the ramp, >= 2 (unset = the algorithm's: 0 = no ramp)",
    "algorithm_options": "the algorithm's own options (`dfl list algorithms`), e.g. clip=0.5 (registered "
                         "algorithms; built-ins take theirs as fields)",
    "topology": "communication graph: ring, grid, exponential, full, star, hypercube, random-regular, erdos-renyi, "
                "one-peer-exponential, random-k, custom, or a registered one (dfl list topologies)",
    "weights": "mixing-weight scheme: metropolis, uniform, max-degree, lazy or fastest (unset = metropolis)",
    "topology_options": "topology options, e.g. degree=4, p=0.3, k=2, shape=(4,4), periodic=True, "
                        "matrix=W.npy (or .csv, .mtx), edges=graph.edgelist",
    "link_failure": "probability in [0, 1) that a link is down in a gossip step (decentralized algorithms, undirected "
                    "topologies; the weights are recomputed on the surviving links)",
    "offline": "probability in [0, 1) that a client is offline in a gossip step: it neither sends nor receives",
    "link_failure_burst": "0 = links fail independently per gossip step; B >= 1/(1 - link_failure) = failures in "
                          "bursts (Gilbert–Elliott) of mean B steps, link_failure still the fraction of steps down",
    "offline_burst": "0 = clients go offline independently per gossip step; B >= 1/(1 - offline) = outages of mean B "
                     "steps (Gilbert–Elliott), offline still the fraction of steps a client is away",
    "stragglers": "probability in [0, 1] that a client is slow in a round (--straggler-slowdown times slower)",
    "straggler_slowdown": "simulated seconds per local step of a slow client (1 for the others), >= 1",
    "round_deadline": "simulated seconds per round: a client sends after the local steps it finished by then; "
                      "0 = no deadline",
    "compressor": "compressed gossip (CHOCO-GOSSIP with error feedback, decentralized algorithms, static topologies):"
                  " none (exact gossip), top-k, random-k or qsgd",
    "compression": "top-k, random-k: fraction of coordinates kept, in (0, 1] (unset = 0.1); qsgd: bits per "
                   "coordinate, sign included, an integer in [2, 16] (unset = 8)",
    "consensus_lr": "CHOCO consensus step size gamma in (0, 1] (compressed gossip; unset = the compressor's omega: "
                    "the fraction kept for top-k and random-k, 1/tau for qsgd)",
    "mode": "sync (rounds in lock-step) or async (every client on its own simulated clock, mixing the neighbour "
            "models that have arrived: AD-PSGD style; dpsgd, dfedavg, dfedavgm, dfedsam)",
    "link_latency": "async: simulated seconds a message travels on a link (1 local step = 1 s), >= 0",
    "link_bandwidth": "async: bytes per simulated second of a client's uplink, which sends one message at a time; "
                      "0 = unlimited",
    "max_staleness": "async: a client mixes neighbour models at most this many updates behind its own, waiting "
                     "otherwise; -1 = unbounded",
    "clients": "number of clients, >= 1",
    "dataset": "mnist1d, digits, synthetic, cifar10, cifar100, mnist, fashion-mnist, or a registered one (dfl list "
               "datasets)",
    "data_root": "directory of a file-backed dataset (cifar10, cifar100, mnist, fashion-mnist, registered ones "
                 "that take root)",
    "dataset_options": "dataset options, e.g. num_samples=4000 seed=42 test_fraction=0.2",
    "partition": "how the train set is split among clients: iid, dirichlet, dirichlet-class, shards, similarity, "
                 "natural, or a registered one (dfl list partitions)",
    "alpha": "Dirichlet concentration > 0 (dirichlet partitions only; unset = 0.3)",
    "partition_options": "partition options, e.g. shards_per_client=2",
    "model": "logreg, mlp, cnn1d, cnn, resnet18, resnet20, vgg11, or your own factory as package.module:factory "
             "(importable from the working directory; README, Your own model)",
    "model_options": "model options, e.g. hidden=128 (a factory's keyword-only parameters)",
    "lr": "local learning rate > 0",
    "lr_schedule": "learning-rate schedule: exponential (lr * lr_decay^t), cosine (to --lr-min over the run) or "
                   "step (x --lr-step-factor at each of --lr-milestones)",
    "lr_decay": "exponential schedule: decay per round, lr_t = lr * lr_decay^t",
    "lr_min": "cosine schedule: the learning rate it anneals to, in [0, lr)",
    "lr_milestones": "step schedule: rounds after the warmup at which lr is multiplied by --lr-step-factor",
    "lr_step_factor": "step schedule: factor in (0, 1] applied at each milestone",
    "warmup_rounds": "rounds of linear warmup lr * (t + 1) / W before the schedule, in [0, rounds); 0 = off",
    "weight_decay": "weight decay >= 0: L2 added to the gradient (sgd, adam) or decoupled (adamw)",
    "clip_grad_norm": "per-client gradient-norm clip; 0 = off",
    "local_optimizer": "local optimizer: sgd (with --momentum), adam or adamw (torch semantics; dpsgd, dfedavg, "
                       "dfedsam, dfedsam-mgs, fedavg, fedsam, fedavgsm)",
    "adam_betas": "adam/adamw: beta1 beta2, each in [0, 1)",
    "adam_eps": "adam/adamw: epsilon > 0 added to the root of the second moment",
    "local_optimizer_state": "adam/adamw moments: reset (fresh every round) or keep (per client, across rounds)",
    "batch_size": "minibatch size per local step, at most a client's data (0 = full batch)",
    "local_epochs": "local epochs per round (set this or --local-steps; unset = 1 epoch)",
    "local_steps": "local steps per round (instead of --local-epochs)",
    "client_chunk": "clients per vectorised call: auto (measured), 0 = all at once, or N",
    "compile": "torch.compile the per-client gradient (faster rounds after ~10 s of compiling)",
    "precision": "fp32, bf16 (local forward/backward under bf16 autocast) or tf32 (TF32 matmuls on CUDA)",
    "eval_every": "rounds between evaluations, >= 1",
    "eval_batch_size": "batch size of evaluation, >= 1",
    "train_eval_samples": "training samples for the averaged model's train loss/accuracy",
    "client_eval_samples": "test samples for each client's accuracy (a fixed seeded subset); 0 = all",
    "local_test_fraction": "fraction in [0, 1) of each client's data held out (stratified by label) as its local "
                           "test set for personal_acc / global_acc; 0 = off",
    "checkpoint_every": "rounds between checkpoints; 0 = at every evaluation",
    "hessian_every": "rounds between top-Hessian-eigenvalue measurements; 0 = off",
    "hessian_samples": "training samples the Hessian is taken on, >= 1",
    "hessian_iters": "power-iteration steps per Hessian measurement, >= 1",
    "device": "auto, cpu, cuda or cuda:N",
    "progress": "show a progress line per round",
    "loggers": "live metrics: tensorboard (event files in RUN/tensorboard/) and/or wandb (Weights & Biases, if "
               "installed); --log NAME, repeated or comma-separated; --log '' for none",
    "target_accuracy": "test accuracy in (0, 1]: summary.json records rounds_to_target, the first evaluated round "
                       "reaching it",
    "stop_at_target": "stop the run (status stopped) at the first evaluation reaching --target-accuracy",
    "backend": "torchrun backend: auto (nccl with CUDA, else gloo), nccl or gloo",
    "gossip_mode": "torchrun gossip: p2p (neighbours only) or allgather (whole stack, then W^Q locally)",
    "dist_timeout": "torchrun: seconds before a collective waiting on a dead rank fails, > 0",
}


def _choice(name: str, value: Any, allowed: tuple[str, ...] | Registry) -> None:
    """value must be one of `allowed`: a tuple, or a Registry (its names, registered ones included)."""
    if isinstance(value, str) and value in allowed:
        return
    if isinstance(allowed, Registry) and isinstance(value, str):
        try:  # a plug-in that failed to load says why; else the choices, with a close match suggested
            allowed.get(value, field=name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _registered(name: str, value: Any, registry) -> None:
    """`value` is a name in `registry` (a `dfl.registry.Registry`: built-in, registered in Python, or plug-in)."""
    try:
        registry.get(value, field=name)
    except ValueError as exc:  # "algorithm must be one of ...; got ..." (or why a plug-in failed to load)
        raise ConfigError(str(exc)) from exc


def _name(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"name must be a non-empty string of {NAME_ALLOWED}, got {value!r}")
    if len(value) > MAX_NAME:
        raise ConfigError(f"name must be at most {MAX_NAME} characters, got {len(value)}")
    if NAME_RE.fullmatch(value) is None:
        start = " and must not start with '.'" if value.startswith(".") else ""
        raise ConfigError(f"name may contain only {NAME_ALLOWED}{start} (it names the run directory; use --out "
                          f"for another location), got {value!r}")


def _boolean(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")


def _integer(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def _number(name: str, value: Any, minimum: float, strict: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        bound = ">" if strict else ">="
        raise ConfigError(f"{name} must be {bound} {minimum}, got {value}")
