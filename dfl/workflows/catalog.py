"""What is registered: every algorithm, topology, model, dataset, partition, weight scheme and logger, with a
one-line description and its options with their defaults (`dfl list`, and the docs' reference).

Every category but the weight schemes is a registry (a `dfl.registry.Registry`, or a name -> object mapping),
read the same way by `registry_entries`: a choice's description is the first paragraph of its object's own
docstring (else its module's), and its options are the defaults the object declares (a mapping attribute
`options`, or an algorithm's `hyperparameters`), else its keyword-only parameters ("required" for one without a
default). Registered plug-ins are listed like the built-ins."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from dfl import signatures

CATEGORIES = ("algorithms", "topologies", "models", "datasets", "partitions", "weights", "loggers")

REQUIRED = signatures.REQUIRED  # the default shown for an option that has none


# ------------------------------------------------------------------------------------------------ docstrings
def _paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring as one line ("" for none)."""
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())


def _own_doc(obj: Any) -> str:
    """obj's own docstring (a class's, not one inherited from a base class)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return _paragraph(doc)


def _module_doc(obj: Any) -> str:
    module = sys.modules.get(getattr(obj, "__module__", ""), None)
    return _paragraph(getattr(module, "__doc__", None))


def _bullet(module_doc: str | None, key: str) -> str:
    """The text of the bullet `- key: text` or `- `key` (...): text` in a module docstring (continuation lines
    joined), up to its first ';' when it runs long."""
    if not module_doc:
        return ""
    lines = inspect.cleandoc(module_doc).splitlines()
    head = rf"^- (?:`{re.escape(key)}`|{re.escape(key)}(?![\w-]))"
    starts = [i for i, line in enumerate(lines) if re.match(head, line)]
    if len(starts) != 1:  # none, or one per variant (`CNN`, variant "mcmahan" ...): no single description
        return ""
    for i in starts:
        m = re.match(head + r"[^:]*:\s*(.*)$", lines[i])
        if not m:
            return ""
        text = [m.group(1)]
        for more in lines[i + 1:]:
            if not more.startswith(" ") or not more.strip():
                break
            text.append(more.strip())
        joined = " ".join(text).rstrip(";,")
        return joined.split("; ")[0] if len(joined) > 100 else joined
    return ""

DECLARED_OPTIONS = ("options", "hyperparameters")  # attributes holding an object's declared option defaults


def description(name: str, obj: Any) -> str:
    """The first paragraph of obj's own docstring, else of its module's."""
    return _own_doc(obj) or _module_doc(obj)


def options_of(obj: Any) -> dict[str, Any]:
    """obj's declared option defaults (a mapping attribute in DECLARED_OPTIONS), else its keyword-only parameters."""
    for attribute in DECLARED_OPTIONS:
        declared = getattr(obj, attribute, None)
        if isinstance(declared, Mapping):
            return dict(declared)
    return signatures.options(obj)


def registry_entries(registry: Any, extra: tuple[str, Callable[[str, Any], Any]] | None = None,
                     describe: Callable[[str, Any], str] = description) -> list[dict]:
    """One entry per registered name, in registration order: name, description, the `extra` column (its key and
    a function of name and object) if any, options. `registry`: anything with `items()` (name -> object)."""
    entries = []
    for name, obj in registry.items():
        entry = {"name": name, "description": describe(name, obj)}
        if extra is not None:
            entry[extra[0]] = extra[1](name, obj)
        entry["options"] = options_of(obj)
        entries.append(entry)
    return entries


# ------------------------------------------------------------------------------------------------ categories
def _algorithms() -> list[dict]:
    from dfl.algorithms import ALGORITHMS, option_defaults  # the registry: name -> class

    entries = registry_entries(ALGORITHMS, ("centralized", lambda name, cls: bool(getattr(cls, "centralized", 0))))
    for entry in entries:
        own = list(option_defaults(ALGORITHMS.get(entry["name"])))  # set by --algorithm-options, no flag of their own
        if own:
            entry["algorithm_options"] = own
            entry["note"] = f"--algorithm-options: {', '.join(own)}"
    return entries


def _topologies() -> list[dict]:
    from dfl.topologies import TOPOLOGIES

    return registry_entries(TOPOLOGIES, ("kind", lambda name, obj: getattr(obj, "kind", "registered")))


def _model_target(builder: Callable, name: str) -> Any:
    """The class or function a model builder constructs (read from the names its code uses)."""
    code = getattr(builder, "__code__", None)
    if code is None:
        return None
    found = [builder.__globals__.get(n) for n in code.co_names]
    found = [o for o in found if callable(o) and getattr(o, "__module__", "").startswith("dfl.models.")
             and getattr(o, "__module__", "") not in ("dfl.models.layers", "dfl.models.shapes")]
    named = [o for o in found if o.__name__.lower() == name.lower()]
    return (named or found or [None])[0]


def _model_description(name: str, builder: Any) -> str:
    """The builder's docstring, else that of the model class it builds (or its bullet in the module docstring)."""
    description = _own_doc(builder)
    target = _model_target(builder, name)
    if target is not None and not description:
        module = sys.modules.get(target.__module__)
        description = (_own_doc(target) or _bullet(getattr(module, "__doc__", None), target.__name__)
                       or _module_doc(target))
    return description


def _models() -> list[dict]:
    from dfl.models import MODELS  # the registry: built-ins, then registered and installed (entry point) models

    def describe(name: str, builder: Any) -> str:
        return _model_description(name, builder) or f"from {MODELS.source(name)}"

    return registry_entries(MODELS, describe=describe)


def _datasets() -> list[dict]:
    from dfl.data import DATASETS, needs_root

    return registry_entries(DATASETS, ("source", lambda name, _: "local files (data_root)" if needs_root(name)
                                       else "embedded"))


def _partitions() -> list[dict]:
    from dfl.data import PARTITIONS

    return registry_entries(PARTITIONS)


def _weights() -> list[dict]:
    registry = importlib.import_module("topologies.weights")

    entries = []
    for name in registry.SCHEMES:
        fn = getattr(registry, name.replace("-", "_"), None)
        description = _bullet(registry.__doc__, name) or (_own_doc(fn) if fn is not None else "")
        options = {"base": "metropolis"} if name == "lazy" else {"sizes": REQUIRED} if name == "sample-count" else {}
        entry = {"name": name, "description": description, "options": options}
        if name == "lazy" and hasattr(registry, "LAZY_BASES"):
            entry["choices"] = {"base": list(registry.LAZY_BASES)}
        entries.append(entry)
    return entries


def _loggers() -> list[dict]:
    from dfl.loggers import LOGGERS

    return registry_entries(LOGGERS)

LISTERS: dict[str, Callable[[], list[dict]]] = {
    "algorithms": _algorithms, "topologies": _topologies, "models": _models,
    "datasets": _datasets, "partitions": _partitions, "weights": _weights, "loggers": _loggers,
}


def entries(category: str) -> list[dict]:
    """The entries of one category (one of `CATEGORIES`): name, description, options, and the category's extras."""
    return LISTERS[category]()

