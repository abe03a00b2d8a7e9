"""The built-in models as the registry declares them: where each factory lives, and its card.

A model's card is what validation reads of it before anything is built (`dfl.models.check_config`): the options
it accepts with their defaults (the factory's keyword-only parameters), or None for a factory whose signature
cannot be read (any option goes to the call). Declaring the built-ins by card keeps `dfl.models.registry` (and
torch) unimported until a run builds a model; `tests/test_fast_refusals.py` keeps each card equal to that of
the factory it declares.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelCard:
    """The options a model factory accepts (name -> default; "required" without one), None: any."""

    options: dict[str, Any] | None


def describe(name: str, factory: Any) -> ModelCard:
    """The card of a registered factory, read from its signature."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # no signature (a builtin): any option goes to the call
        return ModelCard(None)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return ModelCard(None)
    return ModelCard({p.name: "required" if p.default is inspect.Parameter.empty else p.default
                      for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY})


_CONV = {"conv_impl": "auto"}
# name -> ("module:factory", card), in the order `dfl list models` shows them
BUILTINS: dict[str, tuple[str, ModelCard]] = {
    "logreg": ("dfl.models.registry:_logreg", ModelCard({})),
    "mlp": ("dfl.models.registry:_mlp", ModelCard({"hidden": (200, 200)})),
    "cnn1d": ("dfl.models.registry:_cnn1d", ModelCard(dict(_CONV))),
    "cnn": ("dfl.models.registry:_cnn", ModelCard({"variant": "auto", **_CONV})),
    "resnet18": ("dfl.models.registry:_resnet18", ModelCard({"groups": 2, **_CONV})),
    "resnet20": ("dfl.models.registry:_resnet20", ModelCard({"groups": 2, **_CONV})),
    "vgg11": ("dfl.models.registry:_vgg11", ModelCard(dict(_CONV))),
}
