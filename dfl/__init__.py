"""dfl: a decentralized gossip simulator for decentralized federated learning.

`import dfl` is light (no torch): `Config` and the errors load at once; `dfl.run`, `dfl.validate`, `Result`
and every subpackage (`dfl.data`, `dfl.models`, `dfl.algorithms`, `dfl.topologies`, `dfl.loggers`,
`dfl.report`, ...) load on first use.
"""

from __future__ import annotations

import importlib

from dfl.config import Config
from dfl.errors import ConfigError, DivergenceError

__version__ = "0.1.0"

__all__ = ["Config", "ConfigError", "DivergenceError", "Result", "run", "validate"]

# name -> the module that defines it; imported on first use (they import torch)
_LAZY = {"run": "dfl.engine.runner", "Result": "dfl.engine.results", "validate": "dfl.engine.validation"}
SUBPACKAGES = ("algorithms", "cli", "config", "data", "engine", "errors", "loggers", "models", "network", "registry",
               "report", "signatures", "topologies", "training", "workflows")


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in SUBPACKAGES:
        return importlib.import_module(f"dfl.{name}")
    raise AttributeError(f"module 'dfl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *SUBPACKAGES})
