"""Models for vectorized multi-client training (`functional_call` + `vmap` over a client axis; the built-in logreg,
mlp and cnn1d also define `batched_forward`, every client's forward at once without vmap: `dfl.training.batched`).

    model = build_model("cnn1d", (1, 40), 10, conv_impl="unfold")

    @dfl.models.register("small-mlp")            # your own, by name (or "package.module:factory" in a config)
    def small_mlp(input_shape, num_classes, *, width=32): ...

Names in `MODELS` (a `dfl.registry.Registry`); options per model in `model_options(name)`. Convolutions take
`conv_impl` in ("auto", "unfold", "native"); see `dfl.models.layers` for what "auto" picks and why. What a model
of your own must satisfy (and why BatchNorm with running statistics is rejected): `dfl.models.check`.
"""

from __future__ import annotations

from dfl.errors import ConfigError
from dfl.models.check import check_model
from dfl.models.custom import ModelError, check_spec, spec_of
from dfl.models.layers import CONV_IMPLS
from dfl.models.layout import num_params, param_layout
from dfl.models.modes import eval_mode
from dfl.models.registry import MODELS, build_model, model_options, register, resolve
from dfl.models.setup import model_for_run

__all__ = ["CONV_IMPLS", "MODELS", "ModelError", "build_model", "check_model", "check_spec", "eval_mode",
           "model_for_run", "model_options", "num_params", "param_layout", "register", "resolve", "spec_of"]


def check_config(config) -> None:
    """The model's part of `dfl.validate`: `model` is a registered name or an importable
    "package.module:factory" (imported now, so a typo fails before any work)."""
    try:
        check_spec(config.model, MODELS)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
