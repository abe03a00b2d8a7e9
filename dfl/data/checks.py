"""Option checks shared by the dataset loaders: each failure names the option and its allowed range."""

from __future__ import annotations

from typing import Any

import numpy as np

from dfl.errors import DataError

MAX_INT = 2**63 - 1  # numpy and torch hold 64-bit integers


def check_int(field_name: str, value: Any, minimum: int) -> int:
    """`value` as an int >= `minimum` that fits in 64 bits, or a DataError naming `field_name`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataError(f"{field_name} must be an int >= {minimum}, got {shown(value)}")
    if value > MAX_INT:
        raise DataError(f"{field_name} must be an integer that fits in 64 bits (at most 2^63 - 1), got {shown(value)}")
    return int(value)


def shown(value: Any, limit: int = 80) -> str:
    """`value` as a message shows it.

    Its repr on one line, cut at `limit` characters (an integer too long to print, above Python's 4300 digits, by
    its size).
    """
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value).replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_float(field_name: str, value: Any, low: float, high: float | None = None, *, open_low: bool = True,
                open_high: bool = True) -> float:
    """`value` as a finite float in the interval from `low` to `high`, or a DataError naming `field_name`.

    Args:
        field_name: the option's name, for the message.
        value: the value given.
        low: the lower bound.
        high: the upper bound (None: none).
        open_low: whether `low` itself is excluded.
        open_high: whether `high` itself is excluded.
    """
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        try:
            v = float(value)
        except OverflowError:  # an int beyond the largest float
            v = float("inf")
        ok = np.isfinite(v) and (v > low if open_low else v >= low)
        if ok and high is not None:
            ok = v < high if open_high else v <= high
    if not ok:
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        raise DataError(f"{field_name} must be a number in {lo}{low}, {'inf' if high is None else high}{hi}, "
                        f"got {shown(value)}")
    return float(value)
