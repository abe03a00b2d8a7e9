"""dfl: a decentralized gossip simulator for decentralized federated learning."""

__version__ = "0.1.0"

from dfl.config import Config, ConfigError  # noqa: E402
from dfl.runner import DivergenceError, Result, run  # noqa: E402

__all__ = ["Config", "ConfigError", "DivergenceError", "Result", "run"]
