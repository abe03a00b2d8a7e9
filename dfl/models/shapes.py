"""Input-shape checks shared by the model builders: fail at build time with a clear message."""

from __future__ import annotations

from dfl.errors import ModelError


def as_shape(input_shape) -> tuple[int, ...]:
    """A non-empty tuple of positive ints, or ValueError naming `input_shape`."""
    try:
        shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError) as exc:  # not a sequence, or "x" among its entries
        raise ModelError(f"input_shape must be a sequence of positive ints, got {input_shape!r}") from exc
    if not shape or any(s <= 0 for s in shape) or list(shape) != list(input_shape):
        raise ModelError(f"input_shape must be a non-empty sequence of positive ints, got {input_shape!r}")
    return shape


def sequence_shape(model: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(channels, length) of a 1-D signal given as (L,) or (C, L)."""
    if len(shape) == 1:
        return 1, shape[0]
    if len(shape) == 2:
        return shape
    raise ModelError(f"model {model!r} expects a 1-D signal, input_shape (L,) or (C, L); got {shape}")


def image_shape(model: str, shape: tuple[int, ...], min_side: int = 1) -> tuple[int, int, int]:
    """(channels, height, width) of an image given as (C, H, W) with H, W >= min_side."""
    if len(shape) != 3:
        raise ModelError(f"model {model!r} expects images, input_shape (C, H, W); got {shape}")
    if min(shape[1:]) < min_side:
        raise ModelError(f"model {model!r} needs images of at least {min_side}x{min_side}; got {shape}")
    return shape
