"""Models for vectorized multi-client training, and the `MODELS` registry.

A model is trained for every client at once through `functional_call` + `vmap` over a client axis; the built-in
logreg, mlp and cnn1d also define `batched_forward`, every client's forward at once without vmap
(`dfl.training.batched`).

    model = build_model("cnn1d", (1, 40), 10, conv_impl="unfold")

    @dfl.models.register("small-mlp")            # your own, by name (or "package.module:factory" in a config)
    def small_mlp(input_shape, num_classes, *, width=32): ...

Names in `MODELS` (a `dfl.registry.Registry`); options per model in `model_options(name)`. Convolutions take
`conv_impl` in ("auto", "unfold", "native"); see `dfl.models.layers` for what "auto" picks and why. What a model
of your own must satisfy (and why BatchNorm with running statistics is rejected): `dfl.models.check`.

Checking a config (`check_config`) imports no torch: the built-ins are declared by card (`dfl.models.builtin`),
and the model code loads on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dfl import signatures
from dfl.config import Config
from dfl.errors import ConfigError, ModelError
from dfl.lazy import submodules
from dfl.models.builtin import BUILTINS, SPECS, ModelCard, checked_spec, describe
from dfl.models.custom import check_signature, check_spec, spec_of
from dfl.registry import Registry
from dfl.specs import Spec

MODELS: Registry = Registry("model", group="dfl.models", describe=describe)
"""Every model the config field `model` names: name -> factory f(input_shape, num_classes, *, option=default).

The built-ins are declared by card (`dfl.models.builtin`: their options without importing torch; the factory loads
on the first `get`); `register` adds a factory after checking its signature, installed packages theirs by entry
point (group `dfl.models`). A config may also name "package.module:factory" directly (`dfl.models.custom`)."""
for _name, (_target, _card) in BUILTINS.items():
    MODELS.declare(_name, _target, _card)
del _name, _target, _card

# the model code, on first use (it imports torch)
__getattr__ = submodules(__name__, {
    "check_model": "dfl.models.check", "CONV_IMPLS": "dfl.models.builtin", "num_params": "dfl.models.layout",
    "param_layout": "dfl.models.layout", "eval_mode": "dfl.models.modes", "build_model": "dfl.models.registry",
    "model_options": "dfl.models.registry", "resolve": "dfl.models.registry",
    "model_for_run": "dfl.models.setup",
})



def register(name: str, factory: Callable | None = None, *, replace: bool = False,
             options: type[Spec] | None = None) -> Any:
    """Register a model factory under `name` (`@dfl.models.register("my-cnn")` on the factory, or a call).

    The factory is called as `factory(input_shape, num_classes, **model_options)` after
    `torch.manual_seed(config.seed)` and returns an `nn.Module`; its keyword-only parameters are the options
    (`model_options`) the model accepts. A name already registered by another object is an error naming both.
    `options`: the spec of those options (`dfl.specs.Spec`: type, default, allowed values, one help line each),
    whose names and defaults must be the signature's (checked here): `dfl list models` shows it and `dfl.validate`
    refuses a value outside it, naming `model_options.NAME`, before torch loads. Torch-free: an installed package's
    factory (entry point, group `dfl.models`) is registered here too, its spec read from its `options` attribute.
    """
    if isinstance(name, str) and (":" in name or name.endswith(")")):
        raise ModelError(f"model name {name!r} may not contain ':' or end with ')' (those spell "
                         "'package.module:factory' and recorded Python objects)")

    def add(target: Callable) -> Callable:
        check_signature(target, repr(name))
        try:
            spec = checked_spec(name, options, target) if options is not None else None
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        registered = MODELS.register(name, target, replace=replace)
        SPECS.pop(name, None)
        if spec is not None:
            SPECS[name] = spec
        return registered

    return add if factory is None else add(factory)


# an entry point's factory: checked as `register` checks one, with the spec its `options` attribute declares
MODELS.plugin = lambda name, factory: register(name, factory, options=getattr(factory, "options", None))

__all__ = ["CONV_IMPLS", "MODELS", "ModelCard", "ModelError", "build_model", "check_model", "check_spec",
           "eval_mode", "model_for_run", "model_options", "num_params", "param_layout", "register", "resolve",
           "spec_of"]


def check_config(config: Config) -> None:
    """The model's part of `dfl.validate`.

    `model` is a registered name (its `model_options` are its options) or an importable "package.module:factory"
    (imported now, so a typo fails before any work).
    """
    try:
        check_spec(config.model, MODELS.names())
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if config.model in MODELS:
        card = MODELS.card(config.model)
        if card.spec is not None:  # each option against its declared choices or range: one line naming it
            try:
                card.spec.check_values(config.model_options, "model_options")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if card.options is not None:
            try:
                signatures.resolve_declared("model", config.model, card.options, config.model_options)
            except ValueError as exc:
                raise ConfigError(f"model_options: {exc}") from None
        problem = card.inputs(None, _options(card, config)) if card.inputs is not None else None
        if problem is not None:  # an option the model's stages constrain (resnet's groups)
            raise ConfigError(problem)


def check_input(config: Config, input_shape: tuple[int, ...], source: str) -> None:
    """The model against the samples it will be given, before torch loads.

    A `ConfigError` naming `model` and the built-in models that take them when its card says it takes other samples
    (`dfl.models.shapes`).

    `source` says where the samples come from ("dataset digits", "the given data"). A model without `inputs` on its
    card (a plug-in, "package.module:factory") is checked when it is built.
    """
    if config.model not in MODELS:
        return
    card = MODELS.card(config.model)
    shape, options = tuple(input_shape), _options(card, config)
    if card.inputs is None or card.inputs(None, options) is not None:  # an option's problem: check_config's
        return
    problem = card.inputs(shape, options)
    if problem is None:
        return
    fits = [name for name, (_, builtin) in BUILTINS.items()
            if builtin.inputs is None or builtin.inputs(shape, builtin.options or {}) is None]
    raise ConfigError(f"model = {config.model} {problem}, but {source} has samples of shape {shape}: use "
                      f"{' or '.join(fits) if len(fits) < 3 else ', '.join(fits[:-1]) + ' or ' + fits[-1]} (or a "
                      f"model of your own)")


def _options(card: ModelCard, config: Config) -> dict:
    """The model's options: its card's defaults, updated with the config's."""
    return {**(card.options or {}), **config.model_options}

