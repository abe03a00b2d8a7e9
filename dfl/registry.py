"""`Registry`: the one plug-in shape for algorithms, models, datasets, topologies and loggers.

A registry is a name → object table (a class or a factory), filled three ways:

    ALGORITHMS = Registry("algorithm", group="dfl.algorithms")

    @ALGORITHMS.register("my-algo")          # 1. in Python, by decorating
    class MyAlgo(Algorithm): ...

    ALGORITHMS.register("other", OtherAlgo)  # 2. by a call

    # 3. by an installed package, in its pyproject.toml (loaded the first time a name is looked up):
    #    [project.entry-points."dfl.algorithms"]
    #    my-algo = "my_package.algo:MyAlgo"

An entry point's object is registered the way the kind's own `register` function registers one (`plugin`, e.g.
`dfl.models.register`: the same checks, and the options spec an `options` attribute of the object declares), so a
plug-in loaded by entry point can say everything a registration in code can. Its module may also register itself
when imported (`dfl.models.register("name", f, options=Spec)` at its top level): the entry point then only names
the module to import.

`get(name)` returns the object or raises ValueError naming the kind and listing the choices (a name that
differs only in case, or a close one, is suggested); `names()` lists them in registration order (built-ins
first), which is what `dfl list`, the config validation and the CLI read. A name registered twice (by different
objects) is an error naming both, unless `replace=True`. A `check(name, obj)` given to the registry vets every
entry before it is added, by any of the three routes (raise to refuse it).

A built-in whose module imports torch is *declared* instead (`declare(name, "module:attr", card)`): its name is
known at once and its module is imported on first `get`. Its `card` is what validation reads of it (an
algorithm's hyperparameters, a dataset's options, ...) without importing it, so `dfl.validate` and the CLI's
refusals answer before torch loads. `card(name)` returns the declared card of a built-in, or
`describe(name, obj)` of any other entry (the object itself without a `describe`); a test keeps
every declared card equal to `describe` of the object it declares.
"""

from __future__ import annotations

import difflib
import importlib
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, Generic, NoReturn, TypeVar

from dfl.errors import ConfigError, RegistryError

T = TypeVar("T")


def suggest(name: str, choices: Any) -> str | None:
    """The choice `name` was probably meant to be.

    The same name in other case or with `_` for `-` ("DFedSAM" -> "dfedsam", "random_regular" -> "random-regular"), else
    the closest one by `difflib`, else None.
    """
    choices = [c for c in choices if isinstance(c, str)]
    folded = {c.lower().replace("_", "-"): c for c in choices}
    key = name.strip().lower().replace("_", "-")
    if key in folded:
        return folded[key]
    close = difflib.get_close_matches(key, list(folded), n=1)
    return folded[close[0]] if close else None


def _origin(obj: Any) -> str:
    """Where obj was defined, as "module.qualname" (for error messages)."""
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{name}"


class Registry(Generic[T]):
    """A name → object table with a `register` decorator and an entry-point group for installed packages.

    Args:
        kind: the singular noun of the entries in messages ("algorithm", "model", ...).
        group: the entry-point group installed packages register in (e.g. "dfl.algorithms"); None: no plug-ins.
        check: `check(name, obj)` raises when obj cannot be registered as name (every route is checked).
        describe: `describe(name, obj)` gives the card validation reads of an entry; None: the object itself.
        plugin: `plugin(name, obj)` registers an entry point's object as the kind's own `register` function does
            (reading what the object declares, e.g. its `options` spec); None: `register(name, obj)`. Set later
            (`registry.plugin = ...`) where that function is defined after the registry.

    Examples:
        >>> from dfl.registry import Registry
        >>> shapes = Registry("shape")
        >>> @shapes.register("square")
        ... def square(side):
        ...     return side * side
        >>> shapes.names(), shapes.get("square")(3)
        (('square',), 9)
        >>> shapes.get("Square")
        Traceback (most recent call last):
        ...
        dfl.errors.ConfigError: shape must be one of square; got 'Square' (did you mean 'square'?)
    """

    def __init__(self, kind: str, group: str | None = None, check: Callable[[str, T], None] | None = None,
                 describe: Callable[[str, T], Any] | None = None, plugin: Callable[[str, Any], Any] | None = None):
        self.kind = kind  # singular noun for messages: "algorithm", "model", ...
        self.group = group  # entry-point group, e.g. "dfl.algorithms" (None: no plug-ins)
        self.check = check  # check(name, obj) raises when obj cannot be registered as name
        self.describe = describe  # (name, obj) -> its card (what validation reads); None: the object itself
        self.plugin = plugin  # (name, obj) registers an entry point's object as the kind's `register` does
        self._table: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # declared built-ins not imported yet: name -> "module:attr"
        self._cards: dict[str, Any] = {}  # name -> the card declared with a built-in
        self._sources: dict[str, str] = {}  # name -> where it came from (module, or entry point's distribution)
        self._plugins_loaded = group is None
        self._plugin_errors: dict[str, str] = {}  # entry-point name -> why it failed to load

    # ---------------------------------------------------------------------------------------------- filling
    def register(self, name: str, obj: T | None = None, *, replace: bool = False) -> Any:
        """Register `obj` under `name`; without `obj`, return a decorator that registers what it decorates."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise RegistryError(f"{self.kind} name must be a non-empty string without surrounding spaces; "
                                f"got {name!r}")
        if obj is None:
            def decorator(target: T) -> T:
                self._add(name, target, replace, _origin(target))
                return target

            return decorator
        self._add(name, obj, replace, _origin(obj))
        return obj

    def declare(self, name: str, target: str, card: Any) -> None:
        """Register the built-in `target` ("module:attr") as `name` without importing it.

        It is imported (and checked) on the first `get(name)`; `card` is what validation reads of it until then (and
        after).
        """
        self._table[name] = None  # type: ignore[assignment]  # resolved by `get`
        self._lazy[name] = target
        self._cards[name] = card
        self._sources[name] = target.replace(":", ".")

    def _resolve(self, name: str) -> None:
        """Import a declared built-in (its module, then the attribute) and register the object."""
        target = self._lazy.pop(name)
        module, _, attr = target.partition(":")
        obj = getattr(importlib.import_module(module), attr)
        if self.check is not None:
            self.check(name, obj)
        self._table[name] = obj

    def _add(self, name: str, obj: T, replace: bool, source: str) -> None:
        if name in self._lazy and not replace:  # a declared built-in: the object it names, or a clash
            self._resolve(name)
        current = self._table.get(name)
        if current is not None and current is not obj and not replace:
            raise RegistryError(
                f"{self.kind} {name!r} is registered twice: by {self._sources[name]} and by {source}; "
                f"choose another name, or pass replace=True to override it on purpose"
            )
        if self.check is not None:
            self.check(name, obj)
        if current is not obj:  # another object under a declared name: its card no longer describes it
            self._cards.pop(name, None)
        self._lazy.pop(name, None)
        self._table[name] = obj
        self._sources[name] = source

    def unregister(self, name: str) -> None:
        """Remove `name` (tests and notebooks that register temporary entries)."""
        for table in (self._table, self._sources, self._lazy, self._cards):
            table.pop(name, None)

    def _load_plugins(self) -> None:
        """Register every entry point of `group` once: an entry point's object is registered under its name.

        One that fails to import is remembered, and named in the error if someone asks for it.
        """
        if self._plugins_loaded or self.group is None:
            return
        self._plugins_loaded = True
        for ep in metadata.entry_points(group=self.group):
            dist = getattr(getattr(ep, "dist", None), "name", None) or "an installed package"
            if ep.name in self._table:  # a built-in or an explicit registration wins over a same-named plug-in
                module = getattr(ep, "module", None) or ep.value.partition(":")[0]
                source = self._sources[ep.name]
                # not the same object registered twice, nor registered by the entry point's own module on import
                if source != ep.value.replace(":", ".") and not source.startswith(f"{module}."):
                    warnings.warn(f"{self.kind} {ep.name!r} from {dist} (entry point {ep.value!r}) is ignored: the "
                                  f"name is taken by {self._sources[ep.name]}; rename the entry point", stacklevel=3)
                continue
            try:
                obj = ep.load()
                if ep.name not in self._table:  # importing it may have registered it already (a decorator)
                    if self.plugin is not None:  # the kind's own checks, and what the object declares
                        self.plugin(ep.name, obj)
                    else:
                        self._add(ep.name, obj, False, "")
                    self._sources[ep.name] = f"{dist} (entry point {ep.value})"
            except Exception as exc:  # a broken plug-in (or one `check` refuses) must not break the built-ins
                self._plugin_errors[ep.name] = (
                    f"{self.kind} {ep.name!r} from {dist} (entry point {ep.value!r} in group {self.group!r}) "
                    f"could not be loaded: {type(exc).__name__}: {exc}"
                )

    # ---------------------------------------------------------------------------------------------- reading
    def names(self) -> tuple[str, ...]:
        """Every registered name, in the order registered (entry-point plug-ins are loaded on first use)."""
        self._load_plugins()
        return tuple(self._table)

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def items(self) -> list[tuple[str, T]]:
        """(name, object) of every entry: the declared built-ins are imported."""
        self._load_plugins()
        for name in list(self._lazy):
            self._resolve(name)
        return list(self._table.items())

    def declared(self) -> tuple[str, ...]:
        """The names registered with a card by `declare` (built-ins), imported or not."""
        return tuple(self._cards)

    def source(self, name: str) -> str:
        """Where `name` was registered from (a module.qualname, or a distribution's entry point)."""
        self.get(name)
        return self._sources[name]

    def get(self, name: str, field: str | None = None) -> T:
        """The object registered as `name`.

        A ConfigError (a ValueError) naming `field` (default: the kind) and the choices otherwise, with a close match
        suggested.
        """
        self._load_plugins()
        if isinstance(name, str) and name in self._table:
            if name in self._lazy:
                self._resolve(name)
            return self._table[name]
        self._unknown(name, field)

    def _unknown(self, name: Any, field: str | None) -> NoReturn:
        """Raise the error for a name that is not registered.

        Why its plug-in failed to load, or the choices and a suggestion (the same name in other case, else a close one).
        """
        if isinstance(name, str) and name in self._plugin_errors:
            raise RegistryError(self._plugin_errors[name])
        field = field or self.kind
        choices = ", ".join(self._table)
        if not isinstance(name, str):
            raise ConfigError(f"{field} must be a name, one of {choices}; got {type(name).__name__} "
                              f"{repr(name)[:80]}")
        close = suggest(name, self._table)
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ConfigError(f"{field} must be one of {choices}; got {repr(name)[:80]}{hint}")

    def card(self, name: Any, field: str | None = None) -> Any:
        """What validation reads of `name` without importing a declared built-in.

        Its declared card, else `describe(obj)` (the object itself without `describe`). A ConfigError naming `field`
        (default: the kind), the choices and a suggestion for a name that is not registered.
        """
        self._load_plugins()
        if isinstance(name, str) and name in self._cards:
            return self._cards[name]
        obj = self.require(name, field or self.kind)
        return obj if self.describe is None else self.describe(name, obj)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def require(self, name: Any, field: str) -> T:
        """`get` for a config field.

        The object registered as `name`, or a `ConfigError` naming `field`, the choices and a close match (or why a
        plug-in of that name failed to load).
        """
        try:
            return self.get(name, field=field)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, group={self.group!r}, names={list(self._table)})"

