"""Typed option specs, torch-free: the one form every extension point declares its options in.

A component's options are a frozen dataclass, a subclass of `Spec`, each field declared once with
`param(default, help, ...)`: its name, its type (the annotation), its default, its allowed values (`choices`, or an
`interval` such as "(0, 1]") and one line of help. The class is the spec that `dfl.validate`, `dfl list`, the options
page and the generated docstring sections read:

    @dataclass(frozen=True)
    class GridOptions(Spec):
        shape: list[int] | None = param(None, "the mesh's (rows, columns), their product n; unset: near-square",
                                        items="[1, inf)")
        periodic: bool = param(False, "wrap both sides, making the mesh a torus", choices=(True, False))

A list option says its items' type in its annotation (`list[int]`, `tuple[float, ...]`) and their range in `items`:
`shape` above allows a list (or tuple) of ints >= 1, which `allowed` says as "a list of ints >= 1".

`specs()` gives each field as a `Param`, whose `check(value, where)` refuses a value outside its choices or interval in
one line naming `where.NAME` (`topology_options.degree`, `partition_options.classes_per_client`, ...) and the allowed
values. An option without a default is declared with `param(REQUIRED, ...)`. A subclass may redeclare a field to change
its default: its help and allowed values are inherited.

An algorithm's hyperparameters are such a class too (`dfl.algorithms.spec.Hyperparameters`, whose instances are the
resolved values of a run, read by attribute or as a read-only mapping).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from dfl.config import Interval

REQUIRED = "required"  # the default of an option without one, as `dfl list` and the docs show it


def param(default: Any, help: str = "", *, choices: tuple[Any, ...] | None = None, interval: str | None = None,
          items: str | None = None, short: str | None = None) -> Any:
    """A field of a `Spec` class: its default, one line of help and its allowed values.

    Args:
        default: the value a run uses unless the config sets it (a list or table is copied for every instance);
            `REQUIRED` for an option without one.
        help: one line: what the value means (empty when a redeclared field keeps its parent's).
        choices: the allowed values, when they are a fixed set.
        interval: the allowed range of a number, as "[0, 1)" or "(0, inf)".
        items: the allowed range of each item of a list option, as "[1, inf)"; the items' type is the annotation's
            (`list[int]`, `tuple[float, ...]`; any number when it names none).
        short: how a refusal names it besides its key, e.g. "K-GT's eta_s".
    """
    metadata = {"help": help, "choices": tuple(choices) if choices is not None else None,
                "interval": Interval.parse(interval) if interval else None,
                "items": Interval.parse(items) if items else None, "short": short}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Param:
    """One option as its spec declares it: name, type, default, allowed values and help.

    `items`: the range of each item of a list option (whose item type `item_type` reads from `type`).
    `config_field`: (algorithms) whether it is a Config field (`dfl.algorithms.HYPERPARAMETERS`, set by `--NAME`),
    whose range the Config checks; otherwise an option of the component, checked against `choices` and `interval`.
    """

    name: str
    type: str
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    interval: Interval | None = None
    short: str | None = None
    config_field: bool = False
    items: Interval | None = None

    @property
    def item_type(self) -> str:
        """The type of a list option's items, from its annotation: "int", "float", or "number" when it names none."""
        named = re.search(r"(?:list|tuple)\[\s*(int|float)\b", self.type)
        return named.group(1) if named else "number"

    @property
    def allowed(self) -> str:
        """The allowed values in words ("one of erk, uniform", "in (0, 1]", "> 0", "a list of ints >= 1"), or ""."""
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices))
        if self.items is not None:
            return f"a list of {self.item_type}s {self.items.describe()}"
        return self.interval.describe() if self.interval is not None else ""

    @property
    def required(self) -> bool:
        """Whether it has no default (a run without it is refused)."""
        return isinstance(self.default, str) and self.default == REQUIRED

    def check(self, value: Any, where: str = "algorithm_options") -> None:
        """ValueError naming `where.NAME` (and its short name) unless `value` is allowed.

        A number outside `interval`, anything but true or false for a bool option, anything but a number where there
        is one (a partition's or a model's own checks run
        only when it is built, after the data loads), a value not among `choices`, or for a list option (`items`)
        anything but a list or tuple of numbers of its item type inside `items`; the default is always allowed (None:
        unset), and another number type (3.0 for an int) is left to the component's own checks (which name what it
        expects).
        """
        if value is self.default or (type(value) is type(self.default) and value == self.default):
            return
        name = f"{where}.{self.name}" + (f" ({self.short})" if self.short else "")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{name} must be {self.allowed}, got {value!r}")
        if self.items is not None:
            self._check_items(value, name)
            return
        if self.type.split(" |")[0] == "bool" and not isinstance(value, bool) and value is not None:
            raise ValueError(f"{name} must be true or false, got {value!r}")
        interval = self.interval
        if interval is not None and value is not None and (isinstance(value, bool) or
                                                            not isinstance(value, (int, float))):
            kind = "an integer" if self.type.split(" |")[0] == "int" else "a number"
            raise ValueError(f"{name} must be {kind} {interval.describe()}, got {value!r}")
        if interval is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not inside(interval, value):
                raise ValueError(f"{name} must be {interval.describe()}, got {value}")

    def _check_items(self, value: Any, name: str) -> None:
        """ValueError naming `name`, the allowed values and the first bad item, unless `value` is such a list."""
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} must be {self.allowed}, got {value!r}")
        kinds = (int,) if self.item_type == "int" else (int, float)
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, kinds) or not inside(self.items, item):
                raise ValueError(f"{name} must be {self.allowed}, got {value!r} (item {i}: {item!r})")


def inside(interval: Interval | None, value: float) -> bool:
    """Whether the number `value` lies in `interval` (None: anywhere)."""
    if interval is None:
        return True
    low = value > interval.low or (interval.low_closed and value == interval.low)
    high = value < interval.high or (interval.high_closed and value == interval.high)
    return low and high


# names an option cannot take: the read-only mapping's own methods
RESERVED = frozenset(name for name in dir(Mapping) if not name.startswith("_")) | {"specs", "defaults", "as_dict",
                                                                                   "check_values", "docstring_args"}


@dataclass(frozen=True)
class Spec(Mapping[str, Any]):
    """The options of a component: typed fields declared with `param`, and a read-only mapping of name → value.

    Subclass it with `param(...)` fields (module docstring); a component without options uses it as is.
    """

    def __getitem__(self, name: str) -> Any:
        if name not in self._names():
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def specs(cls) -> tuple[Param, ...]:
        """Every option's spec, in declaration order; a redeclared field's help and range are inherited."""
        out = []
        for f in fields(cls):
            meta = inherited(cls, f.name)
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc,operator]
            out.append(Param(f.name, type_name(f.type), default, meta.get("help", ""), meta.get("choices"),
                             meta.get("interval"), meta.get("short"), items=meta.get("items")))
        return tuple(out)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Name → default of every option, in declaration order (`REQUIRED` for one without a default)."""
        return {spec.name: spec.default for spec in cls.specs()}

    @classmethod
    def check_values(cls, values: Mapping[str, Any], where: str) -> None:
        """ValueError naming `where.NAME` for the first given value outside its spec's choices or range.

        Names the spec does not declare are left to the caller (which lists the allowed ones).
        """
        for spec in cls.specs():
            if spec.name in values:
                spec.check(values[spec.name], where)

    @classmethod
    def docstring_args(cls) -> str:
        """A Google-style "Args:" section of the options, generated from the specs ("" without options)."""
        specs = cls.specs()
        if not specs:
            return ""
        lines = ["Args:"]
        for spec in specs:
            allowed = f" Allowed: {spec.allowed}." if spec.allowed else ""
            shown = f'"{spec.default}"' if isinstance(spec.default, str) else repr(spec.default)  # strings quoted "x"
            default = "Required." if spec.required else f"Defaults to {shown}."
            lines.append(f"    {spec.name}: {spec.help.rstrip('.')}.{allowed} {default}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        """A plain dict of the values."""
        return {name: getattr(self, name) for name in self._names()}


def checked(kind: str, name: str, spec: Any, declared: Mapping[str, Any]) -> type[Spec]:
    """`spec`, a plug-in's options spec, unless it is no `Spec` subclass or its names and defaults are not `declared`.

    `declared`: the factory's keyword-only options (`dfl.signatures.options`); a refusal is a ValueError naming
    `kind name`.
    """
    if not (isinstance(spec, type) and issubclass(spec, Spec)):
        raise ValueError(f"{kind} {name!r}: options must be a dfl.specs.Spec subclass (a frozen dataclass of "
                         f"param(...) fields), got {spec!r}")
    if spec.defaults() != dict(declared):
        raise ValueError(f"{kind} {name!r}: its options spec {spec.defaults()} is not its signature's {dict(declared)}")
    return spec


def inherited(cls: type, name: str) -> dict[str, Any]:
    """The metadata of field `name`: each key from the nearest class of the MRO that gives it a value."""
    merged: dict[str, Any] = {}
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__dataclass_fields__", {}).get(name)
        if declared is None:
            continue
        for key, value in declared.metadata.items():
            if value not in (None, "") and key not in merged:
                merged[key] = value
    return merged


def type_name(annotation: Any) -> str:
    """An annotation as written ("int", "float | None")."""
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def from_defaults(name: str, defaults: Mapping[str, Any], base: type[Spec] = Spec) -> type[Spec]:
    """A `base` subclass for a plug-in that declares only `{name: default, ...}`.

    Each field's type is its default's (a None default accepts any value).
    """
    made = []
    for key, default in defaults.items():
        kind: Any = Any if default is None else type(default)
        made.append((key, kind, param(default)))
    return dataclasses.make_dataclass(f"{name}Options", made, bases=(base,), frozen=True)

