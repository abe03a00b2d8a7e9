"""What a logger is: the `Logger` base class, the `RunInfo` its `start` gets, and helpers for writing one."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfl.config import Config
from dfl.errors import ConfigError


@dataclass(frozen=True)
class RunInfo:
    """What loggers' `start` and callbacks' `on_run_start` get: the run as it starts (or resumes)."""

    config: Config
    hyperparameters: dict[str, Any]  # the algorithm's, its defaults overridden by the config
    out_dir: Path | None  # the run directory (None: dfl.run without out=)
    start_round: int = 0  # rounds already done: a resumed run's checkpoint round, 0 for a fresh run
    history: list[dict[str, Any]] = field(default_factory=list)  # the metrics records so far (resumed runs)
    summary: dict[str, Any] = field(default_factory=dict)  # summary.json as the run starts


class Logger:
    """Base class of a logger: every method does nothing (override those you need)."""

    needs_out_dir = False  # True: writes under the run directory, so `out` is required

    def start(self, info: RunInfo) -> None:
        """Called once before the first round of this session, with the config, hyperparameters and run so far."""

    def log(self, round: int, metrics: dict[str, Any]) -> None:
        """Called after each evaluated round's record is written to metrics.jsonl, with that record."""

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        """Called once however the run ends: its status ("completed", "stopped", "diverged", ...) and summary."""


def require(logger: str, package: str, install: str) -> Any:
    """Import `package` for a logger, or refuse the config with the pip command.

    Import `package` for the logger named `logger`, or raise a ConfigError naming the field and the pip
    command (`install`).
    """
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ConfigError(f"loggers: {logger!r} needs the {package} package, which is not installed ({exc}); "
                          f"install it with: {install}") from exc


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The scalar metrics of a record (numbers, not bools, not `round`): what one plots against the round."""
    return {k: float(v) for k, v in metrics.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}
