"""The built-in models as the registry declares them: where each factory lives, and its card.

A model's card is what validation reads of it before anything is built (`dfl.models.check_config`): the options
it accepts with their defaults (the factory's keyword-only parameters), or None for a factory whose signature
cannot be read (any option goes to the call). Declaring the built-ins by card keeps `dfl.models.registry` (and
torch) unimported until a run builds a model; `tests/test_fast_refusals.py` keeps each card equal to that of
the factory it declares.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from dfl.models import shapes
from dfl.specs import Spec, checked, param

CONV_IMPLS = ("auto", "unfold", "native")  # how the convolutions run
CNN_VARIANTS = ("auto", "mcmahan", "cifar")


@dataclass(frozen=True)
class ModelCard:
    """The options a model factory accepts (name -> default; "required" without one), None: any.

    `spec`: a built-in's options as typed specs (`dfl.specs`: type, default, allowed values, help), the one place
    they are described; its names and defaults are `options`. `inputs`: what samples it takes, asked before torch
    loads (`dfl.models.shapes.InputCheck`: (sample shape or None, options) -> None, or the problem in one line); its
    builder raises the same at build time. None: any (a plug-in's factory says so when it is built).
    """

    options: dict[str, Any] | None
    spec: type[Spec] | None = field(default=None, compare=False)
    inputs: shapes.InputCheck | None = field(default=None, compare=False)


def _conv_impl() -> Any:
    return param("auto", "how the convolutions run: native (torch's), unfold (unfold + matmul) or auto (native, "
                 "measured the faster inside the engine's vmapped steps)", choices=CONV_IMPLS)


@dataclass(frozen=True)
class MlpOptions(Spec):
    """The options of model mlp."""

    hidden: tuple[int, ...] = param((200, 200), "the widths of the hidden layers", items="[1, inf)")


@dataclass(frozen=True)
class ConvOptions(Spec):
    """The options of models cnn1d and vgg11."""

    conv_impl: str = _conv_impl()


@dataclass(frozen=True)
class CnnOptions(Spec):
    """The options of model cnn."""

    variant: str = param("auto", "mcmahan, cifar, or auto: cifar for 3-channel images, mcmahan otherwise",
                         choices=CNN_VARIANTS)
    conv_impl: str = _conv_impl()


@dataclass(frozen=True)
class ResnetOptions(Spec):
    """The options of models resnet18 and resnet20."""

    groups: int = param(2, "the groups of every GroupNorm; must divide every stage width", interval="[1, inf)")
    conv_impl: str = _conv_impl()


def _declared(spec: type[Spec], inputs: shapes.InputCheck) -> ModelCard:
    return ModelCard(spec.defaults(), spec, inputs)


SPECS: dict[str, type[Spec]] = {}
"""The option specs of the models registered with `dfl.models.register(..., options=...)` (`dfl.specs`: type,
default, allowed values, help), by name; a plug-in without one is known by its signature's defaults."""


def describe(name: str, factory: Any) -> ModelCard:
    """The card of a registered factory: its options read from its signature, and its spec if it was given one."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # no signature (a builtin): any option goes to the call
        return ModelCard(None)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return ModelCard(None)
    return ModelCard({p.name: "required" if p.default is inspect.Parameter.empty else p.default
                      for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}, SPECS.get(name))


def checked_spec(name: str, spec: type[Spec], factory: Any) -> type[Spec]:
    """`spec`, unless its names and defaults differ from the keyword-only options of `factory`: ValueError."""
    declared = describe(name, factory).options
    if declared is None and isinstance(spec, type) and issubclass(spec, Spec):
        raise ValueError(f"model {name!r}: an options spec needs a factory whose options are keyword-only "
                         "parameters, not **kwargs")
    return checked("model", name, spec, declared or {})


# name -> ("module:factory", card), in the order `dfl list models` shows them; `tests/test_fast_refusals.py` keeps
# each card's options equal to its factory's signature
BUILTINS: dict[str, tuple[str, ModelCard]] = {
    "logreg": ("dfl.models.registry:_logreg", _declared(Spec, shapes.any_input)),
    "mlp": ("dfl.models.registry:_mlp", _declared(MlpOptions, shapes.any_input)),
    "cnn1d": ("dfl.models.registry:_cnn1d", _declared(ConvOptions, shapes.signal_input)),
    "cnn": ("dfl.models.registry:_cnn", _declared(CnnOptions, shapes.cnn_input)),
    "resnet18": ("dfl.models.registry:_resnet18", _declared(ResnetOptions, shapes.resnet_input(18))),
    "resnet20": ("dfl.models.registry:_resnet20", _declared(ResnetOptions, shapes.resnet_input(20))),
    "vgg11": ("dfl.models.registry:_vgg11", _declared(ConvOptions, shapes.image_input(shapes.VGG_MIN_SIDE))),
}
