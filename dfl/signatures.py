"""A plug-in's inputs and options, read from its signature: one convention for datasets, partitions and topologies.

A plug-in is a function whose positional parameters are the inputs dfl passes it and whose keyword-only
parameters are its options, each with its default (an option without a default is required):

    def two_cliques(n, *, bridges=1): ...          # a topology: input n, option bridges (default 1)

`check` refuses a function of another shape when it is registered (so the mistake surfaces where it is
made), `options` lists the options with their defaults (what `dfl list` shows), and `resolve` checks the
options a config gives: unknown and missing required ones are errors naming the allowed options.
"""

from __future__ import annotations

import inspect
from typing import Any

from dfl.errors import ConfigError, RegistryError

REQUIRED = "required"  # how an option without a default is shown
_EMPTY = inspect.Parameter.empty
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _parameters(fn: Any) -> list[inspect.Parameter] | None:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or an object without a readable signature
        return None


def _where(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def check(kind: str, name: str, fn: Any, inputs: tuple[int, ...], usage: str) -> int:
    """Check that `fn` takes k positional inputs, then keyword-only options; return k.

    `fn` must take k positional inputs, for a k in `inputs`, then keyword-only options (no *args or
    **kwargs: the options must be listable). Returns k; raises RegistryError quoting `usage` otherwise.
    """
    params = _parameters(fn) if callable(fn) else None
    if params is None:
        what = f"{type(fn).__name__} {fn!r}"[:80] if not callable(fn) else f"{_where(fn)} (no readable signature)"
        raise RegistryError(f"{kind} {name!r} must be a function {usage}; got {what}")
    positional = [p for p in params if p.kind in _POSITIONAL]
    problem = None
    if any(p.kind in _VARIADIC for p in params):
        problem = "*args / **kwargs are not allowed (options are keyword-only parameters with defaults)"
    elif len(positional) not in inputs:
        problem = (f"it takes {len(positional)} positional parameter(s) ({', '.join(p.name for p in positional)}); "
                   "options go after `*`")
    if problem:
        raise RegistryError(f"{kind} {name!r} must be a function {usage}; {_where(fn)}"
                            f"{inspect.signature(fn)}: {problem}")
    return len(positional)


def options(fn: Any) -> dict[str, Any]:
    """The keyword-only parameters of `fn` with their defaults (REQUIRED for those without one)."""
    params = _parameters(fn) or []
    return {p.name: REQUIRED if p.default is _EMPTY else p.default
            for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def resolve(kind: str, name: str, fn: Any, given: dict[str, Any], hints: dict[str, str] | None = None) -> dict:
    """`given` checked against fn's options and completed with their defaults.

    `hints` may say how to give a required option (option -> text shown instead of its bare name).
    """
    return resolve_declared(kind, name, options(fn), given, hints)


def resolve_declared(kind: str, name: str, declared: dict[str, Any], given: dict[str, Any],
                     hints: dict[str, str] | None = None) -> dict:
    """`resolve` against options as `options` lists them (name -> default, or REQUIRED).

    A ValueError naming an unknown option and the allowed ones, or a missing required one.
    """
    if not isinstance(given, dict):
        raise ConfigError(f"the options of {kind} {name!r} must be a table of key = value, got {given!r}")
    unknown = sorted(set(given) - set(declared), key=str)
    if unknown:
        listed = ", ".join(f"{k}={v if _required(v) else repr(v)}" for k, v in declared.items())
        raise ConfigError(f"unknown option(s) {', '.join(map(str, unknown))} for {kind} {name!r}; allowed options: "
                          f"{listed or 'none'}")
    missing = [k for k, v in declared.items() if _required(v) and k not in given]
    if missing:
        raise ConfigError(f"{kind} {name!r} needs option {(hints or {}).get(missing[0], missing[0])}")
    return {**{k: v for k, v in declared.items() if not _required(v)}, **given}


def _required(default: Any) -> bool:
    return isinstance(default, str) and default == REQUIRED
