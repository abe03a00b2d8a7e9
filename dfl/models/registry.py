"""`build_model(spec, input_shape, num_classes, **options)`: the model zoo behind one name table, `MODELS`.

`MODELS` (`dfl.models`) is a `dfl.registry.Registry("model", group="dfl.models")`: the built-ins below (declared
there by card, `dfl.models.builtin`, so a config is checked without importing this module and torch), factories
registered with `@dfl.models.register("name")`, and those of installed packages (entry points in group
`dfl.models`).
A spec is a registered name or your own factory, "package.module:factory" (`dfl.models.custom`).

Every factory takes (input_shape, num_classes) plus keyword-only options; those keyword names are the only
options a model accepts (`model_options`). The built-in models are plain `nn.Module`s on CPU in float32, with
parameters only (no buffers, no randomness in forward), so `torch.func.functional_call` + `vmap` over a leading
client dimension of the parameters is exact. Initialization draws from torch's global RNG: seed it first.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from dfl.errors import ModelError
from dfl.models import MODELS
from dfl.models.builtin import BUILTINS, CNN_VARIANTS
from dfl.models.cnn import CNN, CNN1d
from dfl.models.custom import check_signature, factory_of
from dfl.models.layers import check_conv_impl
from dfl.models.resnet import resnet18, resnet20
from dfl.models.shapes import (
    RESNET_MIN_SIDE,
    VGG_MIN_SIDE,
    as_shape,
    cnn_min_side,
    cnn_variant,
    image_shape,
    resnet_groups,
    sequence_shape,
)
from dfl.models.simple import MLP, LogReg
from dfl.models.vgg import VGG


def _positive_int(field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelError(f"{field} must be a positive int, got {value!r}")
    return value


def _logreg(input_shape, num_classes):
    """Logistic regression: multinomial logistic regression on the flattened input, logits = W vec(x) + b.

    The convex baseline: one linear layer, softmax cross-entropy on its logits.

    Args:
        input_shape: one sample's shape, without the batch axis.
        num_classes: the number of classes (logits).
    """
    return LogReg(input_shape, num_classes)


def _mlp(input_shape, num_classes, *, hidden=(200, 200)):
    """MLP: a ReLU multilayer perceptron on the flattened input (McMahan et al.'s 2NN with the default widths).

        logits = W_L relu(⋯ relu(W_1 vec(x) + b_1) ⋯) + b_L

    McMahan, Moore, Ramage, Hampson & Agüera y Arcas, "Communication-efficient learning of deep networks from
    decentralized data", AISTATS 2017 (the "2NN": two hidden layers of 200).

    Args:
        input_shape: one sample's shape, without the batch axis.
        num_classes: the number of classes (logits).
    """
    if isinstance(hidden, (str, bytes)) or not hasattr(hidden, "__iter__"):
        raise ModelError(f"hidden must be a sequence of positive ints (layer widths), got {hidden!r}")
    hidden = tuple(_positive_int("hidden[i]", h) for h in hidden)
    return MLP(input_shape, num_classes, hidden)


def _cnn1d(input_shape, num_classes, *, conv_impl="auto"):
    """CNN-1d: two 1-D convolutions and a linear layer, the MNIST-1D model (input (channels, length)).

        conv 1→32 k5, conv 32→32 k3 ("same" padding, ReLU), linear 32·L → classes

    On MNIST-1D (L = 40) that is 16,106 parameters. Greydanus & Kobak, "Scaling down deep learning with
    MNIST-1D", ICML 2024.

    Args:
        input_shape: one sample's shape, without the batch axis.
        num_classes: the number of classes (logits).
    """
    channels, length = sequence_shape("cnn1d", input_shape)
    return CNN1d(channels, length, num_classes, check_conv_impl(conv_impl))


def _cnn(input_shape, num_classes, *, variant="auto", conv_impl="auto"):
    """CNN: the two-convolution image CNNs of the federated-learning literature (McMahan's, or the CIFAR one).

    - "mcmahan" (McMahan et al., AISTATS 2017, the FedAvg CNN on (E)MNIST): conv5×5 32 "same", maxpool 2,
      conv5×5 64 "same", maxpool 2, FC 512, FC classes; 1,663,370 parameters on 28×28×1, 10 classes.
    - "cifar" (the LeNet-5 style CIFAR CNN of Caldarola et al.'s FedSAM, ECCV 2022, and FedGLoSS): conv5×5 64
      (valid), maxpool 2, conv5×5 64 (valid), maxpool 2, FC 384, FC 192, FC classes.

    Args:
        input_shape: one sample's shape, without the batch axis.
        num_classes: the number of classes (logits).
    """
    if variant not in CNN_VARIANTS:
        raise ModelError(f"variant must be one of {CNN_VARIANTS}, got {variant!r}")
    variant = cnn_variant(variant, input_shape)  # auto: colour images get the CIFAR CNN, grey-scale ones McMahan's
    shape = image_shape("cnn", input_shape, min_side=cnn_min_side(variant))
    return CNN(shape, num_classes, variant, check_conv_impl(conv_impl))


def _resnet(depth: int):
    def build(input_shape, num_classes, *, groups=2, conv_impl="auto"):
        c, _, _ = image_shape(f"resnet{depth}", input_shape, min_side=RESNET_MIN_SIDE)
        problem = resnet_groups(depth, _positive_int("groups", groups))
        if problem is not None:
            raise ModelError(problem)
        return (resnet18 if depth == 18 else resnet20)(c, num_classes, groups, check_conv_impl(conv_impl))

    return build


def _vgg11(input_shape, num_classes, *, conv_impl="auto"):
    """VGG-11: Simonyan & Zisserman's configuration "A" for 32×32 images, without BatchNorm or dropout.

    Simonyan & Zisserman, "Very deep convolutional networks for large-scale image recognition", ICLR 2015.
    Features conv3×3 + ReLU of widths 64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M (M = maxpool 2);
    classifier FC 512, ReLU, FC 512, ReLU, FC classes (dropout removed so that training is deterministic).
    Inputs must be at least 32×32.

    Args:
        input_shape: one sample's shape, without the batch axis.
        num_classes: the number of classes (logits).
    """
    c, _, _ = image_shape("vgg11", input_shape, min_side=VGG_MIN_SIDE)
    return VGG(c, num_classes, check_conv_impl(conv_impl))


_resnet18, _resnet20 = _resnet(18), _resnet(20)
_resnet18.__doc__ = """ResNet-18: He et al.'s 18-layer ResNet in its CIFAR form, GroupNorm instead of BatchNorm.

    He, Zhang, Ren & Sun, "Deep residual learning for image recognition", CVPR 2016; GroupNorm as in Hsieh et al.,
    ICML 2020 and Caldarola et al.'s FedSAM (no running statistics to keep per client). 3×3 stride-1 stem without
    max-pool, basic blocks [2, 2, 2, 2] of 64/128/256/512 channels, global average pool, FC; 11.2M parameters.

    Args:
        input_shape: one sample's shape, without the batch axis.
        num_classes: the number of classes (logits).
    """
_resnet20.__doc__ = """ResNet-20: the 3-stage CIFAR ResNet of He et al. (CVPR 2016, Sec. 4.2), with GroupNorm.

    3 basic blocks per stage with 16/32/64 channels, global average pool, FC; 0.27M parameters. GroupNorm keeps no
    running statistics, so every client's model is its parameters alone.

    Args:
        input_shape: one sample's shape, without the batch axis.
        num_classes: the number of classes (logits).
    """

for _name, (_target, _card) in BUILTINS.items():  # the options' Args lines are generated from the card's spec
    _factory = globals()[_target.split(":")[1]]
    _args = _card.spec.docstring_args().splitlines()[1:] if _card.spec is not None else []
    if _args:
        _factory.__doc__ = inspect.cleandoc(_factory.__doc__ or "") + "\n" + "\n".join(_args)
del _name, _target, _card, _factory, _args

Factory = Callable[..., nn.Module]  # f(input_shape, num_classes, *, option=default, ...) -> nn.Module


def resolve(spec: str) -> Factory:
    """The factory of a registered name or of "package.module:factory" (imported; `dfl.models.custom`)."""
    if spec in MODELS:
        return MODELS.get(spec)
    return factory_of(spec, MODELS.names())


def model_options(spec: str) -> dict[str, object]:
    """The options `spec` accepts, with their defaults (keyword-only parameters of its factory)."""
    params = _parameters(resolve(spec))
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _parameters(factory: Factory) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # no signature (a builtin): any option goes to the call
        return [inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD)]


def build_model(spec: str, input_shape, num_classes: int, **options) -> nn.Module:
    """A freshly initialized model `spec` for inputs of shape `input_shape` (no batch axis)."""
    factory = resolve(spec)
    return call_factory(factory, spec, input_shape, num_classes, options, registered=spec in MODELS)


def call_factory(factory: Factory, spec: str, input_shape, num_classes: int, options: dict,
                 registered: bool = False) -> nn.Module:
    """factory(input_shape, num_classes, **options), checked: known options, an `nn.Module` back.

    Errors of a built-in's own checks (ValueError) pass as they are; anything else names the spec and the call.
    """
    params = _parameters(factory)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        allowed = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ModelError(f"unknown option(s) {unknown} for model {spec!r}; allowed: {sorted(allowed) or 'none'}")
    shape = as_shape(input_shape)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ModelError(f"num_classes must be an int >= 2, got {num_classes!r}")
    check_signature(factory, repr(spec), options)
    try:
        model = factory(shape, num_classes, **options)
    except Exception as exc:
        if registered and isinstance(exc, ValueError):
            raise  # a registered model's own check (e.g. "'cnn1d' expects a 1-D signal") says it all
        text = next((line for line in str(exc).splitlines() if line.strip()), "")
        call = ", ".join([repr(shape), repr(num_classes), *(f"{k}={v!r}" for k, v in options.items())])
        raise ModelError(f"model {spec!r} failed when called as f({call}): {type(exc).__name__}: {text}") from exc
    if not isinstance(model, nn.Module):
        raise ModelError(f"model {spec!r} must return an nn.Module; its factory returned {type(model).__name__}")
    return model
