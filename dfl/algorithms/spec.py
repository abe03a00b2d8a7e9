"""What an algorithm declares, torch-free: its hyperparameters (typed specs) and its card (capabilities).

An algorithm's hyperparameters are a frozen dataclass, a subclass of `Hyperparameters` (a `dfl.specs.Spec`, the form
every extension point declares its options in), each field declared once with `param(default, help, ...)`: its
name, its type (the annotation), its default, its allowed values (`choices`, or an `interval` such as "(0, 1]") and
one line of help. The same class is the spec the checks, `dfl list`, the options
page and the generated "Hyperparameters" section of the algorithm's docstring read, and the type of `ctx.hp`: a run
gets one frozen instance of it (`dfl.algorithms.resolve_hyperparameters`), read by attribute (`ctx.hp.rho`, checked by
mypy) or as a read-only mapping (`ctx.hp["rho"]`, `dict(ctx.hp)`).

    @dataclass(frozen=True)
    class PeriodicParams(Hyperparameters):
        period: int = param(2, "gossip every `period` rounds", interval="[1, inf)")

A field whose name is a Config field shared by several algorithms (`rho`, `momentum`, `server_lr`, ...:
`dfl.algorithms.HYPERPARAMETERS`) is set by that field (`--rho 0.05`), which checks its range; any other is an
*algorithm option*, set in `Config.algorithm_options` and checked here against its spec. A subclass may redeclare a
field to change its default (`rho: float = param(0.1)`): its help and allowed values are inherited.

`AlgorithmCard` is the rest of what is known of an algorithm before its module (and torch) is imported: its
hyperparameters class and its capability flags (centralized, push-sum, Byzantine clients, differential privacy,
compressed gossip, its asynchronous form, the local optimizers its rule is written for, what it sends). The built-in
cards are `dfl.algorithms.builtin.BUILTINS`; a built-in class binds its card (`card = BUILTINS["name"]`) and states
none of these facts itself. The combinations the flags allow and refuse are `dfl.engine.combinations`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from dfl import specs as option_specs
from dfl.config import options
from dfl.specs import RESERVED, Param, Spec, param

__all__ = ["ADAPTIVE", "ASYNC_FORMS", "HYPERPARAMETERS", "RESERVED", "SGD", "AlgorithmCard", "Hyperparameters", "Param",
           "from_defaults", "param"]

SGD: tuple[str, ...] = ("sgd",)
ADAPTIVE: tuple[str, ...] = ("sgd", "adam", "adamw")  # rules that use local training only through its result
ASYNC_FORMS = ("local", "step")  # an algorithm's update in mode = async (`AlgorithmCard.asynchronous`)


# Config fields that only some algorithms read (None in the Config = the algorithm's default): set by their flags,
# never in algorithm_options. Their type and range are the Config's; a spec gives each its default and meaning.
HYPERPARAMETERS: tuple[str, ...] = (
    "rho", "rho_schedule", "rho_ramp_rounds", "sam", "asam_eta", "asam_form", "momentum", "gossip_steps",
    # centralized algorithms
    "participation", "participation_mode", "aggregation", "server_lr", "server_momentum", "fedcm_alpha",
    "domo_alpha", "feddyn_alpha", "fedgloss_beta", "server_rho", "prox_mu", "server_beta1", "server_beta2",
    "server_tau", "fedopt_form",
)
@dataclass(frozen=True)
class Hyperparameters(Spec):
    """The resolved hyperparameters of a run: frozen, typed attributes, and a read-only mapping of name → value.

    Subclass it with `param(...)` fields (module docstring, `dfl.specs`); an algorithm without hyperparameters uses
    it as is.
    """

    @classmethod
    def specs(cls) -> tuple[Param, ...]:
        """Every hyperparameter's spec, in declaration order; a redeclared field's help and range are inherited.

        A Config field (`HYPERPARAMETERS`) takes the Config's own type and range.
        """
        config = {opt.name: opt for opt in options()}
        return tuple(dataclasses.replace(spec, choices=config[spec.name].choices, interval=config[spec.name].interval,
                                         config_field=True) if spec.name in HYPERPARAMETERS else spec
                     for spec in super().specs())


def from_defaults(name: str, defaults: Mapping[str, Any]) -> type[Hyperparameters]:
    """A `Hyperparameters` class for a plug-in that declares `hyperparameters = {name: default, ...}`.

    Each field's type is its default's (a None default accepts any value, as `algorithm_options` always has).
    """
    return option_specs.from_defaults(name, defaults, Hyperparameters)  # type: ignore[return-value]


@dataclass(frozen=True)
class AlgorithmCard:
    """What is known of an algorithm before its module (and torch) is imported: its specs and capabilities.

    Attributes:
        hyperparameters: the `Hyperparameters` class of its resolved hyperparameters (the spec of each).
        centralized: it aggregates at a server every round (the complete-graph case) instead of gossiping.
        local_optimizers: the local optimizers its rule is written for (`local_optimizer`); Adam/AdamW only where
            it uses local training through its result y_K, not where its rule is written in SGD steps.
        push_sum: it gossips through `Algorithm.mix`, which carries push-sum's weights, so it runs on a
            column-stochastic W (directed graphs).
        byzantine: it shares only its models (no tracker, control variate or server state built from the clients'
            messages), so Byzantine clients and robust aggregators apply.
        dp: every message is a post-processing of the trained models that local training clips and noises, so
            client-level differential privacy (`dp_clip`) covers what it sends.
        compression: each gossip step mixes one model-sized stack, which compressed gossip (CHOCO) keeps one public
            copy of; a centralized algorithm does not gossip.
        asynchronous: its update in mode = async, one client at a time: "local" (K local steps, then one mix of the
            models that have arrived), "step" (one SGD step whose gradient is taken at the model sent: AD-PSGD), or
            None (no asynchronous form).
        sends: what a client sends, in words (the docs' tables).
        refusals: capability → why this algorithm lacks it, one clause that a refusal quotes ("it gossips a
            tracker beside its models ..."); a capability without one gets the generic reason.
        check: `check(hp)` refines the spec's checks of the resolved values (a rule between two of them); raises
            ValueError naming the hyperparameter.
        run_check: `run_check(config)` refuses run settings the rule does not cover that no capability says (a
            plug-in's `check_run`); raises ValueError, one line naming the field.
        round_bytes: `round_bytes(d, itemsize)`, the bytes per client its round holds at once beyond X, its per-client
            state and the memory plan's `[m, d]` temporaries (`dfl.training.memory.ROUND_STACKS`: the trained models,
            a momentum buffer, the gossip output); None: nothing beyond them. The plan counts them before anything
            is allocated (`dfl.training.memory.check_stacks`).
    """

    hyperparameters: type[Hyperparameters] = Hyperparameters
    centralized: bool = False
    local_optimizers: tuple[str, ...] = SGD
    push_sum: bool = False
    byzantine: bool = False
    dp: bool = False
    compression: bool = True
    asynchronous: str | None = None
    sends: str = "its model"
    refusals: Mapping[str, str] = field(default_factory=dict)
    check: Callable[[Any], None] | None = field(default=None, compare=False)
    run_check: Callable[[Any], None] | None = field(default=None, compare=False)
    round_bytes: Callable[[int, int], int] | None = field(default=None, compare=False)

    CAPABILITIES: ClassVar[tuple[str, ...]] = ("push_sum", "byzantine", "dp", "compression", "asynchronous")

    def __post_init__(self) -> None:
        if self.asynchronous not in (None, *ASYNC_FORMS):
            raise ValueError(f"asynchronous must be one of {', '.join(ASYNC_FORMS)} or None, got {self.asynchronous!r}")
        unknown = set(self.refusals) - set(self.CAPABILITIES) - {"local_optimizer"}
        if unknown:
            raise ValueError(f"refusals name no capability: {', '.join(sorted(unknown))}")

    def defaults(self) -> dict[str, Any]:
        """Name → default of every hyperparameter it reads."""
        return self.hyperparameters.defaults()

    def reads(self, name: str) -> bool:
        """Whether it declares the hyperparameter `name`."""
        return name in self.hyperparameters.defaults()

    def specs(self) -> tuple[Param, ...]:
        """Every hyperparameter's spec (`Hyperparameters.specs`)."""
        return self.hyperparameters.specs()

    def why_not(self, capability: str) -> str | None:
        """Why it lacks `capability` in its own words, or None (the generic reason applies)."""
        return self.refusals.get(capability)

    def docstring_section(self) -> str:
        """The "Hyperparameters:" section of its class docstring, generated from the specs."""
        specs = self.specs()
        if not specs:
            return "Hyperparameters: none besides the run's learning rate (`lr`) and local optimizer."
        lines = ["Hyperparameters:", ""]
        for spec in specs:
            line = f"- `{spec.name}` ({_shown(spec.default)}): {spec.help.rstrip('.')}."
            if not spec.config_field:
                allowed = f"; {spec.allowed}" if spec.allowed else ""
                line += f" An algorithm option (`--algorithm-options {spec.name}=...`{allowed})."
            lines.append(line)
        return "\n".join(lines)

def _shown(value: Any) -> str:
    return str(value) if not isinstance(value, str) else value
