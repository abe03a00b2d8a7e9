"""Option checks shared by the dataset loaders: each failure names the option and its allowed range."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_int(field_name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{field_name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_float(field_name: str, value: Any, low: float, high: float | None = None, *, open_low: bool = True,
                open_high: bool = True) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = np.isfinite(v) and (v > low if open_low else v >= low)
        if ok and high is not None:
            ok = v < high if open_high else v <= high
    if not ok:
        lo = "(" if open_low else "["
        hi = ")" if open_high else "]"
        raise ValueError(f"{field_name} must be a number in {lo}{low}, {'inf' if high is None else high}{hi}, "
                         f"got {value!r}")
    return float(value)
