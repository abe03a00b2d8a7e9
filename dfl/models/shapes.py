"""Input-shape checks shared by the model builders and validation: torch-free, one place for what a model takes.

The builders fail at build time with a clear message (`sequence_shape`, `image_shape`); the same facts are each
built-in model's card's `inputs` (`dfl.models.builtin.ModelCard`), which `dfl.validate` asks before torch loads, with
the dataset's sample shape (its card's `DataShape`, or the caller's own data).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dfl.errors import ModelError

# (sample shape, or None before the data is known; the model's options) -> None, or one line naming the field
InputCheck = Callable[[tuple[int, ...] | None, dict[str, Any]], str | None]

RESNET_WIDTHS = {18: (64, 128, 256, 512), 20: (16, 32, 64)}  # the channels of each stage, which groups divides
RESNET_MIN_SIDE = 8  # the smallest image side a ResNet takes (its strided stages)
VGG_MIN_SIDE = 32  # VGG-11's five poolings


def as_shape(input_shape) -> tuple[int, ...]:
    """A non-empty tuple of positive ints, or ValueError naming `input_shape`."""
    try:
        shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError) as exc:  # not a sequence, or "x" among its entries
        raise ModelError(f"input_shape must be a sequence of positive ints, got {input_shape!r}") from exc
    if not shape or any(s <= 0 for s in shape) or list(shape) != list(input_shape):
        raise ModelError(f"input_shape must be a non-empty sequence of positive ints, got {input_shape!r}")
    return shape


SIGNAL = "a 1-D signal, input_shape (L,) or (C, L)"
IMAGES = "images, input_shape (C, H, W)"


def sequence_shape(model: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(channels, length) of a 1-D signal given as (L,) or (C, L)."""
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape
    raise ModelError(f"model {model!r} expects {SIGNAL}; got {shape}")


def image_shape(model: str, shape: tuple[int, ...], min_side: int = 1) -> tuple[int, int, int]:
    """(channels, height, width) of an image given as (C, H, W) with H, W >= min_side."""
    problem = _image_problem(shape, min_side)
    if problem is not None:
        raise ModelError(f"model {model!r} {problem}; got {shape}")
    c, h, w = shape
    return c, h, w


def _image_problem(shape: tuple[int, ...], min_side: int) -> str | None:
    if len(shape) != 3:
        return f"expects {IMAGES}"
    if min(shape[1:]) < min_side:
        return f"needs images of at least {min_side}x{min_side}"
    return None


def cnn_variant(variant: str, shape: tuple[int, ...]) -> str:
    """The CNN a variant names on samples of `shape`: auto is cifar for colour images, mcmahan otherwise."""
    if variant != "auto":
        return variant
    return "cifar" if len(shape) == 3 and shape[0] == 3 else "mcmahan"


def cnn_min_side(variant: str) -> int:
    """The smallest image side the CNN `variant` (mcmahan or cifar) takes.

    Its two poolings (and the CIFAR CNN's valid convolutions) must leave at least one pixel.
    """
    return 4 if variant == "mcmahan" else 16


def resnet_groups(depth: int, groups: Any) -> str | None:
    """None when GroupNorm's `groups` divides every stage width of resnet`depth`, else the problem."""
    widths = RESNET_WIDTHS[depth]
    if isinstance(groups, int) and not isinstance(groups, bool) and groups >= 1 and any(w % groups for w in widths):
        divisors = ", ".join(str(g) for g in range(1, widths[0] + 1) if not widths[0] % g)
        return (f"model_options.groups = {groups}: GroupNorm's groups must divide every stage width {widths} of "
                f"resnet{depth} (use one of {divisors})")
    return None


def any_input(shape: tuple[int, ...] | None, options: dict[str, Any]) -> str | None:
    """Any sample shape (the model flattens it)."""
    return None


def signal_input(shape: tuple[int, ...] | None, options: dict[str, Any]) -> str | None:
    """A 1-D signal (cnn1d)."""
    if shape is None or len(shape) in (1, 2):
        return None
    return f"takes {SIGNAL}"


def image_input(min_side: int) -> InputCheck:
    """Images of at least min_side x min_side."""
    def check(shape: tuple[int, ...] | None, options: dict[str, Any]) -> str | None:
        return None if shape is None else _takes_image(shape, min_side)
    return check


def cnn_input(shape: tuple[int, ...] | None, options: dict[str, Any]) -> str | None:
    """Images, at least 4x4 for McMahan's CNN and 16x16 for the CIFAR one."""
    if shape is None:
        return None
    variant = cnn_variant(options.get("variant", "auto"), shape)
    problem = _takes_image(shape, cnn_min_side(variant))
    return None if problem is None else f"{problem} (variant {variant})" if len(shape) == 3 else problem


def resnet_input(depth: int) -> InputCheck:
    """Images of at least RESNET_MIN_SIDE, and GroupNorm groups that divide every stage width."""
    def check(shape: tuple[int, ...] | None, options: dict[str, Any]) -> str | None:
        return resnet_groups(depth, options.get("groups", 2)) or (
            None if shape is None else _takes_image(shape, RESNET_MIN_SIDE))
    return check


def _takes_image(shape: tuple[int, ...], min_side: int) -> str | None:
    problem = _image_problem(shape, min_side)
    return None if problem is None else problem.replace("expects", "takes").replace("needs", "takes")
