"""dfl: a decentralized gossip simulator for decentralized federated learning.

`import dfl` is light (no torch): `Config` and the errors load at once; `dfl.run`, `dfl.validate`, `Result`
and every subpackage (`dfl.data`, `dfl.models`, `dfl.algorithms`, `dfl.graphs`, `dfl.loggers`,
`dfl.report`, ...) load on first use. Importing dfl before torch bounds how long torch's OpenMP threads spin
at a barrier (`dfl.threads.prepare_environment`: GOMP_SPINCOUNT, unless set), so runs stay fast on a busy machine.

Examples:
    One round of the default algorithm (DFedSAM-MGS on a ring) with 4 clients, on the embedded digits data and a
    logistic regression (about a second once torch is loaded):

    >>> import dfl
    >>> config = dfl.validate(dfl.Config(rounds=1, clients=4, dataset="digits", model="logreg", progress=False))
    >>> result = dfl.run(config)
    >>> result.summary["status"], len(result.history), tuple(result.params.shape)
    ('completed', 1, (4, 650))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from dfl import threads as _threads
from dfl.config import Config
from dfl.errors import ConfigError, DivergenceError

_threads.prepare_environment()  # before anything loads torch (its OpenMP runtime reads the environment once)

if TYPE_CHECKING:  # what __getattr__ loads on first use, spelled out for type checkers and the API reference
    from dfl.engine.results import Result
    from dfl.engine.runner import run
    from dfl.engine.validation import validate

from dfl.version import __version__ as __version__  # noqa: E402  (dfl/version.py: the one place it is written)

__all__ = ["Config", "ConfigError", "DivergenceError", "Result", "run", "validate"]

# name -> the module that defines it; imported on first use (they import torch)
_LAZY = {"run": "dfl.engine.runner", "Result": "dfl.engine.results", "validate": "dfl.engine.validation"}
SUBPACKAGES = ("algorithms", "cli", "config", "data", "engine", "errors", "loggers", "models", "network", "registry",
               "report", "signatures", "threads", "graphs", "training", "workflows")


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in SUBPACKAGES:
        return importlib.import_module(f"dfl.{name}")
    raise AttributeError(f"module 'dfl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *SUBPACKAGES})
