"""Loggers: where every evaluated round's metrics go besides metrics.jsonl, while the run goes on.

`loggers = ["tensorboard", "wandb"]` in a config (`dfl run --log tensorboard`) picks them from `LOGGERS`, the
one registry shape of `dfl.registry` (entry-point group `dfl.loggers`: an installed package adds its own). A
logger is a class built with no arguments, whose constructor checks that its package is installed (else a
`ConfigError` with the pip command, at set-up, before any training), with three methods:

    start(info)               once, before the first round of this session (`RunInfo`: the config,
                              the algorithm's hyperparameters, the run directory, the rounds and metrics so far)
    log(round, metrics)       after every evaluated round is written to metrics.jsonl (the record as written)
    finish(status, summary)   once, however the run ends (status "completed", "stopped", "diverged", ...)

They run on the main process only (rank 0 under torchrun). `needs_out_dir = True` marks a logger that writes
into the run directory: asking for it without one (`dfl.run` without `out=`) is a ConfigError.
"""

from __future__ import annotations

from pathlib import Path

from dfl.config import Config
from dfl.errors import ConfigError
from dfl.loggers.base import Logger, RunInfo, numeric, require
from dfl.loggers.tensorboard import TensorBoardLogger
from dfl.loggers.wandb import WandbLogger
from dfl.registry import Registry

LOGGERS: Registry[type[Logger]] = Registry("logger", group="dfl.loggers")
"""Every logger the config field `loggers` lists: name -> `Logger` subclass, built with no arguments.

tensorboard and wandb are built in; `register` (a decorator) adds a class, installed packages theirs by entry point
(group `dfl.loggers`)."""
register = LOGGERS.register  # @dfl.loggers.register("name") class MyLogger(Logger): ...


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
                              "out= to dfl.run (dfl run always has one: --out, default a new runs/<name>-<time>)")
        loggers.append(cls())
    return loggers


LOGGERS.register("tensorboard", TensorBoardLogger)
LOGGERS.register("wandb", WandbLogger)

__all__ = ["LOGGERS", "Logger", "RunInfo", "TensorBoardLogger", "WandbLogger", "build", "check_config", "numeric",
           "register", "require"]


def check_config(config: Config) -> None:
    """The loggers' part of `dfl.validate`.

    Every name in `loggers` is registered (whether its package is installed is checked when the run builds it).
    """
    for name in config.loggers:
        LOGGERS.require(name, "loggers")
