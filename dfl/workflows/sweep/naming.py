"""Run names: each run of a sweep is named after its varied fields (`algorithm=dfedsam,topology=ring,seed=0`)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from dfl.config import MAX_NAME

NAME_CHARS = re.compile(r"[^A-Za-z0-9._=,-]")  # replaced by "_" in the run names built from settings


def run_name(overrides: dict[str, Any]) -> str:
    """The name of the run with the varied fields `overrides`: `field=value,...` in their order.

    E.g. `algorithm=dfedsam,topology=ring,seed=0`; characters outside [A-Za-z0-9._=,-] become `_` (values
    render as `format_value` says); "base" when nothing varies. A name longer than `MAX_NAME` is cut and ends in
    a hash of the whole, so it stays a valid directory name and unique.
    """
    if not overrides:
        return "base"
    name = NAME_CHARS.sub("_", ",".join(f"{k}={format_value(v)}" for k, v in overrides.items()))
    if len(name) > MAX_NAME:  # keep it a valid directory name, and unique
        name = name[: MAX_NAME - 11] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


def format_value(value: Any) -> str:
    """A value as a run name writes it.

    Booleans lower case, floats by repr, tables as `k=v_k=v` (`default` if empty), lists as `a-b` (`none` if
    empty).
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list, tuple)) and not value:
        return "default" if isinstance(value, dict) else "none"
    if isinstance(value, dict):
        return "_".join(f"{k}={format_value(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "-".join(format_value(v) for v in value)
    return str(value)

