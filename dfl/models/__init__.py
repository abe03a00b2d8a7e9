"""Models for vectorized multi-client training (`functional_call` + `vmap` over a client axis).

    model = build_model("cnn1d", (1, 40), 10, conv_impl="unfold")

Names in `MODELS`; options per model in `model_options(name)`. Convolutions take
`conv_impl` in ("auto", "unfold", "native"); see `dfl.models.layers` for what "auto" picks and why.
"""

from __future__ import annotations

from dfl.models.layers import CONV_IMPLS
from dfl.models.layout import num_params, param_layout
from dfl.models.registry import MODELS, build_model, model_options

__all__ = ["CONV_IMPLS", "MODELS", "build_model", "model_options", "num_params", "param_layout"]
