"""What registering an algorithm checks, and its hyperparameters resolved and checked against its card's specs.

An algorithm's card (`dfl.algorithms.spec.AlgorithmCard`) declares every hyperparameter it reads, typed, with its
default (`Hyperparameters`). The names in `HYPERPARAMETERS` are Config fields shared by several algorithms (`--rho`,
`--momentum`, ...); every other name is an *algorithm option*, set through `Config.algorithm_options` and checked
here: an unknown key is an error naming the algorithm and its options, a value must have its declared type (an int
is accepted for a float; a None default accepts anything) and be among its `choices` or inside its `interval`. A
card's `check` (a plug-in's `check_hyperparameters` classmethod) refines this with rules between the resolved
values, raising ValueError.
"""

from __future__ import annotations

import dataclasses
import keyword
import math
from dataclasses import fields
from typing import Any

from dfl.algorithms.spec import HYPERPARAMETERS, RESERVED, AlgorithmCard, Hyperparameters
from dfl.config import Config
from dfl.errors import ArgumentError

__all__ = ["HYPERPARAMETERS", "check_algorithm", "option_defaults", "resolve", "resolve_options"]

_CONFIG_FIELDS = frozenset(f.name for f in fields(Config))


def check_algorithm(name: str, cls: Any) -> None:
    """Refuse a class that cannot run as an algorithm (one line naming it and what is wrong); set `cls.name`."""
    from dfl.algorithms.base import Algorithm  # here: a class to check has imported it (and torch) already

    where = f"algorithm {name!r} ({getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)!s})"
    if not isinstance(cls, type) or not issubclass(cls, Algorithm):
        raise ArgumentError(f"{where} must be a subclass of dfl.algorithms.Algorithm, got {cls!r}")
    if cls.round is Algorithm.round:
        raise ArgumentError(f"{where} must define round(self, t) -> RoundStats")
    card = cls.card
    if not isinstance(card, AlgorithmCard):
        raise ArgumentError(f"{where}: card must be a dfl.algorithms.AlgorithmCard, got {card!r}")
    hp = card.hyperparameters
    if isinstance(hp, dict):  # a declaration no Hyperparameters class could be made of (`base.card_of`)
        names = list(hp)
    elif isinstance(hp, type) and issubclass(hp, Hyperparameters):
        names = list(hp.defaults())
    else:
        raise ArgumentError(f"{where}: hyperparameters must be a dict of name -> default (or a "
                            f"dfl.algorithms.Hyperparameters class), got {hp!r}")
    for key in names:
        if not isinstance(key, str) or not key.isidentifier() or keyword.iskeyword(key):
            raise ArgumentError(f"{where}: hyperparameter names must be identifiers (they are TOML keys and "
                                f"--algorithm-options keys), got {key!r}")
        if key in _CONFIG_FIELDS and key not in HYPERPARAMETERS:
            raise ArgumentError(f"{where}: hyperparameter {key!r} is a Config field that algorithms do not own "
                                f"(read it from ctx.config.{key}); rename the option")
        if key in RESERVED:
            raise ArgumentError(f"{where}: hyperparameter {key!r} is a method of ctx.hp (a read-only mapping); "
                                "rename the option")
    if isinstance(hp, dict):
        raise ArgumentError(f"{where}: hyperparameters {hp!r} cannot be made the fields of ctx.hp; rename them")
    if not isinstance(cls.client_state, tuple) or not all(isinstance(k, str) for k in cls.client_state):
        raise ArgumentError(f"{where}: client_state must be a tuple of state() keys, got {cls.client_state!r}")
    declared = cls.__dict__.get("name")
    if declared is not None and declared != name:
        raise ArgumentError(f"{where} declares name = {declared!r} but is registered as {name!r}; use one name")
    cls.name = name


def option_defaults(card: AlgorithmCard) -> dict[str, Any]:
    """The algorithm options of `card` with their defaults: its hyperparameters that are not Config fields."""
    return {k: v for k, v in card.defaults().items() if k not in HYPERPARAMETERS}


def resolve_options(algorithm: str, card: AlgorithmCard, options: dict[str, Any]) -> dict[str, Any]:
    """`options` checked against the specs of `card` (ValueError naming the key and the allowed keys)."""
    if not isinstance(options, dict):
        raise ValueError(f"algorithm_options must be a table of key = value, got {options!r}")
    defaults = option_defaults(card)
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


def resolve(config: Config, card: AlgorithmCard) -> Hyperparameters:
    """The frozen hyperparameters a run of `config` uses with `card`: its defaults ← set Config fields ← options.

    Every algorithm option's value is checked against its spec (choices, interval), then the card's own `check`
    runs. ValueError naming the option otherwise.
    """
    values = card.defaults()
    values.update({name: getattr(config, name) for name in HYPERPARAMETERS
                   if name in values and getattr(config, name) is not None})
    values.update(resolve_options(config.algorithm, card, config.algorithm_options))
    if "momentum" in values and config.local_optimizer != "sgd":  # SGD's heavy ball: Adam/AdamW have their own
        values["momentum"] = 0.0  # what applies (`Context.rule`), so summary.json records it; a set momentum is refused
    for spec in card.specs():
        if not spec.config_field:
            spec.check(values[spec.name])
    hp = card.hyperparameters(**values)
    if card.check is not None:
        card.check(hp)
    return hp


def replace(hp: Hyperparameters, **changes: Any) -> Hyperparameters:
    """A copy of `hp` with `changes` (it is frozen)."""
    return dataclasses.replace(hp, **changes)


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
