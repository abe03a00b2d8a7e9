"""`build_model(name, input_shape, num_classes, **options)`: the model zoo behind one name table.

Every builder takes (input_shape, num_classes) plus keyword-only options; those keyword names are the
only options a model accepts. Models are plain `nn.Module`s on CPU in float32, with parameters only
(no buffers, no randomness in forward), so `torch.func.functional_call` + `vmap` over a leading client
dimension of the parameters is exact. Initialization draws from torch's global RNG: seed it first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from dfl.models.cnn import CNN, CNN1d
from dfl.models.layers import check_conv_impl
from dfl.models.resnet import resnet18, resnet20
from dfl.models.shapes import as_shape, image_shape, sequence_shape
from dfl.models.simple import MLP, LogReg
from dfl.models.vgg import VGG

CNN_VARIANTS = ("auto", "mcmahan", "cifar")


def _positive_int(field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be a positive int, got {value!r}")
    return value


def _logreg(input_shape, num_classes):
    return LogReg(input_shape, num_classes)


def _mlp(input_shape, num_classes, *, hidden=(200, 200)):
    if isinstance(hidden, (str, bytes)) or not hasattr(hidden, "__iter__"):
        raise ValueError(f"hidden must be a sequence of positive ints (layer widths), got {hidden!r}")
    hidden = tuple(_positive_int("hidden[i]", h) for h in hidden)
    return MLP(input_shape, num_classes, hidden)


def _cnn1d(input_shape, num_classes, *, conv_impl="auto"):
    channels, length = sequence_shape("cnn1d", input_shape)
    return CNN1d(channels, length, num_classes, check_conv_impl(conv_impl))


def _cnn(input_shape, num_classes, *, variant="auto", conv_impl="auto"):
    if variant not in CNN_VARIANTS:
        raise ValueError(f"variant must be one of {CNN_VARIANTS}, got {variant!r}")
    if variant == "auto":  # colour images get the CIFAR CNN, grey-scale ones McMahan's
        variant = "cifar" if len(input_shape) == 3 and input_shape[0] == 3 else "mcmahan"
    shape = image_shape("cnn", input_shape, min_side=4 if variant == "mcmahan" else 16)
    return CNN(shape, num_classes, variant, check_conv_impl(conv_impl))


def _resnet(depth: int):
    def build(input_shape, num_classes, *, groups=2, conv_impl="auto"):
        c, _, _ = image_shape(f"resnet{depth}", input_shape, min_side=8)
        widths = (64, 128, 256, 512) if depth == 18 else (16, 32, 64)
        if any(w % _positive_int("groups", groups) for w in widths):
            raise ValueError(f"groups must divide every stage width {widths} of resnet{depth}, got {groups}")
        return (resnet18 if depth == 18 else resnet20)(c, num_classes, groups, check_conv_impl(conv_impl))

    return build


def _vgg11(input_shape, num_classes, *, conv_impl="auto"):
    c, _, _ = image_shape("vgg11", input_shape, min_side=32)
    return VGG(c, num_classes, check_conv_impl(conv_impl))


_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "logreg": _logreg,
    "mlp": _mlp,
    "cnn1d": _cnn1d,
    "cnn": _cnn,
    "resnet18": _resnet(18),
    "resnet20": _resnet(20),
    "vgg11": _vgg11,
}
MODELS: tuple[str, ...] = tuple(_BUILDERS)


def model_options(name: str) -> dict[str, object]:
    """The options `name` accepts, with their defaults."""
    if name not in _BUILDERS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}")
    params = inspect.signature(_BUILDERS[name]).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def build_model(name: str, input_shape, num_classes: int, **options) -> nn.Module:
    """A freshly initialized model `name` for inputs of shape `input_shape` (no batch axis)."""
    allowed = model_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        allowed_names = sorted(allowed) or "none"
        raise ValueError(f"unknown option(s) {unknown} for model {name!r}; allowed: {allowed_names}")
    shape = as_shape(input_shape)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
    return _BUILDERS[name](shape, num_classes, **options)
