"""dfl: a decentralized gossip simulator for decentralized federated learning."""

__version__ = "0.1.0"

from dfl.config import Config, ConfigError  # noqa: E402

__all__ = ["Config", "ConfigError", "DivergenceError", "Result", "run"]
_ENGINE = ("DivergenceError", "Result", "run")  # from dfl.runner, which imports torch: loaded on first use
_SUBPACKAGES = ("algorithms",)  # `dfl.algorithms.register(...)` after a plain `import dfl` (imports torch)


def __getattr__(name: str):
    # `import dfl` (and so the `dfl` CLI's argument parsing) stays light; `dfl.run` imports the engine
    if name in _ENGINE:
        from dfl import runner

        return getattr(runner, name)
    if name in _SUBPACKAGES:
        import importlib

        return importlib.import_module(f"dfl.{name}")
    raise AttributeError(f"module 'dfl' has no attribute {name!r}")
