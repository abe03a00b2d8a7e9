"""Algorithms: the registry (name -> class) and hyperparameter resolution against a Config.

Adding one (the interface is documented in `dfl.algorithms.base`):

    @dfl.algorithms.register("my-algo")         # in Python; or, from an installed package's pyproject.toml:
    class MyAlgo(Algorithm): ...                # [project.entry-points."dfl.algorithms"]
                                                # my-algo = "my_package.algo:MyAlgo"

A registered name works everywhere a built-in does: `dfl.run(Config(algorithm="my-algo"))`, `dfl run
--algorithm my-algo` (an entry point, as the CLI is a new process), TOML configs, sweeps and `dfl list algorithms`.
"""

from __future__ import annotations

from typing import Any

from dfl.algorithms.builtin import BUILTINS, ServerParams
from dfl.algorithms.registration import HYPERPARAMETERS, check_algorithm, option_defaults, resolve
from dfl.algorithms.spec import AlgorithmCard, Hyperparameters, Param, param
from dfl.config import Config
from dfl.errors import ConfigError
from dfl.lazy import submodules
from dfl.registry import Registry

# the built-ins are declared by card (`dfl.algorithms.builtin`): naming and checking one imports no torch; its
# class is imported when a run builds it (`algorithm_class`)
ALGORITHMS: Registry = Registry("algorithm", group="dfl.algorithms", check=check_algorithm,
                                describe=lambda name, cls: cls.card)
"""Every algorithm the config field `algorithm` takes: name -> `Algorithm` subclass.

The built-ins first (declared by card, so checking a config imports no torch; the class loads on the first
`get`), then those registered with `@dfl.algorithms.register("name")` and installed packages' entry points
(group `dfl.algorithms`). `check_algorithm` vets each class: an `Algorithm` with a `round` and its hyperparameters
declared. `ALGORITHMS.card(name)` is its `AlgorithmCard` (a built-in's without importing it). Read by `dfl.validate`,
`dfl list algorithms` and the runner (`algorithm_class`)."""
for _name, _builtin in BUILTINS.items():
    ALGORITHMS.declare(_name, _builtin.target, _builtin.card)
del _name, _builtin
register = ALGORITHMS.register  # @register("name") class ...: or register("name", cls)

# the interface for writing an algorithm, imported on first use (it imports torch)
__getattr__ = submodules(__name__, {
    "Algorithm": "dfl.algorithms.base", "Context": "dfl.algorithms.base", "RoundStats": "dfl.algorithms.base",
    "ServerAlgorithm": "dfl.algorithms.server", "LocalResult": "dfl.training.local", "LocalRule": "dfl.training.local",
})

__all__ = [
    "ALGORITHMS", "HYPERPARAMETERS", "Algorithm", "AlgorithmCard", "Context", "Hyperparameters", "LocalResult",
    "LocalRule", "Param", "RoundStats", "ServerAlgorithm", "able", "algorithm_class", "card", "check_config",
    "is_centralized", "mixes_by_push_sum", "option_defaults", "param", "readers", "register",
    "resolve_hyperparameters", "unread_fields", "unread_message",
]


def algorithm_class(name: str):
    """The class registered as `name` (imported now; ValueError listing the registered names otherwise)."""
    return ALGORITHMS.get(name)


def card(name: Any) -> AlgorithmCard:
    """The card of algorithm `name` (a built-in's without importing it); ConfigError naming `algorithm` otherwise."""
    return ALGORITHMS.card(name, "algorithm")


def is_centralized(name: str) -> bool:
    """Whether algorithm `name` aggregates at a server rather than gossiping (its card's `centralized`)."""
    return card(name).centralized


def mixes_by_push_sum(name: str) -> bool:
    """Whether algorithm `name` mixes by push-sum, so runs on a column-stochastic W (its card's `push_sum`)."""
    return card(name).push_sum


def able(capability: str) -> list[str]:
    """The registered algorithms whose card has `capability` (a flag of `AlgorithmCard`, or a local optimizer).

    In listing order; `able("compression")` leaves out the centralized ones, which do not gossip.
    """
    def has(entry: AlgorithmCard) -> bool:
        if capability in ("adam", "adamw", "sgd"):
            return capability in entry.local_optimizers
        if capability == "compression" and entry.centralized:
            return False
        return bool(getattr(entry, capability))

    return [name for name in ALGORITHMS.names() if has(ALGORITHMS.card(name))]


def resolve_hyperparameters(config: Config) -> Hyperparameters:
    """The hyperparameters a run of `config` uses: the algorithm's defaults, overridden by its set Config fields.

    The algorithm's declared hyperparameters with their defaults, the Config fields it reads where they are set, and
    `config.algorithm_options`, as one frozen, typed object (`ctx.hp`). A set field the algorithm does not read plays
    no part here: `check_config` refuses it (`unread_fields`). ValueError for an algorithm option that is unknown, of
    the wrong type or not allowed by its spec, or for values the card's `check` refuses.
    """
    return resolve(config, card(config.algorithm))


def unread_fields(config: Config) -> list[str]:
    """The algorithm hyperparameters set in `config` (not None) that its algorithm does not read.

    A field the algorithm does not declare (`rho` for dpsgd), `asam_eta` unless the SAM variant is ASAM in Kwon et
    al.'s form, and `asam_form` unless it is ASAM. Imports nothing (the algorithm's card).
    """
    hp = card(config.algorithm).defaults()
    unread = [name for name in HYPERPARAMETERS if getattr(config, name) is not None and name not in hp]
    sam = config.sam if config.sam is not None else hp.get("sam")
    form = config.asam_form if config.asam_form is not None else hp.get("asam_form")
    if "asam_eta" in hp and config.asam_eta is not None and (sam != "asam" or form == "dp-fedsam"):
        unread.append("asam_eta")  # no eta in plain SAM, nor in the DP-FedSAM form of ASAM
    if "asam_form" in hp and config.asam_form is not None and sam != "asam":
        unread.append("asam_form")
    return unread


def readers(field: str) -> list[str]:
    """The registered algorithms that read the Config field `field` (their cards declare it), in listing order."""
    return [name for name in ALGORITHMS.names() if ALGORITHMS.card(name).reads(field)]


def unread_message(config: Config, field: str) -> str:
    """Why `field` is refused for `config.algorithm`: one line naming the field, its value and what reads it."""
    value = getattr(config, field)
    if field == "asam_eta":
        return (f"asam_eta = {value!r} applies only to sam = asam with asam_form = kwon (the DP-FedSAM form has no "
                f"eta); {config.algorithm} runs sam = {config.sam or 'sam'}: remove asam_eta or set sam = \"asam\"")
    if field == "asam_form":
        return (f"asam_form = {value!r} applies only to sam = asam; {config.algorithm} runs sam = "
                f"{config.sam or 'sam'}: remove asam_form or set sam = \"asam\"")
    return (f"{field} = {value!r} is not read by {config.algorithm}; remove it, or use an algorithm that reads it: "
            f"{', '.join(readers(field)) or 'none is registered'}")


def check_config(config: Config) -> None:
    """The algorithm's part of `dfl.validate`: `algorithm` is registered; server sampling only where it applies.

    participation, participation_mode and aggregation away from their defaults only for an algorithm that takes them
    (a server's: its card's hyperparameters hold them); a default-valued one, as every field the algorithm does not
    read, is refused naming the algorithms that read it (`unread_fields`).

    `algorithm_options` fit its card's specs and its `check` accepts the resolved values; the SAM radius schedule is
    complete. Raises `ConfigError` naming the field. What the algorithm combines with (local optimizers, push-sum,
    compressed gossip, ...) is `dfl.engine.combinations`'s.
    """
    entry = card(config.algorithm)
    for field, default in ServerParams.defaults().items():  # which clients a server samples and how it weighs them
        value = getattr(config, field)
        if value is not None and value != default and not entry.reads(field):
            kind = "the decentralized" if not entry.centralized else "the"
            hint = "; weights = sample-count weighs neighbours by their data" if field == "aggregation" else ""
            raise ConfigError(f"{field} = {value} applies only to the centralized algorithms that take it "
                              f"({', '.join(readers(field))}); {kind} {config.algorithm!r} trains and gossips every "
                              f"client each round, weighted by the topology's W (use {default} or unset{hint})")
    unread = unread_fields(config)
    if unread:  # refused, never ignored: a set field that the run would not read is a mistake (every one at once)
        problems = [unread_message(config, name) for name in unread]
        raise ConfigError("; ".join(problems), problems)
    try:
        hp = resolve(config, entry)
        if entry.run_check is not None:  # a plug-in's refusals of settings its rule does not cover
            entry.run_check(config)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if "rho_schedule" in hp:  # a SAM algorithm (the others refuse both options above)
        if hp["rho_schedule"] == "constant" and config.rho_ramp_rounds not in (None, 0):
            raise ConfigError(f"rho_ramp_rounds = {config.rho_ramp_rounds} applies only to rho_schedule = linear, "
                              f"but {config.algorithm}'s rho_schedule is constant; set rho_schedule = \"linear\" or "
                              "remove it")
        if config.rho_schedule == "linear" and hp["rho_ramp_rounds"] <= 1:
            raise ConfigError(f"rho_schedule = linear needs rho_ramp_rounds >= 2 (the rounds of the ramp up to rho), "
                              f"got {hp['rho_ramp_rounds']}")
