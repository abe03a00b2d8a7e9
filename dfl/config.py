"""`Config`: every option of a run, each described once, with TOML load/save and the checks of each field.

Each field is declared with `option(default, help)`: its type is the annotation, its allowed values the
`choices` (where they are a fixed set) or the range its help names, and its one line of help is the text that
`dfl run --help`, the `dfl run --FIELD` flags, and the docs' options reference (`docs/reference/options.md`,
generated from `options()`) show.

`Config` is a leaf: it knows its fields, not the components. `Config.validate()` checks each field on its own
(type, range, fixed choices, and rules between fields of one concern such as the learning-rate schedule); the
names of registered components (algorithm, topology, dataset, model, ...) and the rules that join several
components are checked by the components themselves, all at once by `dfl.validate(config)`
(`dfl.engine.validation`), which every run calls.

Algorithm hyperparameters (`rho`, `momentum`, `gossip_steps`, ...) default to `None`, meaning "the algorithm's
own default". A value set explicitly for an algorithm that does not read it is refused by `dfl.validate`, naming
the algorithms that read it (`dfl.algorithms.unread_fields`), never ignored. An algorithm's own
options (registered algorithms: `dfl.algorithms.base`) go in `algorithm_options`, checked against the defaults
it declares.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass

import tomli_w

from dfl import files
from dfl.errors import ArgumentError, ConfigError, FileReadError

# fp32: matmuls and cuDNN convolutions in IEEE fp32 (TF32 off, though PyTorch allows it for convolutions by default).
# bf16: the clients' forward and backward passes run under torch.autocast(bfloat16); parameters, updates, gossip and
# evaluation stay fp32. tf32: fp32 tensors with TF32 matmuls and convolutions (CUDA only; ~1e-3 relative error per
# product). Gossip averages in IEEE fp32/fp64 whatever the precision (`dfl.network.gossip`). dfl sets these for the
# run and puts the process's settings back after (`dfl.models.kernels`).
PRECISIONS = ("fp32", "bf16", "tf32")
# How cuDNN picks its algorithms on CUDA (`dfl.models.kernels`). deterministic: cudnn.deterministic on, autotuning
# (cudnn.benchmark) off: two runs on one machine give the same numbers bit for bit. fast: cudnn.benchmark autotunes
# each convolution shape and may pick non-deterministic backward algorithms: faster convolutions, but runs differ in
# the last bits from run to run and with the client chunk (so with the world size). Gossip has no racing atomics in
# either mode (`dfl.network.gossip.RowsOperator`); the CPU is deterministic either way.
KERNELS = ("deterministic", "fast")
# Learning-rate schedules (`dfl.algorithms.base.Context.lr` has the formulas) and the options each one reads:
# an option set to a non-default value for a schedule that does not read it is an error, never ignored.
LR_SCHEDULES = ("exponential", "cosine", "step")
LR_SCHEDULE_OPTIONS = {"lr_decay": "exponential", "lr_min": "cosine", "lr_milestones": "step", "lr_step_factor": "step"}
# SAM radius schedules (`dfl.algorithms.base.Context.rho`): "linear" ramps up over `rho_ramp_rounds`.
RHO_SCHEDULES = ("constant", "linear")
# Local optimizers (`dfl.training.local`, `dfl.training.adam`) and what happens to Adam's moments between rounds.
LOCAL_OPTIMIZERS = ("sgd", "adam", "adamw")
LOCAL_OPTIMIZER_STATES = ("reset", "keep")
ADAM_DEFAULTS: dict[str, Any] = {"adam_betas": [0.9, 0.999], "adam_eps": 1e-8, "local_optimizer_state": "reset"}


# `name` names a directory (runs/<name>-<time> without --out) and a sweep run's name: letters, digits and . _ - = , only
# (`dfl.workflows.sweep.run_name` builds names such as "algorithm=dfedsam,seed=0"), not starting with "." (no "." / ".."
# path tricks, no hidden directories), at most MAX_NAME characters (directory names stop at 255 bytes).
NAME_ALLOWED = 'letters, digits and "._-=,"'
NAME_RE = re.compile(r"[A-Za-z0-9_=,-][A-Za-z0-9._=,-]*")
MAX_NAME = 200
# Seeds reach torch.manual_seed (< 2^64), numpy SeedSequence (any), the sampler's 64-bit hash and config.toml,
# whose integers are signed 64-bit: the largest seed that is valid everywhere is 2^63 - 1.
MAX_SEED = 2**63 - 1
# Every integer a config holds goes to numpy, torch or C as a signed 64-bit integer (and TOML's integers are
# 64-bit): a larger one is refused as such, before anything tries to convert it (OverflowError).
MAX_INT = 2**63 - 1
DEVICES = ("auto", "cpu", "cuda")
# Centralized server rules (docs/reference/update-rules.md#centralized-conventions): who takes part in a round and
# how the server weighs them.
PARTICIPATION_MODES = ("uniform", "bernoulli")
AGGREGATIONS = ("uniform", "size")
# FedAdam/FedYogi/FedAdagrad (docs/reference/update-rules.md#fedadam-fedyogi-and-fedadagrad): the paper's form, or a
# library's convention reproduced exactly
FEDOPT_FORMS = ("paper", "flower", "torch")


def option(default: Any = MISSING, help: str = "", *, factory: Any = None, choices: tuple[str, ...] | None = None,
           interval: str | None = None, note: str = ""):
    """A `Config` field, described once.

    Its default (or a `factory` for a list or table), one line of `help`, and its allowed values: `choices` when they
    are a fixed set, or an `interval` such as "[0, 1)" or "(0, inf)" for a number (`note` is added to the message that
    refuses a value above it). `Config.validate` checks both; the CLI flags, `dfl run --help`, the TOML keys and the
    docs' options page read them (`options()`).
    """
    metadata = {"help": help, "choices": choices, "interval": Interval.parse(interval) if interval else None,
                "note": note}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Interval:
    """The allowed range of a number, as written: "[0, 1)" is 0 <= x < 1, "(0, inf)" is x > 0."""

    text: str
    low: float
    high: float
    low_closed: bool
    high_closed: bool

    @classmethod
    def parse(cls, text: str) -> Interval:
        """The interval written as "[low, high)" (a bracket is closed, a parenthesis open)."""
        low, high = (part.strip() for part in text[1:-1].split(","))
        return cls(text, float(low), float(high), text[0] == "[", text[-1] == "]")

    def describe(self) -> str:
        """">= 1", "> 0", or "in [0, 1)": how help lines and the options page say it."""
        low = f"{self.low:g}"
        if math.isinf(self.high):
            return f"{'>=' if self.low_closed else '>'} {low}"
        return f"in {self.text}"

    def check(self, name: str, value: Any, integer: bool, note: str = "") -> None:
        """ConfigError naming `name` unless `value` is a number (an integer when `integer`) inside the interval."""
        if integer:
            _integer(name, value, minimum=int(self.low) + (not self.low_closed))
        else:
            _number(name, value, minimum=self.low, strict=not self.low_closed)
        if value > self.high or (value == self.high and not self.high_closed):
            raise ConfigError(f"{name} must be in {self.text}{f' ({note})' if note else ''}, got {value}")


@dataclass(frozen=True)
class Option:
    """What `options()` tells about one field.

    The name, the annotation as written, the default, the allowed values (`choices` when fixed, else an `interval` for a
    number), the help line and its section.
    """

    name: str
    type: str
    default: Any
    choices: tuple[str, ...] | None
    interval: Interval | None
    help: str
    section: str

    @property
    def allowed(self) -> str:
        """The allowed values in words ("one of sam, asam", ">= 1", "in [0, 1)"), or "" when the help says."""
        if self.choices is not None:
            return "one of " + ", ".join(self.choices)
        return self.interval.describe() if self.interval is not None else ""


# Sections of the options page and of `dfl run --help`: (title, first field of the section), in field order.
SECTIONS = (
    ("Experiment", "name"), ("Algorithm", "algorithm"), ("Centralized algorithms", "participation"),
    ("SAM radius schedule", "rho_schedule"), ("Topology", "topology"), ("Unreliable network", "link_failure"),
    ("Compressed gossip", "compressor"), ("Asynchronous gossip", "mode"), ("Byzantine clients", "byzantine"),
    ("Differential privacy", "dp_clip"), ("Clients and data", "clients"),
    ("Model", "model"), ("Local training", "lr"), ("Evaluation and output", "eval_every"),
    ("Live metrics and early stopping", "loggers"), ("Multi-process (torchrun)", "backend"),
)


@dataclass
class Config:
    """Every option of a run, with defaults that run.

    `dfl.Config(algorithm="dfedsam", clients=32, ...)`, a TOML file (`Config.from_toml`) or `dfl run --FIELD VALUE`
    flags. The fields, their types, defaults, allowed values and help are listed on the options reference page
    (generated from `options()`). Algorithm hyperparameters left unset (`None`) take the algorithm's own default.

    Examples:
        A config written to TOML and read back (a run directory's config.toml is this file):

        >>> import pathlib, tempfile
        >>> from dfl import Config
        >>> config = Config(algorithm="dfedavg", topology="grid", clients=16, rounds=5)
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "run.toml"
        >>> _ = path.write_text(config.to_toml())
        >>> loaded = Config.from_toml(path)
        >>> loaded == config, loaded.topology, loaded.rounds
        (True, 'grid', 5)

        A wrong value is refused with the field, the value and what is allowed:

        >>> Config(rounds=0).validate()
        Traceback (most recent call last):
        ...
        dfl.errors.ConfigError: rounds must be >= 1, got 0
    """

    # experiment
    name: str = option("default", f"run name; without --out the run writes into a new runs/<name>-<YYYYmmdd-HHMMSS> "
        f"(named after the algorithm while name is 'default') ({NAME_ALLOWED}; not starting with '.'; at most "
        f"{MAX_NAME} characters)")
    seed: int = option(0, "seed of every random draw (model init, partition, sampling, random topologies); "
        "0 .. 2^63 - 1")
    rounds: int = option(200, "communication rounds to run", interval="[1, inf)")
    # algorithm and its hyperparameters (None = the algorithm's default)
    algorithm: str = option("dfedsam-mgs", "the algorithm, decentralized (gossip) or centralized (a server): dfl "
        "list algorithms")
    rho: float | None = option(None, "SAM perturbation radius", interval="[0, inf)")
    sam: str | None = option(None, "SAM variant: sam or asam", choices=("sam", "asam"))
    asam_eta: float | None = option(None, "ASAM eta", interval="[0, inf)")
    asam_form: str | None = option(None, "ASAM's scale T: kwon (Kwon et al. 2021: |w| + asam_eta on weights, 1 on "
        "biases) or dp-fedsam (the DP-FedSAM code: |w| on every tensor, no eta)",
        choices=("kwon", "dp-fedsam"))
    momentum: float | None = option(None, "local momentum", interval="[0, 1)")
    gossip_steps: int | None = option(None, "gossip steps Q per round", interval="[1, inf)")
    # centralized FL (docs/reference/update-rules.md#centralized-conventions; None = the algorithm's default)
    participation: float | None = option(None, "centralized: fraction of clients per round (1 = all)",
        interval="(0, 1]")
    participation_mode: str | None = option(None, "centralized: uniform (round(f*N) without replacement) or bernoulli "
        "(each w.p. f)", choices=PARTICIPATION_MODES)
    aggregation: str | None = option(None, "centralized server weights: uniform (1/|S_t|) or size (n_i / sum of n_j)",
        choices=AGGREGATIONS)
    server_lr: float | None = option(None, "centralized server learning rate (1 = plain averaging; FedAdam/FedYogi/"
        "FedAdagrad: the adaptive step eta)", interval="(0, inf)")
    server_momentum: float | None = option(None, "server momentum (FedAvgSM/SLM, DOMO, MimeLite)", interval="[0, 1)")
    fedcm_alpha: float | None = option(None, "FedCM/MoFedSAM weight of the local gradient (1 = FedAvg/FedSAM)",
        interval="[0, 1]")
    domo_alpha: float | None = option(None, "DOMO/DOMO-S fusion coefficient (0 = FedAvgSLM-Z)", interval="[0, inf)")
    feddyn_alpha: float | None = option(None, "FedDyn regularisation alpha", interval="(0, inf)")
    fedgloss_beta: float | None = option(None, "FedGLoSS beta (ADMM penalty 1/beta)", interval="(0, inf)")
    server_rho: float | None = option(None, "FedGLoSS server SAM radius (the client radius is --rho)",
        interval="[0, inf)")
    prox_mu: float | None = option(None, "FedProx proximal coefficient mu: each local objective gains "
        "mu/2 ||x - x_t||^2 (0 = FedAvg)", interval="[0, inf)")
    server_beta1: float | None = option(None, "FedAdam/FedYogi/FedAdagrad first-moment decay beta1 of the server "
        "(0 = no momentum)", interval="[0, 1)")
    server_beta2: float | None = option(None, "FedAdam/FedYogi second-moment decay beta2 of the server",
        interval="[0, 1)")
    server_tau: float | None = option(None, "FedAdam/FedYogi/FedAdagrad adaptivity tau: x += eta m/(sqrt(v) + tau)",
        interval="(0, inf)")
    fedopt_form: str | None = option(None, "FedAdam/FedYogi/FedAdagrad: paper (Reddi et al. Alg. 2: v starts at "
        "tau^2, no bias correction), flower (Flower's: v starts at 0; FedAdam's step bias-corrected with its round "
        "counter) or torch (fedadam only: torch.optim.Adam, as pfl-research)", choices=FEDOPT_FORMS)
    # SAM radius schedule of every SAM algorithm (rho; FedGLoSS: also server_rho): "constant" or "linear"
    rho_schedule: str | None = option(None, "SAM radius schedule: constant or linear (ramp from min(0.001, rho) up to "
        "rho over --rho-ramp-rounds; FedGLoSS: both radii)", choices=RHO_SCHEDULES)
    rho_ramp_rounds: int | None = option(None, "linear rho schedule: rounds of the ramp, >= 2 (0 = no ramp)",
        interval="[0, inf)")
    # the algorithm's own options (its `hyperparameters` that are not Config fields), checked against its defaults
    algorithm_options: dict[str, Any] = option(factory=dict, help="the algorithm's own options (`dfl list "
        "algorithms`), e.g. clip=0.5 (registered algorithms; built-ins take theirs as fields)")
    # topology
    topology: str = option("ring", "communication graph (dfl list topologies)")
    weights: str | None = option(None, "mixing-weight scheme, doubly stochastic or one-sided (row: a biased, weighted "
        "consensus; column: algorithms that mix by push-sum) (unset = the topology's default, metropolis for most); "
        "a scheme's options go in topology_options: dfl list weights")
    topology_options: dict[str, Any] = option(factory=dict, help="topology options, e.g. degree=4, p=0.3, k=2, "
        "shape=(4,4), periodic=True, exponent_base=4, centre=3, groups=4, matrix=W.npy (or .csv, .mtx), "
        "edges=graph.edgelist, sizes=[...] (sample-count), M=8, epsilon=0.5, delta=0.1, eta=0.5, budget=0.3")
    # unreliable network (dfl.network.faults): drawn from the seed per gossip step (links, clients) and per round
    link_failure: float = option(0.0, "probability in [0, 1) that a link is down in a gossip step (decentralized "
        "algorithms, undirected topologies; the weights are recomputed on the surviving links)")
    offline: float = option(0.0, "probability in [0, 1) that a client is offline in a gossip step: it neither sends "
        "nor receives")
    link_failure_burst: float = option(0.0, "0 = links fail independently per gossip step; B >= 1/(1 - link_failure) = "
        "failures in bursts (Gilbert–Elliott) of mean B steps, link_failure still the fraction of steps down")
    offline_burst: float = option(0.0, "0 = clients go offline independently per gossip step; B >= 1/(1 - offline) = "
        "outages of mean B steps (Gilbert–Elliott), offline still the fraction of steps a client is away")
    stragglers: float = option(0.0, "probability in [0, 1] that a client is slow in a round (--straggler-slowdown "
        "times slower)")
    straggler_slowdown: float = option(4.0, "simulated seconds per local step of a slow client (1 for the others), >= "
        "1")
    round_deadline: float = option(0.0, "simulated seconds per round: a client sends after the local steps it finished "
        "by then; 0 = no deadline")
    # compressed gossip (dfl.network.choco, dfl.network.compression): CHOCO-GOSSIP with error feedback
    compressor: str = option("none", "compressed gossip (CHOCO-GOSSIP with error feedback, decentralized algorithms, "
        "static topologies): none (exact gossip) or a compressor (dfl list compressors)")
    compression: float | None = option(None, "the compressor's parameter (unset = its default); what it means, its "
        "type and range are the compressor's card's: dfl list compressors")
    consensus_lr: float | None = option(None, "CHOCO consensus step size gamma in (0, 1] (compressed gossip; unset = "
        "the compressor's omega: dfl list compressors)")
    # asynchronous gossip in simulated time (dfl.engine.asynchronous); 1 local step = 1 simulated second
    mode: str = option("sync", "sync (rounds in lock-step) or async (every client on its own simulated clock, mixing "
        "the neighbour models that have arrived: AD-PSGD style)",
        choices=("sync", "async"))
    link_latency: float = option(0.1, "async: simulated seconds a message travels on a link (1 local step = 1 s), >= 0")
    link_bandwidth: float = option(1e6, "async: bytes per simulated second of a client's uplink, which sends one "
        "message at a time; 0 = unlimited")
    max_staleness: int = option(-1, "async: a client mixes neighbour models at most this many updates behind its own, "
        "waiting otherwise; -1 = unbounded")
    # Byzantine clients and robust aggregation (dfl.network.byzantine, dfl.network.robust; checks in
    # dfl.network.byzantine_settings)
    byzantine: float = option(0.0, "Byzantine clients: a count >= 1 or a fraction in (0, 1) of the clients, chosen "
        "from the seed; they send attack messages and are left out of every metric; 0 = none", interval="[0, inf)")
    attack: str | None = option(None, "what the Byzantine clients send (needed when byzantine > 0; a registered "
        "attack: `dfl list attacks`)")
    attack_scale: float | None = option(None, "the attack's strength: sign-flip s, gaussian std, alie z, ipm epsilon",
        interval="(0, inf)")
    aggregator: str = option("mean", "how a client (decentralized) or the server (centralized) combines the models it "
        "receives (a registered aggregator: `dfl list aggregators`)")
    trim: int | None = option(None, "b of trimmed-mean (drops the b largest and b smallest per coordinate; "
        "bridge-trimmed-mean: of the neighbours' values), krum "
        "(assumes b Byzantine inputs) and adaptive clipped-gossip (clips the b farthest neighbours); unset = the most "
        "Byzantine inputs a receiver has", interval="[0, inf)")
    clip_radius: float | None = option(None, "tau of clipped-gossip (unset = adaptive) and centered-clipping (needed)",
        interval="(0, inf)")
    # client-level differential privacy (dfl.training.privacy: clip + Gaussian noise; dfl.training.accountant)
    dp_clip: float = option(0.0, "differential privacy: each client's round update Y - X is clipped to this L2 norm C "
        "before it is shared, plus Gaussian noise; 0 = off", interval="[0, inf)")
    dp_noise: float | None = option(None, "differential privacy: noise multiplier sigma, the noise's std is sigma*C "
        "per coordinate (unset = 1.0)", interval="[0, inf)")
    dp_delta: float | None = option(None, "differential privacy: the delta at which epsilon is reported (unset = "
        "1e-5)", interval="(0, 1)")
    # clients and data
    clients: int = option(16, "number of clients", interval="[1, inf)")
    dataset: str = option("mnist1d", "the data set (dfl list datasets)")
    data_root: str | None = option(None, "directory of a file-backed dataset (dfl list datasets says which read one)")
    dataset_options: dict[str, Any] = option(factory=dict, help="dataset options, e.g. num_samples=4000 seed=42 "
        "test_fraction=0.2")
    partition: str = option("dirichlet", "how the train set is split among clients (dfl list partitions)")
    alpha: float | None = option(None, "Dirichlet concentration (dirichlet partitions only; unset = 0.3)",
        interval="(0, inf)")
    partition_options: dict[str, Any] = option(factory=dict, help="partition options, e.g. shards_per_client=2")
    # model
    model: str = option("cnn1d", "the model, built in (dfl list models) or your own factory as "
        "package.module:factory (importable from the working directory; docs/how-to/own-model.md)")
    model_options: dict[str, Any] = option(factory=dict, help="model options, e.g. hidden=[128] (a factory's "
        "keyword-only parameters)")
    # local training
    lr: float = option(0.1, "local learning rate", interval="(0, inf)")
    lr_schedule: str = option("exponential", "learning-rate schedule: exponential (lr * lr_decay^t), cosine (to "
        "--lr-min over the run) or step (x --lr-step-factor at each of --lr-milestones)", choices=LR_SCHEDULES)
    lr_decay: float = option(0.998, "exponential schedule: decay per round, lr_t = lr * lr_decay^t",
        interval="(0, inf)")
    lr_min: float = option(0.0, "cosine schedule: the learning rate it anneals to, < lr", interval="[0, inf)")
    lr_milestones: list[int] = option(factory=list, help="step schedule: rounds after the warmup at which lr is "
        "multiplied by --lr-step-factor")
    lr_step_factor: float = option(0.1, "step schedule: factor applied at each milestone", interval="(0, 1]")
    warmup_rounds: int = option(0, "rounds of linear warmup lr * (t + 1) / W before the schedule, < rounds; 0 = off",
        interval="[0, inf)")
    weight_decay: float = option(0.0, "weight decay: L2 added to the gradient (sgd, adam) or decoupled (adamw)",
        interval="[0, inf)")
    clip_grad_norm: float = option(0.0, "per-client gradient-norm clip; 0 = off", interval="[0, inf)")
    local_optimizer: str = option("sgd", "local optimizer: sgd (with --momentum), adam or adamw (torch semantics)",
        choices=LOCAL_OPTIMIZERS)
    adam_betas: list[float] = option(factory=lambda: list(ADAM_DEFAULTS["adam_betas"]), help="adam/adamw: beta1 beta2, "
        "each in [0, 1)")
    adam_eps: float = option(1e-8, "adam/adamw: epsilon added to the root of the second moment", interval="(0, inf)")
    local_optimizer_state: str = option("reset", "adam/adamw moments: reset (fresh every round) or keep (per client, "
        "across rounds)", choices=LOCAL_OPTIMIZER_STATES)
    batch_size: int = option(32, "minibatch size per local step, at most a client's data (0 = full batch)",
        interval="[0, inf)")
    local_epochs: int | None = option(None, "local epochs per round (set this or --local-steps; unset = 1 epoch)",
        interval="[1, inf)")
    local_steps: int | None = option(None, "local steps per round (instead of --local-epochs)", interval="[1, inf)")
    client_chunk: int | str = option("auto", "clients per vectorised call: auto (measured), 0 = all at once, or N")
    compile: bool = option(False, "torch.compile the per-client gradient (faster rounds after ~10 s of compiling)")
    precision: str = option("fp32", "fp32, bf16 (local forward/backward under bf16 autocast) or tf32 (TF32 matmuls and "
        "convolutions on CUDA)", choices=PRECISIONS)
    kernels: str = option("deterministic", "CUDA kernels: deterministic (the same numbers every run) or fast (cuDNN "
        "autotuning: faster convolutions, not bitwise repeatable)", choices=KERNELS)
    # evaluation and output. client_eval_samples: the per-client accuracy costs m × (its samples) forward passes per
    # evaluation while a round's training costs about the same whatever m (the data is split among the clients): on
    # CIFAR-10's 10,000 test samples, 100 clients cost 1M passes per evaluation and 1,000 clients 10M, more than a
    # round of training. 2,000 samples (a standard error of about 1.1 points on one client's accuracy) cost 5x less
    # and keep it below training at 1,000 clients; test sets of at most 2,000 samples are evaluated whole as before.
    eval_every: int = option(5, "rounds between evaluations", interval="[1, inf)")
    eval_batch_size: int = option(1024, "batch size of evaluation", interval="[1, inf)")
    train_eval_samples: int = option(2000, "training samples for the averaged model's train loss/accuracy",
        interval="[0, inf)")
    client_eval_samples: int = option(2000, "test samples for each client's accuracy (a fixed seeded subset, the same "
        "for every client; like train_eval_samples); 0 = the whole test set", interval="[0, inf)")
    # personalized evaluation: each client holds out this fraction of its data (stratified by label) as its local
    # test set, and trains on the rest; adds personal_acc_* and global_acc_* (dfl.data.local_test). 0 = off
    local_test_fraction: float = option(0.0, "fraction of each client's data held out (stratified by label) "
        "as its local test set for personal_acc / global_acc; 0 = off", interval="[0, 1)", note="0 = off")
    personal_train_eval: bool = option(False, "also score each client's own model on its own training data at every "
        "evaluation (personal_train_acc_mean/_std/_min: the train accuracy of personalized-FL tables)")
    checkpoint_every: int = option(0, "rounds between checkpoints; 0 = at every evaluation", interval="[0, inf)")
    hessian_every: int = option(0, "rounds between top-Hessian-eigenvalue measurements; 0 = off", interval="[0, inf)")
    hessian_samples: int = option(1000, "training samples the Hessian is taken on", interval="[1, inf)")
    hessian_iters: int = option(20, "power-iteration steps per Hessian measurement", interval="[1, inf)")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    threads: int | str = option("auto", "torch threads of the process (each sweep worker, each torchrun rank): auto "
                                "(OMP_NUM_THREADS if set, else its CPU cores shared among a machine's ranks) or N")
    progress: bool = option(True, "show a progress line per round")
    # live metrics and early stopping (`dfl.engine.hooks`, `dfl.loggers`)
    loggers: list[str] = option(factory=list, help="live metrics: tensorboard (event files in RUN/tensorboard/) and/or "
        "wandb (Weights & Biases, if installed); --log NAME, repeated or comma-separated; --log '' for none")
    target_accuracy: float | None = option(None, "test accuracy: summary.json records rounds_to_target, the "
        "first evaluated round reaching it", interval="(0, 1]", note="a test accuracy fraction, e.g. 0.8 for 80%")
    stop_at_target: bool = option(False, "stop the run (status stopped) at the first evaluation reaching "
        "--target-accuracy")
    # multi-process (torchrun); a plain `dfl run` is a world of one
    backend: str = option("auto", "torchrun backend: auto (nccl with CUDA, else gloo), nccl or gloo",
        choices=("auto", "nccl", "gloo"))
    gossip_mode: str = option("p2p", "torchrun gossip: p2p (neighbours only) or allgather (whole stack, then W^Q "
        "locally)", choices=("p2p", "allgather"))
    dist_timeout: float = option(300.0, "torchrun: seconds before a collective waiting on a dead rank fails",
        interval="(0, inf)")
    gather_params: bool = option(False, "torchrun: assemble every client's final parameters on rank 0's host and write "
        "one params.pt (m x d on one host); off, each rank writes its own rows to params.shards/, which "
        "dfl.Result.params and dfl landscape read back")

    def __post_init__(self) -> None:
        """A value of the wrong type is refused at once.

        `ArgumentError` (a ConfigError and the TypeError Python users expect) listing every wrong field and what it
        takes, the message `validate` gives. A config whose values all have their types is built even when some are out
        of range: `validate` refuses those, so a config can be built, changed and then checked.
        """
        if any(_type_problem(getattr(self, f.name), str(f.type)) is not None for f in fields(self)):
            problems = self.problems()  # every wrong field at once, those of the right type but out of range too
            raise ArgumentError("; ".join(problems), problems)

    # ------------------------------------------------------------------ conversion
    def to_dict(self) -> dict[str, Any]:
        """Every field by name (what config.toml holds, with `None` fields kept)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str | None = None,
                  owner: Callable[[str], str | None] | None = None) -> Config:
        """A Config of these fields, the others at their defaults; each value has its field's type.

        `source` (e.g. "config file run.toml") starts every message. `owner(key)` may say where a key that is no
        field belongs (e.g. "[topology_options]"): `dfl.engine.validation.option_owner` knows the components'
        options, which this module does not.

        Raises:
            ConfigError: `values` is not a table, or has keys that are no field or values of the wrong type:
                every such key in one message (one line), each with its key and what it takes.
        """
        where = f"{source}: " if source else ""
        if not isinstance(values, dict):
            raise ConfigError(f"{where}a config is a table of fields (key = value), got {_shown(values)}")
        problems = [f"{where}{message}" for message in _structure(values, owner)]
        if problems:
            raise ConfigError("; ".join(problems), problems)
        return cls(**values)

    @classmethod
    def from_toml(cls, path: str | Path, owner: Callable[[str], str | None] | None = None) -> Config:
        """A Config from a TOML file of fields (a run directory's config.toml, or one written by hand).

        Raises:
            ConfigError: the file cannot be read as TOML (missing, a directory, not UTF-8, a syntax error: one
                line naming the file, `read_toml`), or keys that are no field, or values of the wrong type or out
                of range: every wrong key of the file in one message, each with the file and the key. (Rules
                between fields and the components' own checks are `dfl.validate`'s; `load` gives both at once.)
        """
        config, problems = cls.load(path, owner)
        if problems:
            raise ConfigError("; ".join(problems), problems)
        return config

    @classmethod
    def load(cls, path: str | Path, owner: Callable[[str], str | None] | None = None) -> tuple[Config, list[str]]:
        """The Config of a TOML file's keys that are right, and one problem per key that is not.

        A key that is no field (with the field meant: "did you mean"), or whose value has the wrong type or is out
        of range, is left at its default in the Config and named in the problems, each starting "config file PATH:
        KEY ...", so that `dfl run FILE` can check the rest too and report every mistake of the file at once.

        Raises:
            ConfigError: the file cannot be read as TOML, or does not hold a table (`read_toml`).
        """
        values = read_toml(path, "config file")
        wrong = _key_problems(values, owner, check_values=True)
        problems = [f"config file {path}: {message}" for message in wrong.values()]
        return cls(**{k: v for k, v in values.items() if k not in wrong}), problems

    def to_toml(self) -> str:
        """TOML text; `None` fields are omitted (TOML has no null), so loading it back restores them.

        Raises:
            ConfigError: a field holds a Python object TOML cannot write (a networkx graph, an array), naming it.
        """
        values = {k: v for k, v in self.to_dict().items() if v is not None}
        for name, value in values.items():  # the options tables' check of `validate`, for an unvalidated Config
            if isinstance(value, dict):
                _toml_table(name, value)
        return tomli_w.dumps(values)

    def replace(self, **changes: Any) -> Config:
        """A copy with these fields changed (not validated: call `validate` or `dfl.validate`)."""
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ validation
    def validate(self) -> Config:
        """Check every field on its own and the rules between fields; return the config.

        Check each field on its own (type, range, fixed choices), then the rules between fields of one concern
        (schedules, local optimizer); raise one `ConfigError` listing every mistake, each naming the field and the
        allowed values. The names of registered components and the rules that join components are checked by
        `dfl.validate(config)`.
        """
        problems = self.all_problems()
        if problems:
            raise ConfigError("; ".join(problems), problems)
        return self

    def all_problems(self) -> list[str]:
        """Every mistake `validate` finds, each field on its own and then each rule between fields, at once.

        The rules check a copy whose fields already found wrong are at their defaults, so that one mistake is said
        once (rounds = 0 is not also "warmup_rounds must be < rounds"; `gather`).
        """
        found = self.problems()
        wrong = {field_of(problem) for problem in found} & {f.name for f in fields(self)}
        defaults = Config()
        safe = self.replace(**{name: getattr(defaults, name) for name in wrong})
        return gather([safe._validate_chunk, safe._validate_stopping, safe._validate_local_work,
                       safe._validate_lr_schedule, safe._validate_local_optimizer, safe._validate_precision,
                       safe._validate_hessian], found)

    def _validate_hessian(self) -> None:
        """The Hessian's sample and iterations only with its measurements on: set without them, nothing reads them."""
        if self.hessian_every:
            return
        for name in ("hessian_samples", "hessian_iters"):
            default = next(f.default for f in fields(Config) if f.name == name)
            if getattr(self, name) != default:
                raise ConfigError(f"{name} = {getattr(self, name)!r} applies only with hessian_every > 0 (the rounds "
                                  f"between Hessian measurements), but hessian_every = 0; set hessian_every, or "
                                  f"remove {name} (default {default})")

    def _validate_chunk(self) -> None:
        if isinstance(self.client_chunk, int) and self.client_chunk > self.clients:  # not "auto"; 0 is all
            raise ConfigError(f"client_chunk = {self.client_chunk} is larger than clients = {self.clients}; "
                              "use a chunk <= clients, 0 (all at once) or \"auto\"")

    def _validate_local_work(self) -> None:
        if self.local_epochs is not None and self.local_steps is not None:
            raise ConfigError("set only one of local_epochs and local_steps (got both)")

    def _validate_precision(self) -> None:
        if self.precision == "tf32" and self.device == "cpu":  # device auto: known when the run resolves it
            raise ConfigError("precision = tf32 needs a CUDA device (the run is on cpu); use fp32 or bf16")

    def problems(self, names: Any = None) -> list[str]:
        """One message per wrong field among `names`, each field checked on its own.

        What is wrong with each field on its own (its type, then its allowed values), one message per wrong
        field, for the fields `names` (default: all).
        """
        found = []
        for f in fields(self):
            if names is not None and f.name not in names:
                continue
            try:
                _check_field(f, getattr(self, f.name))
            except ConfigError as exc:
                found.append(str(exc))
        return found

    def _validate_local_optimizer(self) -> None:
        """Adam's options only with Adam (which algorithms accept Adam: `dfl.algorithms.check_config`)."""
        if self.local_optimizer == "sgd":
            for name, default in ADAM_DEFAULTS.items():
                value = getattr(self, name)
                if (list(value) if name == "adam_betas" else value) != default:
                    raise ConfigError(f"{name} = {value!r} applies only to local_optimizer = adam or adamw, but "
                                      f"local_optimizer = sgd; remove it (or set it to its default {default!r})")
        # an algorithm's default momentum is SGD's and does not apply to Adam (`Context.rule`); a set one is an error
        elif self.momentum is not None and self.momentum > 0:
            raise ConfigError(f"momentum = {self.momentum} is SGD's heavy ball; local_optimizer = "
                              f"{self.local_optimizer} has its own first moment (adam_betas[0]): remove momentum")

    def _validate_stopping(self) -> None:
        if self.stop_at_target and self.target_accuracy is None:
            raise ConfigError("stop_at_target = true needs target_accuracy (the test accuracy in (0, 1] to stop at, "
                              "e.g. --target-accuracy 0.8)")

    def _validate_lr_schedule(self) -> None:
        milestones = self.lr_milestones
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


def field_of(problem: str) -> str:
    """The field a problem's message names first: "rounds must be ..." -> rounds, "x_options.k: ..." -> x_options."""
    return problem.split(" ", 1)[0].split(".", 1)[0].rstrip(":,")


def gather(checks: Any, found: list[str]) -> list[str]:
    """`found` (the fields' own problems), then the problems each of `checks` raises, every mistake once.

    A check is a callable that raises `ConfigError` (its `problems`). One that fails otherwise once a mistake is
    found is skipped: a field already found wrong (of the wrong type, say) makes it meaningless. A problem of a field
    `found` already names is left out, as the same mistake said twice (and so is a message said before).
    """
    problems, named = list(found), {field_of(p) for p in found}
    for check in checks:
        try:
            check()
        except ConfigError as exc:
            problems += [p for p in exc.problems if p not in problems and field_of(p) not in named]
        except Exception:  # noqa: BLE001 (a check that cannot run on a field already reported)
            if not problems:
                raise
    return problems


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if not (isinstance(value, str) and value in allowed):
        close = [c for c in allowed if isinstance(value, str) and c.lower() == value.strip().lower()]
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {_shown(value)}{hint}")


# ---------------------------------------------------------------------------------------------- reading
def read_toml(path: str | Path, what: str = "TOML file") -> dict[str, Any]:
    """The table a TOML file holds, read by `dfl.files.read_toml` (the one reader of every file dfl takes).

    Any failure is one `ConfigError` line naming the file (`what` says what it is: "config file", "sweep file") and
    what is wrong: missing, a directory, a device or pipe (never opened), unreadable, UTF-16 or otherwise not UTF-8,
    or not TOML (with tomllib's line and column). A UTF-8 byte-order mark, which some editors write, is skipped.

    Raises:
        ConfigError: the `FileReadError`'s one line, as a configuration mistake.
    """
    try:
        return files.read_toml(path, what)
    except FileReadError as exc:
        raise ConfigError(str(exc)) from None


def _structure(values: dict[Any, Any], owner: Callable[[str], str | None] | None,
               check_values: bool = False) -> list[str]:
    """What is wrong with the keys of a table of fields, in the table's order (`_key_problems`' messages)."""
    return list(_key_problems(values, owner, check_values).values())


def _key_problems(values: dict[Any, Any], owner: Callable[[str], str | None] | None,
                  check_values: bool = False) -> dict[Any, str]:
    """Each wrong key of a table of fields and what is wrong with it, in the table's order.

    Keys that are no field (with the field meant, or where the key belongs), values of the wrong type and, with
    `check_values`, values outside their field's allowed ones (`_check_field`).
    """
    known = {f.name: f for f in fields(Config)}
    problems: dict[Any, str] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            problems[key] = f"config keys are field names (strings), got {_shown(key)}"
        elif key not in known:
            problems[key] = f"unknown config field {key!r}{_unknown_hint(key, known, owner)}"
        elif check_values:
            try:
                _check_field(known[key], value)
            except ConfigError as exc:
                problems[key] = str(exc)
        else:
            problem = _type_problem(value, str(known[key].type))
            if problem is not None:
                problems[key] = f"{key} must be {problem}, got {_shown(value)}"
    return problems


def unknown_field_hint(key: str, owner: Callable[[str], str | None] | None = None) -> str:
    """What follows "unknown config field KEY": " (did you mean 'rounds'?)", where it belongs, or where to look."""
    return _unknown_hint(key, {f.name: f for f in fields(Config)}, owner)


def _unknown_hint(key: str, known: dict[str, Any], owner: Callable[[str], str | None] | None) -> str:
    """Where a key that is no field belongs: a component's option table (`owner`), or a field of a close name."""
    table = owner(key) if owner is not None else None
    if table:
        return f": {key} is {table}"
    normal = key.strip().lower().replace("-", "_")
    if normal in known:
        return f" (did you mean {normal!r}?)"
    close = difflib.get_close_matches(normal, list(known), n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    tables = ", ".join(f"[{name}]" for name in known if name.endswith("_options"))
    return f"; an option of a component goes in its table ({tables}); the fields are listed by dfl run --help"


def _type_problem(value: Any, kind: str) -> str | None:
    """None when `value` has the type `kind` (a field's annotation as written), else what the field takes."""
    base = kind.replace(" | None", "")
    if value is None:
        return None if "None" in kind else _type_problem(_MISSING, base)
    if base == "int | str":
        return None if isinstance(value, str) else _int_problem(value, "an integer or \"auto\"")
    if base.startswith("list["):
        item = base[5:-1]
        ok = isinstance(value, (list, tuple)) and all(_type_problem(v, item) is None for v in value)
        return None if ok else {"int": "a list of integers", "float": "a list of numbers"}.get(item, "a list of names")
    if base.startswith("dict["):
        ok = isinstance(value, dict) and all(isinstance(k, str) for k in value)
        return None if ok else "a table of key = value (keys are option names)"
    if base == "int":
        return _int_problem(value, "an integer")
    if base == "float":
        return _float_problem(value)
    if base == "str":
        return None if isinstance(value, str) else "a string"
    return None if isinstance(value, bool) else "true or false"


_MISSING = object()  # a value of no field's type: what `_type_problem` describes for None in a field without None


def _int_problem(value: Any, kind: str) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return kind
    if not -MAX_INT - 1 <= value <= MAX_INT:  # numpy, torch and TOML hold 64-bit integers
        return "an integer that fits in 64 bits (at most 2^63 - 1)"
    return None


def _float_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "a finite number"
    try:
        float(value)
    except OverflowError:  # an int beyond the largest float
        return "a number within the float range (about 1.8e308)"
    return None


def _shown(value: Any, limit: int = 80) -> str:
    """`value` as a message shows it.

    Its repr on one line, cut at `limit` characters, with its type when that is not plain from the repr (a list, a
    table, ...).
    """
    if isinstance(value, int) and value.bit_length() > 256:  # repr refuses ints above 4300 digits
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value).replace("\n", "\\n")
    except Exception:  # noqa: BLE001 (an object whose repr fails still gets a message)
        text = f"<{type(value).__name__} object>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    scalar = isinstance(value, (bool, int, float, str)) or value is None
    return text if scalar else f"{type(value).__name__} {text}"


def _check_field(f: Field, value: Any) -> None:
    """ConfigError unless `value` suits field `f` on its own.

    Its type, then its allowed values (a fixed set, a number's interval, and the rules of a few fields: name, seed,
    device, client_chunk, adam_betas, loggers).
    """
    name, meta, kind = f.name, f.metadata, str(f.type)
    if value is None and "None" in kind:  # unset: the algorithm's (or the component's) default
        return
    problem = _type_problem(value, kind)
    if problem is not None:
        if name in _OWN_TYPE_CHECK:  # a field whose own check names its type and range says more
            _FIELD_CHECKS[name](value)
        if name in _TYPE_MESSAGES:
            raise ConfigError(_TYPE_MESSAGES[name](value))
        if meta["interval"] is not None and "64 bits" not in problem:  # "an integer >= 1", "a finite number > 0"
            problem = f"{problem} {meta['interval'].describe()}"
        raise ConfigError(f"{name} must be {problem}, got {_shown(value)}")
    if meta["choices"] is not None:
        _choice(name, value, meta["choices"])
    if meta["interval"] is not None:
        meta["interval"].check(name, value, integer=kind.startswith("int"), note=meta["note"])
    if isinstance(value, dict):
        _toml_table(name, value)
    check = _FIELD_CHECKS.get(name)
    if check is not None:
        check(value)


def _toml_table(name: str, table: dict[str, Any]) -> None:
    """The values of an options table must be what config.toml can record (so the run can be run again from it).

    Strings, 64-bit integers, numbers, booleans, lists and tables of them; a ConfigError names the first key that is
    not.
    """
    for key, value in table.items():
        bad = _not_toml(value)
        if isinstance(bad, int) and not isinstance(bad, bool):
            raise ConfigError(f"{name}.{key} must be an integer that fits in 64 bits (at most 2^63 - 1), got "
                              f"{_shown(bad)}")
        if bad is not _TOML:
            hint = " (an array: pass .tolist(), or save it to a file and give its path)" if hasattr(
                bad, "tolist") else ""
            raise ConfigError(f"{name}.{key} must be a TOML value (a string, number, true/false, or a list or table "
                              f"of them), which config.toml records; got {_shown(bad)}{hint}")


_TOML = object()  # what `_not_toml` answers for a value TOML can hold


def _not_toml(value: Any) -> Any:
    """The first part of `value` that TOML cannot hold (None included), or `_TOML`."""
    if isinstance(value, (bool, str, float)):
        return _TOML
    if isinstance(value, int):
        return _TOML if _int_problem(value, "") is None else value
    if isinstance(value, (list, tuple)):
        return next((bad for bad in map(_not_toml, value) if bad is not _TOML), _TOML)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return value
        return next((bad for bad in map(_not_toml, value.values()) if bad is not _TOML), _TOML)
    return value


def _seed(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
        raise ConfigError(f"seed must be an integer in [0, 2^63 - 1] (0 .. {MAX_SEED}), got {_shown(value)}")


def _device(value: str) -> None:
    kind, _, index = value.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"device must be one of {', '.join(DEVICES)} or cuda:N; got {_shown(value)}")


def _client_chunk(value: int | str) -> None:
    if isinstance(value, int) and value < 0:
        raise ConfigError(f"client_chunk must be >= 0, got {value}")
    if value != "auto" and isinstance(value, str):
        raise ConfigError(f"client_chunk must be \"auto\", 0 (all clients in one call) or a positive "
                          f"integer, got {_shown(value)}")


def _adam_betas(betas: list[float]) -> None:
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise ConfigError(f"adam_betas must be two numbers (beta1, beta2) in [0, 1), got {betas!r}")


def _loggers(names: list[str]) -> None:
    # the names themselves are the loggers registry's (`dfl.loggers.check_config`)
    if len(set(names)) < len(names):
        raise ConfigError(f"loggers names a logger twice: {list(names)}")


_FIELD_CHECKS: dict[str, Callable[[Any], None]] = {
    "name": lambda value: _name(value), "seed": _seed, "device": _device, "client_chunk": _client_chunk,
    "adam_betas": _adam_betas, "loggers": _loggers,
}
# fields whose own check runs before the type's message (it names the type and the range together)
_OWN_TYPE_CHECK = ("name", "seed")
# fields whose wrong type gets a message of its own, saying what to do
_TYPE_MESSAGES: dict[str, Callable[[Any], str]] = {
    "model": lambda value: (f"model must be a name or a \"package.module:factory\" string; got a "
                            f"{type(value).__name__} (pass an nn.Module or a factory as dfl.run(config, model=...))"),
    "loggers": lambda value: f"loggers must be a list of logger names (dfl list loggers), got {_shown(value)}",
    "adam_betas": lambda value: f"adam_betas must be two numbers (beta1, beta2) in [0, 1), got {_shown(value)}",
    "max_staleness": lambda value: f"max_staleness must be an integer >= 0, or -1 for unbounded, got {_shown(value)}",
}


def options() -> list[Option]:
    """Every option of a run, in field order.

    The single description that the CLI flags, `dfl run --help` and the docs' options reference are built from.
    """
    starts = {first: title for title, first in SECTIONS}
    section, result = "", []
    for f in fields(Config):
        section = starts.get(f.name, section)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        result.append(Option(f.name, str(f.type), default, f.metadata["choices"], f.metadata["interval"],
                             f.metadata["help"], section))
    return result


def _name(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"name must be a non-empty string of {NAME_ALLOWED}, got {value!r}")
    if len(value) > MAX_NAME:
        raise ConfigError(f"name must be at most {MAX_NAME} characters, got {len(value)}")
    if NAME_RE.fullmatch(value) is None:
        start = " and must not start with '.'" if value.startswith(".") else ""
        raise ConfigError(f"name may contain only {NAME_ALLOWED}{start} (it names the run directory; use --out "
                          f"for another location), got {value!r}")


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
