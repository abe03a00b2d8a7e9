"""What registering an algorithm checks, and its options (`Config.algorithm_options`) checked against its defaults.

An algorithm declares every hyperparameter it reads in `hyperparameters` (name → default). The names in
`HYPERPARAMETERS` are Config fields shared by several algorithms (`--rho`, `--momentum`, ...); every other name
is an *algorithm option*, set through `Config.algorithm_options` and checked here: an unknown key is an error
naming the algorithm and its options, and a value must have its default's type (an int is accepted for a
float default; a None default accepts anything). An algorithm may refine this with a `check_hyperparameters`
classmethod (ranges, combinations), which sees the resolved values and raises ValueError.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from dfl.config import Config
from dfl.errors import ArgumentError

# Config fields that only some algorithms read (None in the Config = the algorithm's default).
HYPERPARAMETERS: tuple[str, ...] = (
    "rho", "rho_schedule", "rho_ramp_rounds", "sam", "asam_eta", "asam_form", "momentum", "gossip_steps")
HYPERPARAMETERS += (  # centralized algorithms
    "participation", "participation_mode", "aggregation", "server_lr", "server_momentum", "fedcm_alpha",
    "domo_alpha", "feddyn_alpha", "fedgloss_beta", "server_rho", "prox_mu", "server_beta1", "server_beta2",
    "server_tau", "fedopt_form",
)
_CONFIG_FIELDS = frozenset(f.name for f in fields(Config))


def check_algorithm(name: str, cls: Any) -> None:
    """Refuse a class that cannot run as an algorithm (one line naming it and what is wrong); set `cls.name`."""
    from dfl.algorithms.base import Algorithm  # here: a class to check has imported it (and torch) already

    where = f"algorithm {name!r} ({getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)!s})"
    if not isinstance(cls, type) or not issubclass(cls, Algorithm):
        raise ArgumentError(f"{where} must be a subclass of dfl.algorithms.Algorithm, got {cls!r}")
    if cls.round is Algorithm.round:
        raise ArgumentError(f"{where} must define round(self, t) -> RoundStats")
    hp = cls.hyperparameters
    if not isinstance(hp, dict):
        raise ArgumentError(f"{where}: hyperparameters must be a dict of name -> default, got {hp!r}")
    for key in hp:
        if not isinstance(key, str) or not key.isidentifier():
            raise ArgumentError(f"{where}: hyperparameter names must be identifiers (they are TOML keys and "
                                f"--algorithm-options keys), got {key!r}")
        if key in _CONFIG_FIELDS and key not in HYPERPARAMETERS:
            raise ArgumentError(f"{where}: hyperparameter {key!r} is a Config field that algorithms do not own "
                                f"(read it from ctx.config.{key}); rename the option")
    if not isinstance(cls.client_state, tuple) or not all(isinstance(k, str) for k in cls.client_state):
        raise ArgumentError(f"{where}: client_state must be a tuple of state() keys, got {cls.client_state!r}")
    declared = cls.__dict__.get("name")
    if declared is not None and declared != name:
        raise ArgumentError(f"{where} declares name = {declared!r} but is registered as {name!r}; use one name")
    cls.name = name


def option_defaults(cls: Any) -> dict[str, Any]:
    """The algorithm options of `cls` with their defaults.

    `cls` is an algorithm class or its card; its options are the hyperparameters that are not Config fields.
    """
    return {k: v for k, v in cls.hyperparameters.items() if k not in HYPERPARAMETERS}


def resolve_options(algorithm: str, cls: Any, options: dict[str, Any]) -> dict[str, Any]:
    """`options` checked against the defaults of `cls` (ValueError naming the key and the allowed keys)."""
    if not isinstance(options, dict):
        raise ValueError(f"algorithm_options must be a table of key = value, got {options!r}")
    defaults = option_defaults(cls)
    allowed = ", ".join(f"{k} (default {v!r})" for k, v in defaults.items())
    resolved = {}
    for key, value in options.items():
        if key in HYPERPARAMETERS:
            raise ValueError(f"algorithm_options.{key}: {key} is a Config field; set it as {key} = {value!r} "
                             f"(--{key.replace('_', '-')}), not in algorithm_options")
        if key not in defaults:
            takes = f"its options are {allowed}" if defaults else "it takes no algorithm_options"
            raise ValueError(f"algorithm_options: unknown key {key!r} for algorithm {algorithm!r}; {takes}")
        resolved[key] = _typed(f"algorithm_options.{key}", value, defaults[key])
    return resolved


def _typed(where: str, value: Any, default: Any) -> Any:
    """value, if it has the type of `default` (an int converted for a float default); ValueError otherwise."""
    def wrong(kind: str) -> ValueError:
        return ValueError(f"{where} must be {kind} (its default is {default!r}), got {value!r}")

    if default is None:
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise wrong("true or false")
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise wrong("a finite number")
        return float(value)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise wrong("a string")
        return value
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise wrong("a list")
        return type(default)(value)
    if isinstance(default, dict) and not isinstance(value, dict):
        raise wrong("a table")
    return value
