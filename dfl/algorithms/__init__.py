"""Algorithms: the registry (name -> class) and hyperparameter resolution against a Config.

Adding one (the interface is documented in `dfl.algorithms.base`):

    @dfl.algorithms.register("my-algo")         # in Python; or, from an installed package's pyproject.toml:
    class MyAlgo(Algorithm): ...                # [project.entry-points."dfl.algorithms"]
                                                # my-algo = "my_package.algo:MyAlgo"

A registered name works everywhere a built-in does: `dfl.run(Config(algorithm="my-algo"))`, `dfl run
--algorithm my-algo` (an entry point, as the CLI is a new process), TOML configs, sweeps and `dfl list algorithms`.
"""

from __future__ import annotations

from dfl.algorithms.builtin import BUILTINS, SERVER, AlgorithmCard
from dfl.algorithms.registration import HYPERPARAMETERS, check_algorithm, option_defaults, resolve_options
from dfl.config import Config
from dfl.errors import ConfigError
from dfl.lazy import submodules
from dfl.registry import Registry

# the built-ins are declared by card (`dfl.algorithms.builtin`): naming and checking one imports no torch; its
# class is imported when a run builds it (`algorithm_class`)
ALGORITHMS: Registry = Registry("algorithm", group="dfl.algorithms", check=check_algorithm)
"""Every algorithm the config field `algorithm` takes: name -> `Algorithm` subclass.

The built-ins first (declared by card, so checking a config imports no torch; the class loads on the first
`get`), then those registered with `@dfl.algorithms.register("name")` and installed packages' entry points
(group `dfl.algorithms`). `check_algorithm` vets each class: an `Algorithm` with a `round` and its hyperparameters
declared. Read by `dfl.validate`, `dfl list algorithms` and the runner (`algorithm_class`)."""
for _name, (_target, _card) in BUILTINS.items():
    ALGORITHMS.declare(_name, _target, _card)
del _name, _target, _card
register = ALGORITHMS.register  # @register("name") class ...: or register("name", cls)

# the interface for writing an algorithm, imported on first use (it imports torch)
__getattr__ = submodules(__name__, {
    "Algorithm": "dfl.algorithms.base", "Context": "dfl.algorithms.base", "RoundStats": "dfl.algorithms.base",
    "ServerAlgorithm": "dfl.algorithms.server", "LocalResult": "dfl.training.local", "LocalRule": "dfl.training.local",
})

__all__ = [
    "ALGORITHMS", "HYPERPARAMETERS", "Algorithm", "AlgorithmCard", "Context", "LocalResult", "LocalRule",
    "RoundStats", "ServerAlgorithm", "accepts_byzantine", "algorithm_class", "byzantine_algorithms", "check_config",
    "compressible_algorithms", "is_centralized", "mixes_by_push_sum", "private_algorithms", "takes_compression",
    "takes_privacy",
    "option_defaults",
    "readers", "register", "resolve_hyperparameters", "unread_fields", "unread_message",
]


def algorithm_class(name: str):
    """The class registered as `name` (imported now; ValueError listing the registered names otherwise)."""
    return ALGORITHMS.get(name)


def is_centralized(name: str) -> bool:
    """Whether algorithm `name` aggregates at a server rather than gossiping.

    Whether the algorithm registered as `name` aggregates at a server (the complete-graph case) instead of
    gossiping with neighbours (read from its card: imports nothing).
    """
    return _card_flag(name, "centralized")


def mixes_by_push_sum(name: str) -> bool:
    """Whether algorithm `name` mixes by push-sum, so it runs on a column-stochastic W.

    Whether the algorithm registered as `name` gossips through `Algorithm.mix`, so runs on a column-stochastic W
    by push-sum (read from its card: imports nothing).
    """
    return _card_flag(name, "push_sum")


def accepts_byzantine(name: str) -> bool:
    """Whether algorithm `name` runs with Byzantine clients and robust aggregators (its card's `byzantine`).

    Such an algorithm shares only its models (`dfl.network.byzantine_settings`); read from its card, importing nothing.
    """
    return _card_flag(name, "byzantine")


def byzantine_algorithms() -> list[str]:
    """The registered algorithms that run with Byzantine clients (`accepts_byzantine`), in listing order."""
    return [name for name in ALGORITHMS.names() if accepts_byzantine(name)]


def takes_privacy(name: str) -> bool:
    """Whether client-level differential privacy (`dp_clip`) protects everything algorithm `name` sends.

    Read from its card (`Algorithm.dp`: every message is a post-processing of the trained models and public values);
    imports nothing.
    """
    return _card_flag(name, "dp")


def private_algorithms() -> list[str]:
    """The registered algorithms that take differential privacy (`takes_privacy`), in listing order."""
    return [name for name in ALGORITHMS.names() if takes_privacy(name)]


def takes_compression(name: str) -> bool:
    """Whether compressed gossip (`compressor`) can carry the gossip of algorithm `name`.

    Read from its card (`Algorithm.compression`: each gossip step mixes one model-sized stack, which CHOCO keeps one
    public copy of); a centralized algorithm does not gossip at all (`is_centralized`). Imports nothing.
    """
    return not is_centralized(name) and _card_flag(name, "compression", default=True)


def compressible_algorithms() -> list[str]:
    """The registered algorithms that take a compressor (`takes_compression`), in listing order."""
    return [name for name in ALGORITHMS.names() if takes_compression(name)]


def _card_flag(name: str, flag: str, default: bool = False) -> bool:
    """A boolean of the card of algorithm `name` (`default` when the card lacks it): imports nothing."""
    return bool(getattr(ALGORITHMS.card(name, "algorithm"), flag, default))


def resolve_hyperparameters(config: Config) -> dict:
    """The hyperparameters a run of `config` uses: the algorithm's defaults, overridden by its set Config fields.

    The algorithm's declared hyperparameters with their defaults, the Config fields it reads where they are set, and
    `config.algorithm_options`. A set field the algorithm does not read plays no part here: `check_config` refuses
    it (`unread_fields`). ValueError for an algorithm option that is unknown or of the wrong type, or for values the
    algorithm's `check_hyperparameters` refuses.
    """
    cls = ALGORITHMS.card(config.algorithm, "algorithm")  # a built-in's card, or a registered class itself
    hp = dict(cls.hyperparameters)
    hp.update({name: getattr(config, name) for name in HYPERPARAMETERS
               if name in hp and getattr(config, name) is not None})
    hp.update(resolve_options(config.algorithm, cls, config.algorithm_options))
    if "momentum" in hp and config.local_optimizer != "sgd":  # SGD's heavy ball: Adam/AdamW have their own first moment
        hp["momentum"] = 0.0  # what applies (`Context.rule`), so summary.json records it; a set momentum is refused
    cls.check_hyperparameters(hp)
    return hp


def unread_fields(config: Config) -> list[str]:
    """The algorithm hyperparameters set in `config` (not None) that its algorithm does not read.

    A field the algorithm does not declare (`rho` for dpsgd), `asam_eta` unless the SAM variant is ASAM in Kwon et
    al.'s form, and `asam_form` unless it is ASAM. Imports nothing (the algorithm's card).
    """
    hp = dict(ALGORITHMS.card(config.algorithm, "algorithm").hyperparameters)
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
    return [name for name in ALGORITHMS.names() if field in ALGORITHMS.card(name).hyperparameters]


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

    `algorithm_options` fit its declared defaults and its `check_hyperparameters` accepts the resolved values; the SAM
    radius schedule is complete; the local optimizer is one its update rule is written for. Raises `ConfigError` naming
    the field.
    """
    cls = ALGORITHMS.card(config.algorithm, "algorithm")
    for field, default in SERVER.items():  # which clients a server samples and how it weighs them
        value = getattr(config, field)
        if value is not None and value != default and field not in cls.hyperparameters:
            takers = [name for name in ALGORITHMS.names() if field in ALGORITHMS.card(name).hyperparameters]
            kind = "the decentralized" if not getattr(cls, "centralized", False) else "the"
            hint = "; weights = sample-count weighs neighbours by their data" if field == "aggregation" else ""
            raise ConfigError(f"{field} = {value} applies only to the centralized algorithms that take it "
                              f"({', '.join(takers)}); {kind} {config.algorithm!r} trains and gossips every client "
                              f"each round, weighted by the topology's W (use {default} or unset{hint})")
    unread = unread_fields(config)
    if unread:  # refused, never ignored: a set field that the run would not read is a mistake (every one at once)
        problems = [unread_message(config, name) for name in unread]
        raise ConfigError("; ".join(problems), problems)
    try:
        hp = resolve_hyperparameters(config)
        check_run = getattr(cls, "check_run", None)  # the algorithm's refusals of settings its rule does not cover
        if check_run is not None:
            check_run(config)
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
    if config.local_optimizer != "sgd" and config.local_optimizer not in cls.local_optimizers:
        able = [name for name in ALGORITHMS.names()
                if config.local_optimizer in getattr(ALGORITHMS.card(name), "local_optimizers", ("sgd",))]
        raise ConfigError(f"local_optimizer = {config.local_optimizer} is not defined for {config.algorithm}, whose "
                          f"update rule is written in SGD steps; use local_optimizer = sgd, or one of "
                          f"{', '.join(able)}")
