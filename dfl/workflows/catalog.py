"""What is registered.

Every algorithm, topology, model, dataset, partition, weight scheme and logger, with a one-line description and its
options with their defaults (`dfl list`, and the docs' reference).

Every category but the weight schemes is a registry (a `dfl.registry.Registry`, or a name -> object mapping),
read the same way by `registry_entries`: a choice's description is the summary line of its object's own
docstring (else of its module's), and its options are the defaults the object declares (a mapping attribute
`options`, or an algorithm's `hyperparameters`), else its keyword-only parameters ("required" for one without a
default). A weight scheme's description is the summary line of its function in `topologies.weights`. Registered
plug-ins are listed like the built-ins. Nothing here parses a docstring beyond its first line: the meaning of
each option is in the docstring's `Args:` section, which the API reference renders
(docs/reference/api-components.md).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

from dfl import signatures

CATEGORIES = ("algorithms", "topologies", "models", "datasets", "partitions", "weights", "loggers", "attacks",
              "aggregators", "compressors")

REQUIRED = signatures.REQUIRED  # the default shown for an option that has none


# ------------------------------------------------------------------------------------------------ docstrings
def summary(doc: str | None) -> str:
    """The summary line of a docstring: its first line once `inspect.cleandoc` has dedented it ("" for none)."""
    return inspect.cleandoc(doc).split("\n", 1)[0].strip() if doc else ""


def own_doc(obj: Any) -> str | None:
    """Obj's own docstring.

    A class's own, not one it inherits (a plug-in algorithm without one would otherwise show `Algorithm`'s), an
    instance's or a function's as `inspect.getdoc` reads it.
    """
    if isinstance(obj, type):
        return obj.__dict__.get("__doc__")
    return inspect.getdoc(obj)


def module_doc(obj: Any) -> str | None:
    """The docstring of the module that defines obj (None when it has none)."""
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    return getattr(module, "__doc__", None)


DECLARED_OPTIONS = ("options", "hyperparameters")  # attributes holding an object's declared option defaults


def description(name: str, obj: Any) -> str:
    """The summary line of obj's own docstring, else of its module's."""
    return summary(own_doc(obj)) or summary(module_doc(obj))


def options_of(obj: Any) -> dict[str, Any]:
    """Obj's declared option defaults (a mapping attribute in DECLARED_OPTIONS), else its keyword-only parameters."""
    for attribute in DECLARED_OPTIONS:
        declared = getattr(obj, attribute, None)
        if isinstance(declared, Mapping):
            return dict(declared)
    return signatures.options(obj)


def registry_entries(registry: Any, extra: tuple[str, Callable[[str, Any], Any]] | None = None,
                     describe: Callable[[str, Any], str] = description) -> list[dict]:
    """One entry per registered name, in registration order.

    Name, description, the `extra` column (its key and a function of name and object) if any, options. `registry`:
    anything with `items()` (name -> object).
    """
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
    """Each algorithm with its card's facts: its hyperparameters' defaults, their specs and its capabilities."""
    from dfl.algorithms import ALGORITHMS, option_defaults  # the registry: name -> class

    entries = registry_entries(ALGORITHMS, ("centralized", lambda name, cls: ALGORITHMS.card(name).centralized))
    for entry in entries:
        card = ALGORITHMS.card(entry["name"])
        entry["options"] = card.defaults()
        entry["specs"] = spec_entries(card.specs())
        entry["capabilities"] = {"push_sum": card.push_sum, "byzantine": card.byzantine, "dp": card.dp,
                                 "compression": card.compression and not card.centralized,
                                 "asynchronous": card.asynchronous, "local_optimizers": list(card.local_optimizers),
                                 "sends": card.sends}
        own = list(option_defaults(card))  # set by --algorithm-options, no flag of their own
        if own:
            entry["algorithm_options"] = own
            entry["note"] = f"--algorithm-options: {', '.join(own)}"
    return entries


def spec_entries(specs: Any) -> dict[str, dict[str, str]]:
    """Name -> {type, allowed, help} of each option spec (`dfl.specs.Param`), what `dfl list` prints per option."""
    return {spec.name: {"type": spec.type, "allowed": spec.allowed, "help": spec.help} for spec in specs}


def _topologies() -> list[dict]:
    from dfl.graphs import SPECS, TOPOLOGIES, BuiltinTopology

    entries = registry_entries(TOPOLOGIES, ("kind", lambda name, obj: getattr(obj, "kind", "registered")))
    for entry in entries:  # a built-in's card declares its options' specs; a plug-in its `options=` spec, if any
        factory = TOPOLOGIES.get(entry["name"])
        if isinstance(factory, BuiltinTopology):
            entry["specs"] = spec_entries(factory.specs())
        elif entry["name"] in SPECS:
            entry["specs"] = spec_entries(SPECS[entry["name"]].specs())
    return entries


def _models() -> list[dict]:
    from dfl.models import MODELS  # the registry: built-ins, then registered and installed (entry point) models

    def describe(name: str, builder: Any) -> str:
        return summary(own_doc(builder)) or f"from {MODELS.source(name)}"

    entries = registry_entries(MODELS, describe=describe)
    for entry in entries:  # a built-in's card declares its options' specs (a plug-in: its signature's defaults)
        spec = MODELS.card(entry["name"]).spec
        if spec is not None and spec.specs():
            entry["specs"] = spec_entries(spec.specs())
    return entries


def _datasets() -> list[dict]:
    from dfl.data import DATASETS, dataset_specs, needs_root

    entries = registry_entries(DATASETS, ("source", lambda name, _: "local files (data_root)" if needs_root(name)
                                          else "embedded"))
    for entry in entries:  # a built-in's card declares its options' specs (a plug-in: its signature's defaults)
        specs = dataset_specs(entry["name"])
        if specs:
            entry["specs"] = spec_entries(specs)
    return entries


def _partitions() -> list[dict]:
    from dfl.data import PARTITIONS, partition_options, partition_specs

    entries = registry_entries(PARTITIONS)
    for entry in entries:  # what a config may give: an option the dataset supplies (natural's split) is not one
        entry["options"] = partition_options(entry["name"])
        specs = partition_specs(entry["name"])
        if specs:
            entry["specs"] = spec_entries(specs)
    return entries


def _weights() -> list[dict]:
    """Each weight scheme with its card (`dfl.graphs.WEIGHTS`): its options' specs, and which sums of W are 1."""
    from dfl.graphs import WEIGHTS

    registry = importlib.import_module("topologies.weights")
    entries = []
    for name, card in WEIGHTS.items():  # each scheme's sparse_<name> (lazy: the function `lazy`) says what it gives
        fn = getattr(registry, "sparse_" + name.replace("-", "_"), None) or getattr(registry, name, None)
        entry = {"name": name, "description": summary(getattr(fn, "__doc__", None)), "options": card.options.defaults(),
                 "capabilities": {"stochastic": card.stochastic, "regular": card.regular,
                                  "undirected": card.undirected, "reweighs_failures": card.under_failures is None}}
        if card.specs():
            entry["specs"] = spec_entries(card.specs())
        entries.append(entry)
    return entries


def _loggers() -> list[dict]:
    from dfl.loggers import LOGGERS

    return registry_entries(LOGGERS)

def _attacks() -> list[dict]:
    from dfl.network.byzantine_settings import ATTACKS

    def scale(name: str, _: Any) -> str:
        value = ATTACKS.card(name).scale
        shown = f"{value:g}" if isinstance(value, (int, float)) else f"{value.__name__}(clients, byzantine)"
        return f"scale: {shown}"

    return registry_entries(ATTACKS, ("scale", scale))


def _aggregators() -> list[dict]:
    from dfl.network.byzantine_settings import AGGREGATORS

    def where(name: str, _: Any) -> str:
        card = AGGREGATORS.card(name)
        return " and ".join(kind for kind, on in (("gossip", card.gossip), ("server", card.server)) if on)

    entries = registry_entries(AGGREGATORS, ("where", where))
    for entry in entries:  # the fields each reads (`trim`, `clip_radius`), from its card
        card = AGGREGATORS.card(entry["name"])
        entry["options"] = {**({"trim": None} if card.trim != "no" else {}),
                            **({"clip_radius": signatures.REQUIRED if card.clip_radius == "required" else None}
                               if card.clip_radius != "no" else {})}
    return entries


def _compressors() -> list[dict]:
    """Each compressor with its card: what the config field `compression` means for it, and what it is."""
    from dfl.network.settings import COMPRESSORS

    entries = registry_entries(COMPRESSORS)
    for entry in entries:
        card = COMPRESSORS.card(entry["name"])
        entry["options"] = card.option.defaults()
        entry["specs"] = spec_entries(card.option.specs())
        entry["capabilities"] = {"unbiased": card.unbiased, "omega": card.omega, "sends": card.sends}
        entry["note"] = (f"{'unbiased' if card.unbiased else 'biased'}; ω = {card.omega}, the default of "
                         f"consensus_lr; a message: {card.sends}")
    return entries


LISTERS: dict[str, Callable[[], list[dict]]] = {
    "algorithms": _algorithms, "topologies": _topologies, "models": _models,
    "datasets": _datasets, "partitions": _partitions, "weights": _weights, "loggers": _loggers,
    "attacks": _attacks, "aggregators": _aggregators, "compressors": _compressors,
}


def entries(category: str) -> list[dict]:
    """The entries of one category (one of `CATEGORIES`): name, description, options, and the category's extras."""
    return LISTERS[category]()

