"""Submodules that load on first use, so `import dfl` stays light and `dfl.network.gossip` still resolves."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def submodules(package: str) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: `package.name` imports the submodule `package.name` on first use
    (PEP 562); any other missing name is an AttributeError, as usual."""

    def __getattr__(name: str) -> Any:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":  # the submodule exists but something it imports does not
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__
