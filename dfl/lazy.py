"""Submodules and names that load on first use, so `import dfl` stays light and `dfl.network.gossip` still resolves."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def submodules(package: str, names: dict[str, str] | None = None) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` (PEP 562).

    `package.name` imports the submodule `package.name` on first use, or, for a key of `names` (name -> the module that
    defines it), that module's attribute of the name, so a package can re-export what its torch-heavy modules define
    without importing them at once; any other missing name is an AttributeError, as usual.
    """

    def __getattr__(name: str) -> Any:
        if names is not None and name in names:
            value = getattr(importlib.import_module(names[name]), name)
            setattr(sys.modules[package], name, value)  # found directly from now on
            return value
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":  # the submodule exists but something it imports does not
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__
