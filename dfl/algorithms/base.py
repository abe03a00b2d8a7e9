"""The public interface of an algorithm: what a round gets (`Context`, the client stack X) and gives (`RoundStats`).

Writing one needs only this module (and, for a centralized one, `dfl.algorithms.server.ServerAlgorithm`); this
example runs in the test suite (tests/test_doctests.py):

    >>> import numpy as np
    >>> import dfl
    >>> from dfl.algorithms import Algorithm, RoundStats
    >>> @dfl.algorithms.register("periodic-dfedavg")
    ... class PeriodicDFedAvg(Algorithm):
    ...     "Periodic DFedAvg: K local steps every round, one gossip step every `period` rounds."
    ...     hyperparameters = {"momentum": 0.0, "period": 2}  # `momentum`: a Config field; `period`: an option
    ...
    ...     def round(self, t: int) -> RoundStats:
    ...         ctx = self.ctx
    ...         local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t))   # Y = K local steps from X
    ...         self.X, sent = local.Y, np.zeros(ctx.comm.num_clients, dtype=np.int64)
    ...         if (t + 1) % ctx.hp.period == 0:                               # gossip every `period` rounds
    ...             self.X, sent = ctx.gossip.mix(local.Y, t, 1), ctx.gossip.sends(t, 1)   # X <- W_t Y
    ...         return RoundStats(train_loss=local.loss, models_sent=sent)
    >>> config = dfl.Config(algorithm="periodic-dfedavg", algorithm_options={"period": 2}, rounds=2, clients=4,
    ...                     dataset="digits", model="logreg", eval_every=1, progress=False)
    >>> [row["round"] for row in dfl.run(config).history]
    [1, 2]
    >>> dfl.algorithms.ALGORITHMS.unregister("periodic-dfedavg")  # this example's name, freed again

The class's docstring summary line is what `dfl list algorithms` shows.

The runner builds the algorithm once, `cls(ctx, X0)`, then calls `round(t)` for t = 0 … rounds − 1 (from the
checkpoint's round on resume) and evaluates `self.X` after the rounds it chooses.

What a round has
- `self.X`: the client stack, a `[m_local, d]` tensor; row r holds the flat parameters of client
  `ctx.comm.client_ids[r]` (a single process hosts every client: m_local = m). `round` replaces it with the
  stack after the round (the runner reads `self.X`; do not rely on in-place changes alone).
- `ctx.trainer` (`dfl.training.local.LocalTrainer`): `train(X, t, lr, rule, momentum=None, transform=None, rows=None)`
  runs the round's K local steps of every client (or only the local rows `rows`) from X, vectorized, and
  returns `LocalResult(Y, momentum, loss, steps)`: Y `[m_local, d]`, the final heavy-ball buffers (None when
  rule.momentum = 0; pass them back as `momentum=` to keep them across rounds), each client's mean loss and
  step count. `transform(g, y, rows) -> g` corrects each step's direction (SCAFFOLD-style). Lower level:
  `schedule(t)` (the round's minibatches) and `gradient(Xb, batch)` (per-client gradients and losses).
- `ctx.rule(t, **overrides)`: round t's `LocalRule` (ρ_t = `ctx.rho(t)` from `rho` and `rho_schedule`; sam,
  asam_eta, momentum from the hyperparameters; weight_decay, clip_grad_norm and the local optimizer from the
  config) — override any field, e.g. `ctx.rule(t, rho=0, momentum=0.9)`.
- `ctx.lr(t)`: the learning rate η_t of round t under the config's schedule (decay, cosine, step, warmup).
- `ctx.gossip` (`dfl.network.gossip.Gossip`): `mix(Y, s, Q)` applies gossip steps s … s+Q−1, W_{s+Q−1} ⋯ W_s Y, to any
  `[m_local, ...]` stack (models, buffers, ...); `sends(s, Q)` is the `[m]` count of vectors each client sends
  in those steps. Use global step numbers (round t with Q steps: s = tQ) so time-varying graphs advance.
- `ctx.comm`: `client_ids`, `num_clients` (m), `mean_rows(X)` (x̄ over all clients of all processes),
  `sum(tensor)` (over processes), `gather_rows(X)`; the same calls work in a torchrun world of any size.
- `ctx.hp`: the resolved hyperparameters, frozen and typed (below); `ctx.config`: the whole `dfl.Config` (read-only).
- Centralized algorithms subclass `dfl.algorithms.server.ServerAlgorithm`: the global model `self.x`,
  `participants(t)` (the sampled clients and weights), `aggregate(V, w)`, `pseudo_gradient`, `broadcast(x)`,
  `stats(loss, part)` and `skipped()`; the run then uses the complete graph.

What a round returns: `RoundStats(train_loss, models_sent, trained=None, bytes_sent=None)` — the `[m_local]`
mean local losses, the `[m]` numpy count of model-sized vectors each client sent (the runner multiplies by the
bytes of one message, `ctx.gossip.message_bytes`: a model, or its compressed form under compressed gossip, whose
`sends` counts the compressed messages), optionally the `[m_local]` bool mask of clients that trained, and
optionally the round's bytes of all clients when its messages have sizes of their own (DisPFL's sparse models).

Hyperparameters and capabilities: the card. An algorithm's card (`dfl.algorithms.AlgorithmCard`, `Algorithm.card`)
holds every hyperparameter it reads, as a frozen dataclass of typed `param(default, help, ...)` fields
(`dfl.algorithms.spec`), and its capabilities (push-sum, Byzantine clients, differential privacy, compressed gossip,
its asynchronous form, the local optimizers its rule is written for). A built-in binds the card written in
`dfl.algorithms.builtin`; a plug-in may declare `hyperparameters = {"period": 2}` (name → default) and the flags as
class attributes instead, which become its card. A key that is an algorithm Config field (`rho`, `sam`, `asam_eta`,
`momentum`, `gossip_steps`, the server fields: `dfl.algorithms.HYPERPARAMETERS`) is set by that field (`--rho 0.05`);
any other key is an algorithm option, set by `Config.algorithm_options` (`--algorithm-options clip=0.5`, TOML
`[algorithm_options]`, sweeps `algorithm_options.clip = [...]`), checked against its type and allowed values. Both
arrive in `ctx.hp`, one frozen object read by attribute (`ctx.hp.period`) or as a mapping (`ctx.hp["period"]`), and
`summary.json` records them under `hyperparameters`.

Checkpoints. `state()` returns every tensor beyond X that later rounds depend on; `load_state(state)` puts
them back (the default sets attributes of the same names). Entries named in `client_state` have one row
per local client: each process writes its own rows and reads back those of its clients (by client id), so a run
resumes with any number of processes.

Registration (`dfl.algorithms.register(name)`, or the entry-point group `dfl.algorithms` of an installed
package) checks the class: a subclass of `Algorithm` defining `round`, `hyperparameters` a dict of
identifier keys (a Config field that is not an algorithm hyperparameter cannot be one), `client_state` a
tuple of names; it sets `name` to the registered name.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import torch
from typing_extensions import get_protocol_members

import topologies
from dfl.algorithms.builtin import BUILTINS
from dfl.algorithms.spec import AlgorithmCard, Hyperparameters, from_defaults
from dfl.config import Config
from dfl.data import FederatedData
from dfl.data.sampler import Batch, RoundSchedule
from dfl.training.adam import AdamState
from dfl.training.clients import ParamLayout
from dfl.training.local import LocalResult, LocalRule, Proximal, Transform
from dfl.training.privacy import ClientPrivacy


def scheduled_lr(config: Any, t: int) -> float:
    """η_t of `config`'s learning-rate schedule at round t: see `Context.lr`."""
    eta0, warmup = config.lr, config.warmup_rounds
    if t < warmup:
        return eta0 * (t + 1) / warmup
    s = t - warmup
    if config.lr_schedule == "exponential":
        return eta0 * config.lr_decay**s
    if config.lr_schedule == "cosine":
        floor = config.lr_min
        return floor + (eta0 - floor) * (1 + math.cos(math.pi * s / (config.rounds - warmup))) / 2
    if config.lr_schedule == "step":
        return eta0 * config.lr_step_factor ** sum(1 for m in config.lr_milestones if m <= s)
    raise ValueError(f"unknown lr_schedule {config.lr_schedule!r}")


RHO_START = 0.001  # ρ_0 of the linear ramp (FedGLoSS's official code), capped at the final ρ
HP = TypeVar("HP", bound=Hyperparameters)  # an algorithm's resolved hyperparameters (`ctx.hp`)


def scheduled_rho(hp: Hyperparameters, t: int, final: float) -> float:
    """ρ_t for a SAM radius whose final value is `final` (hp: an algorithm's resolved hyperparameters).

    See `Context.rho`. An algorithm without a radius schedule (no `rho_schedule`) keeps ρ constant.
    """
    ramp = hp.get("rho_ramp_rounds", 0)
    if hp.get("rho_schedule", "constant") == "constant" or ramp <= 1:
        return final
    start = min(RHO_START, final)
    return start + (final - start) * min(t / ramp, 1.0)


# ------------------------------------------------------------------------------------ the seams a round uses
# What an algorithm may call on the runner's objects, as structural types: `dfl.training.local.LocalTrainer`,
# `dfl.network.gossip.Gossip` and the communicators of `dfl.network.comm` satisfy them (a type checker, mypy in
# CI, flags an algorithm that calls anything else), and a test double only needs these members.


class LocalTraining(Protocol):
    """The round's local work, vectorized over this process's clients (`dfl.training.local.LocalTrainer`)."""

    data: FederatedData  # the federated training data (every client's sample counts: `data.sizes`)
    mode: str  # "steps" (K = amount local steps) or "epochs" (amount passes over each client's data)
    amount: int
    batch_size: int  # 0: full batch
    seed: int
    privacy: ClientPrivacy | None  # client-level differential privacy of every `train` (None when off)
    layout: ParamLayout  # where each parameter tensor sits in a row of X (names, shapes, offsets, sizes)

    @property
    def client_ids(self) -> Sequence[int]:
        """The global ids of this process's clients, in row order."""
        ...

    def train(self, X: torch.Tensor, round_index: int | np.ndarray, lr: float, rule: LocalRule,
              momentum: torch.Tensor | None = None,
              transform: Transform | None = None,
              rows: torch.Tensor | None = None, adam: AdamState | None = None,
              proximal: Proximal | None = None, mask: torch.Tensor | None = None) -> LocalResult:
        """K local steps of `rule` from X for every local client (or the local rows `rows`; `mask`: sparse training)."""
        ...

    def schedule(self, round_index: int | np.ndarray, rows: torch.Tensor | None = None) -> RoundSchedule:
        """The round's minibatches of the local clients."""
        ...

    def gradient(self, Xb: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client minibatch gradients and losses at the rows Xb = X[batch.rows]."""
        ...

    def sam_gradient(self, Xb: torch.Tensor, batch: Batch, rule: LocalRule) -> tuple[torch.Tensor, torch.Tensor]:
        """∇f(y + ε), the SAM/ASAM gradient of `rule`, and the loss f(y)."""
        ...


class Mixer(Protocol):
    """Gossip over the run's topology (`dfl.network.gossip.Gossip`)."""

    topology: topologies.Topology

    def mix(self, X: torch.Tensor, first_step: int, steps: int) -> torch.Tensor:
        """W_{s+Q−1} ⋯ W_s X for any [m_local, ...] stack."""
        ...

    def sends(self, first_step: int, steps: int) -> np.ndarray:
        """The [m] count of vectors each client sends in those steps."""
        ...

    def message_bytes(self, dim: int, itemsize: int) -> int:
        """Bytes of one message carrying a d-vector (compressed under compressed gossip)."""
        ...


class Communicator(Protocol):
    """This process's clients and the reductions over every process (`dfl.network.comm`)."""

    num_clients: int  # m, over all processes

    @property
    def client_ids(self) -> Sequence[int]:
        """The global ids of this process's rows, in row order."""
        ...

    def mean_rows(self, X: torch.Tensor) -> torch.Tensor:
        """x̄ = (1/m) Σ_i x_i over every client of every process."""
        ...

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of a tensor over processes."""
        ...

    def gather_rows(self, X: torch.Tensor) -> torch.Tensor:
        """All clients' rows in client order (complete on the main process)."""
        ...


class EngineCommunicator(Communicator, Protocol):
    """Everything the engine asks of a communicator: an algorithm's `Communicator`, and the run's own needs.

    Besides the reductions an algorithm uses: where this process stands (rank, world size, main process), the
    device its tensors must be on (None: the run's config decides), the traffic it counted, gossip by any [m, m]
    matrix, the final rows on the main process's host, a barrier, and the failure protocol of a multi-process run
    (`dfl.engine.distributed.failures`). `dfl.network.comm.LocalCommunicator` (one process; the failure methods do
    nothing) and `dfl.engine.distributed.DistributedCommunicator` (torchrun) implement it; a communicator given to
    `dfl.run(comm=...)` is checked against it once, by name (`missing_members`).
    """

    bytes_moved: int  # bytes sent between processes so far, all processes together (the engine restores it)

    @property
    def rank(self) -> int:
        """This process's rank, 0 … world_size − 1."""
        ...

    @property
    def world_size(self) -> int:
        """The number of processes."""
        ...

    @property
    def is_main(self) -> bool:
        """Whether this is the main process (rank 0: it writes the run directory)."""
        ...

    @property
    def device(self) -> torch.device | None:
        """The device every tensor handed to the communicator must be on; None: the config's `device` decides."""
        ...

    @property
    def gossip_mode(self) -> str | None:
        """How gossip crosses processes ("p2p", "allgather"); None in a world of one (nothing crosses)."""
        ...

    def mix(self, M: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """X_local ← M[local, :] X for the global [m, m] matrix M (rows = receivers)."""
        ...

    def assemble_rows(self, X: torch.Tensor) -> torch.Tensor:
        """Every client's rows on the main process's host ([m, ...], client order); this process's rows elsewhere."""
        ...

    def barrier(self) -> None:
        """Wait until every process gets here."""
        ...

    def report_failure(self, exc: BaseException) -> None:
        """Record this process's failure `exc` for the other processes."""
        ...

    def peer_failure(self, exc: BaseException) -> BaseException | None:
        """The `PeerFailure` naming the process whose failure caused `exc` here; None when `exc` is this one's own."""
        ...

    def check_peers(self) -> None:
        """Raise `PeerFailure` when another process's failure is already known here (no communication)."""
        ...

    def finish(self) -> None:
        """This process has done its last collective of the run: the others stop watching it (no collective)."""
        ...

    def close(self) -> None:
        """Release what the communicator holds (a process group it created)."""
        ...


def missing_members(comm: object) -> list[str]:
    """The members of `EngineCommunicator` that `comm` lacks, sorted (by name: signatures are mypy's to check)."""
    return sorted(name for name in get_protocol_members(EngineCommunicator) if not hasattr(comm, name))


@dataclass
class Context(Generic[HP]):
    """Everything a round may use besides the client stack; built by the runner, shared by every round."""

    config: Config  # read-only
    hp: HP  # resolved hyperparameters (frozen, typed): the card's defaults ← Config fields ← algorithm_options
    trainer: LocalTraining  # the round's local steps, vectorized over clients
    gossip: Mixer  # X ← W_s X, and how many vectors each client sends
    comm: Communicator  # client ids, sums and means over every process

    def lr(self, t: int) -> float:
        """The learning rate η_t of round t = 0, …, T−1 (T = `config.rounds`, η_0 = `config.lr`).

        Warmup (W = `warmup_rounds`): for t < W, η_t = η_0 (t + 1)/W, a linear ramp up to η_0. From round W
        on, the schedule proper runs on s = t − W over S = T − W rounds (with W = 0: s = t, S = T):
        - exponential (γ = `lr_decay`): η_t = η_0 γ^s;
        - cosine (η_min = `lr_min`): η_t = η_min + (η_0 − η_min)(1 + cos(π s/S))/2, which starts at η_0 and
          would reach η_min at s = S, just after the last round. It depends on T, so a cosine run cannot be
          extended on resume (`dfl.engine.checkpoint.check_config`);
        - step (milestones m_1 < m_2 < … = `lr_milestones`, counted in s; factor = `lr_step_factor`):
          η_t = η_0 · factor^(number of milestones m_i ≤ s).
        With the defaults (exponential, W = 0) this is η_0 γ^t, computed exactly as before the schedules.
        """
        return scheduled_lr(self.config, t)

    def rho(self, t: int, final: float | None = None) -> float:
        """The SAM radius ρ_t of round t (`final` = the radius it schedules, default the algorithm's `rho`).

        - constant (`rho_schedule`, the default of every SAM algorithm but FedGLoSS): ρ_t = ρ;
        - linear (FedGLoSS's default; T_s = `rho_ramp_rounds`): ρ_t = ρ_0 + (ρ − ρ_0)·min(t/T_s, 1), a ramp
          from ρ_0 = min(0.001, ρ) at t = 0 up to ρ at t = T_s, then constant (FedGLoSS, Caldarola et al. 2025,
          whose official code starts at 0.001). T_s ≤ 1 is constant. The ramp does not depend on `rounds`,
          so a run with it can be extended on resume.
        Algorithms without a `rho` get 0.
        """
        return scheduled_rho(self.hp, t, self.hp.get("rho", 0.0) if final is None else final)

    def rule(self, t: int, **overrides: Any) -> LocalRule:
        """The local rule of round t from the config and this algorithm's hyperparameters (ρ = `rho(t)`).

        The SAM variant (`sam`, `asam_eta`, `asam_form`) and `momentum` are the algorithm's where it declares them,
        `LocalRule`'s plain-SGD defaults where it does not.
        """
        config = self.config
        declared = {name: self.hp[name] for name in ("sam", "asam_eta", "asam_form", "momentum") if name in self.hp}
        if config.local_optimizer != "sgd":  # the heavy ball is SGD's: Adam/AdamW have their own first moment
            declared.pop("momentum", None)
        values = dict(
            rho=self.rho(t),
            **declared,
            weight_decay=config.weight_decay,
            clip_grad_norm=config.clip_grad_norm,
            optimizer=config.local_optimizer,
            adam_betas=tuple(config.adam_betas),
            adam_eps=config.adam_eps,
        )
        values.update(overrides)
        return LocalRule(**values)


@dataclass
class RoundStats:
    """What `Algorithm.round` returns."""

    train_loss: torch.Tensor  # [m_local] mean local minibatch loss per client
    models_sent: np.ndarray  # [m] models each client sent this round (all clients)
    trained: torch.Tensor | None = None  # [m_local] bool: clients that trained this round (None = all)
    # bytes every client of every process sent this round, for messages that are not `message_bytes` each (DisPFL's
    # sparse models); None: models_sent.sum() × ctx.gossip.message_bytes
    bytes_sent: int | None = None


# What a class may declare instead of binding a card (a plug-in's attributes), and the card field each one sets
DECLARED = {"hyperparameters": "hyperparameters", "centralized": "centralized", "local_optimizers": "local_optimizers",
            "push_sum": "push_sum", "byzantine": "byzantine", "dp": "dp", "compression": "compression",
            "asynchronous": "asynchronous"}


class Algorithm(ABC, Generic[HP]):
    """Base class of every algorithm: override `round(t)`; `state`/`load_state` when it keeps state (module doc).

    What the algorithm is (its hyperparameters' specs and its capabilities) is its `card`, an
    `dfl.algorithms.AlgorithmCard`: a built-in binds the one written in `dfl.algorithms.builtin` (`card =
    BUILTINS["name"].card`) and restates nothing of it. A plug-in may bind a card of its own, or declare the facts as
    class attributes (`hyperparameters = {"period": 2}`, `push_sum = True`, ...: the names of `DECLARED`), which
    become its card when the class is made; a class that binds a card and also declares one of them is refused, so
    a fact is never written twice.
    """

    name: ClassVar[str]  # the registered name (set by registration when the class does not declare it)
    card: ClassVar[AlgorithmCard] = AlgorithmCard()
    # The `state()` entries that are per-client: tensors whose rows are this process's clients. Each process
    # writes its rows to the checkpoint's shards; a resume reads back those of `comm.client_ids`
    # (`dfl.engine.checkpoint`).
    # Every other entry is replicated server/global state, identical on every process (rank 0's is saved).
    client_state: tuple[str, ...] = ()  # a class default; an instance adds its optional state (Adam, push-sum)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        declared = [name for name in DECLARED if name in own]
        hooks = [name for name in ("check_hyperparameters", "check_run") if _overrides(cls, name)]
        if "card" in own:
            if declared or hooks:
                raise TypeError(f"{cls.__module__}.{cls.__qualname__} binds a card and also declares "
                                f"{', '.join(declared + hooks)}: a card's facts are written once, on the card "
                                "(its check and run_check included)")
            builtin = next((name for name, entry in BUILTINS.items() if entry.card is cls.card), None)
            if builtin is not None:  # a built-in's name is its card's key
                cls.name = builtin
            section = cls.card.docstring_section()
            cls.__doc__ = f"{(own.get('__doc__') or '').rstrip()}\n\n{_indented(section)}\n"
        elif declared or hooks:
            cls.card = card_of(cls)

    def __init__(self, ctx: Context[HP], X: torch.Tensor):
        self.ctx = ctx
        self.X = X
        # local_optimizer_state = "keep": every client's Adam moments persist across rounds, as per-client state;
        # the algorithm passes them to `trainer.train(..., adam=self.optimizer_state)`. None: fresh every round.
        self.optimizer_state: AdamState | None = None
        config = ctx.config
        if config.local_optimizer != "sgd" and config.local_optimizer_state == "keep":
            self.optimizer_state = AdamState.zeros(X)
            self.client_state = (*type(self).client_state, *AdamState.KEYS)
        # push-sum's weights y ([m_local], all 1 at the start) when W is column-stochastic, else None (see `mix`)
        self.push_weight: torch.Tensor | None = None
        if self.card.push_sum and ctx.gossip.topology.stochastic == "column":
            self.push_weight = torch.ones(X.shape[0], device=X.device, dtype=X.dtype)
            self.client_state = (*self.client_state, "push_weight")

    @classmethod
    def check_hyperparameters(cls, hp: Any) -> None:
        """Refuse hyperparameter values this algorithm cannot run with (a plug-in's hook; a card's `check`).

        Raise ValueError, naming the hyperparameter, for values this algorithm cannot run with (a range, a
        combination). Called with the resolved hyperparameters when the config is validated, before training.
        A spec's `choices` and `interval` are checked before it.
        """
        return None  # an optional hook: the default accepts every value

    @classmethod
    def check_run(cls, config: Config) -> None:
        """Refuse run settings this algorithm's rule does not cover (a plug-in's hook; a card's `run_check`).

        Raise ValueError, one line naming the field, why it does not apply and what to use. Called with the whole
        config when it is validated, before training. The capabilities of the card (push-sum, Byzantine clients,
        differential privacy, compressed gossip, the asynchronous mode) are the combinations table's to check
        (`dfl.engine.combinations`); this hook is for what no capability says.
        """
        return None  # an optional hook: the default accepts every setting the generic checks accept

    @abstractmethod
    def round(self, t: int) -> RoundStats:
        """Communication round t (0-based): update `self.X` (and any state) and return the round's statistics."""

    def mix(self, Y: torch.Tensor, first_step: int, steps: int) -> torch.Tensor:
        """Gossip the clients' updated models Y ([m_local, d], computed from `self.X`): W_{s+Q−1} ⋯ W_s Y.

        On a column-stochastic W this is push-sum (Kempe et al., FOCS 2003), in the form of Stochastic Gradient
        Push (Assran et al., ICML 2019, Algorithm 1): each client keeps a numerator x_i and a weight y_i and trains
        at their ratio z_i = x_i / y_i, which is what `self.X` holds. The round's update Y − z^t is added to the
        numerator unscaled, and numerators and weights are mixed by the same steps:

            x^{t+1/2} = y^t ∘ z^t + (Y − z^t)            (Alg. 1 line 3: x ← x − γ ∇F(z), summed over the steps)
            x^{t+1} = W^Q x^{t+1/2},   y^{t+1} = W^Q y^t  (lines 4–5, one gossip of [x, y]: d + 1 numbers per model)
            z^{t+1} = x^{t+1} / y^{t+1}                   (line 6)

        A column-stochastic W keeps Σ_i x_i and Σ_i y_i = m, so the de-biased z_i reach the average Σ_i x_i / m
        of the updates, where plain gossip X ← W X would drift to a weighted one. With one SGD step a round
        (dfedavg, local_steps = 1) it is SGP exactly. On any other W (y stays 1) this is `ctx.gossip.mix(Y, s, Q)`.
        """
        gossip = self.ctx.gossip
        if self.push_weight is None:
            return gossip.mix(Y, first_step, steps)
        weight = self.push_weight[:, None]
        numerator = torch.addcmul(Y, weight - 1, self.X)  # y ∘ z + (Y − z)
        mixed = gossip.mix(torch.cat([numerator, weight], dim=1), first_step, steps)
        self.push_weight = mixed[:, -1].contiguous()
        return mixed[:, :-1] / mixed[:, -1:]

    def metrics(self) -> dict[str, float]:
        """Metrics of the algorithm's own that every evaluated round's record adds (none by default)."""
        return {}

    def state(self) -> dict[str, torch.Tensor]:
        """Everything beyond X that the next rounds depend on, for checkpoints.

        The per-client entries named in `client_state` ([m_local, ...] rows) and replicated server state.
        """
        state = {} if self.optimizer_state is None else self.optimizer_state.as_dict()
        if self.push_weight is not None:
            state["push_weight"] = self.push_weight
        return state

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Set attributes from `state` (e.g. a checkpoint's, rows already sliced to this process's clients).

        A tensor replacing a tensor attribute must have its shape; it takes the attribute's device and dtype.
        """
        for key, value in state.items():
            adam = key in AdamState.KEYS and self.optimizer_state is not None  # "adam_step" -> optimizer_state.step
            owner, name = (self.optimizer_state, key.removeprefix("adam_")) if adam else (self, key)
            current = getattr(owner, name, None)
            if torch.is_tensor(current) and torch.is_tensor(value):
                if value.shape != current.shape:
                    raise ValueError(
                        f"{self.name} state {key!r}: expected shape {tuple(current.shape)}, got {tuple(value.shape)}"
                    )
                value = value.to(device=current.device, dtype=current.dtype)
            setattr(owner, name, value)


def _overrides(cls: type, method: str) -> bool:
    """Whether `cls` itself defines the classmethod `method` (a plug-in's hook)."""
    return method in cls.__dict__


def card_of(cls: Any) -> AlgorithmCard:
    """The card of a class that declares its facts as attributes (`DECLARED`), the rest from its parent's card.

    `hyperparameters` may be a `Hyperparameters` class or a dict of name → default (`spec.from_defaults`). Its
    `check_hyperparameters` and `check_run` classmethods become the card's `check` and `run_check`.
    """
    parent: AlgorithmCard = next(base.card for base in cls.__mro__[1:] if isinstance(base.__dict__.get("card"),
                                                                                        AlgorithmCard))
    values: dict[str, Any] = {}
    for attribute, key in DECLARED.items():
        if attribute in cls.__dict__ or any(attribute in base.__dict__ for base in cls.__mro__[1:]
                                            if "card" not in base.__dict__ and base is not object):
            values[key] = getattr(cls, attribute)
    hp = values.get("hyperparameters")
    if isinstance(hp, dict):
        try:
            values["hyperparameters"] = from_defaults(cls.__name__, hp)
        except (TypeError, ValueError):  # a name no field can take: refused when registered, with the class named
            values["hyperparameters"] = hp
    elif hp is not None and not (isinstance(hp, type) and issubclass(hp, Hyperparameters)):
        values["hyperparameters"] = hp  # refused when registered (`check_algorithm`), with the class named
    if "local_optimizers" in values:
        values["local_optimizers"] = tuple(values["local_optimizers"])
    if _defines(cls, "check_hyperparameters"):
        values["check"] = cls.check_hyperparameters
    if _defines(cls, "check_run"):
        values["run_check"] = cls.check_run
    return dataclasses.replace(parent, **values)


def _defines(cls: type, method: str) -> bool:
    """Whether a class of `cls`'s MRO below `Algorithm` defines `method`."""
    return any(method in base.__dict__ for base in cls.__mro__ if base is not Algorithm and base is not object
               and issubclass(base, Algorithm))


def _indented(text: str) -> str:
    """A generated docstring section, indented as the class docstring's body is."""
    return "\n".join(f"    {line}" if line else "" for line in text.splitlines())
