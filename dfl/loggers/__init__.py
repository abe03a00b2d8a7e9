"""Loggers: where every evaluated round's metrics go besides metrics.jsonl, while the run goes on.

`loggers = ["tensorboard", "wandb"]` in a config (`dfl run --log tensorboard`) picks them from `LOGGERS`, the
one registry shape of `dfl.registry` (entry-point group `dfl.loggers`: an installed package adds its own). A
logger is a class built with no arguments, whose constructor checks that its package is installed (else a
`ConfigError` with the pip command, at set-up, before any training), with three methods:

    start(info)               once, before the first round of this session (`dfl.hooks.RunInfo`: the config,
                              the algorithm's hyperparameters, the run directory, the rounds and metrics so far)
    log(round, metrics)       after every evaluated round is written to metrics.jsonl (the record as written)
    finish(status, summary)   once, however the run ends (status "completed", "stopped", "diverged", ...)

They run on the main process only (rank 0 under torchrun). `needs_out_dir = True` marks a logger that writes
into the run directory: asking for it without one (`dfl.run` without `out=`) is a ConfigError.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfl.config import ConfigError
from dfl.registry import Registry

if TYPE_CHECKING:
    from dfl.hooks import RunInfo


class Logger:
    """Base class of a logger: every method does nothing (override those you need)."""

    needs_out_dir = False  # True: writes under the run directory, so `out` is required

    def start(self, info: RunInfo) -> None:
        pass

    def log(self, round: int, metrics: dict[str, Any]) -> None:
        pass

    def finish(self, status: str, summary: dict[str, Any]) -> None:
        pass


LOGGERS: Registry[type[Logger]] = Registry("logger", group="dfl.loggers")


def require(logger: str, package: str, install: str) -> Any:
    """Import `package` for the logger named `logger`, or raise a ConfigError naming the field and the pip
    command (`install`)."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise ConfigError(f"loggers: {logger!r} needs the {package} package, which is not installed ({exc}); "
                          f"install it with: {install}") from exc


def numeric(metrics: dict[str, Any]) -> dict[str, float]:
    """The scalar metrics of a record (numbers, not bools, not `round`): what one plots against the round."""
    return {k: float(v) for k, v in metrics.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def build(names: list[str], out_dir: str | Path | None) -> list[Logger]:
    """One logger per name, each checked (its package importable; a run directory when it needs one)."""
    loggers = []
    for name in names:
        try:
            cls = LOGGERS.get(name, field="loggers")
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        if getattr(cls, "needs_out_dir", False) and out_dir is None:
            raise ConfigError(f"loggers: {name!r} writes under the run directory, so the run needs one: pass "
                              "out= to dfl.run (dfl run always has one: --out, default runs/<name>)")
        loggers.append(cls())
    return loggers


from dfl.loggers.tensorboard import TensorBoardLogger  # noqa: E402  (they subclass Logger, defined above)
from dfl.loggers.wandb import WandbLogger  # noqa: E402

LOGGERS.register("tensorboard", TensorBoardLogger)
LOGGERS.register("wandb", WandbLogger)

__all__ = ["LOGGERS", "Logger", "TensorBoardLogger", "WandbLogger", "build", "numeric", "require"]
