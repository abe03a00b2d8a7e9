"""Your own model: a factory named "package.module:factory", or a module or factory passed from Python.

The Config field `model` is a spec, one of
- a registered name (`dfl.models.MODELS`: the built-ins, `@dfl.models.register` factories, entry points);
- "package.module:factory": `factory` (a function or class; a dotted path for a nested attribute) imported from
  `package.module` with the working directory on `sys.path` (as `python -m` has it), so a `mymodels.py` next to
  where `dfl run` is started is found. Runs, sweeps, checkpoints, resume and reports use it like a name;
- "package.module.Name (instance)" or "package.module.name (factory)": what `dfl.run(config, model=obj)` records
  for an `nn.Module` instance, or for a factory that cannot be imported back by name (a lambda, a closure, one
  defined in `__main__`). Such a config runs only with the object passed again, `dfl.run(config, model=obj)`
  (also to resume); a config file, `dfl run --resume` or a sweep cannot rebuild it and say so.

A factory is called as `factory(input_shape, num_classes, **model_options)` and returns an `nn.Module`; its
keyword-only parameters are its options, as for the built-ins.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from dfl.errors import ModelError
from dfl.registry import suggest

IMPORT_SPEC = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
OBJECT_SPEC = re.compile(r"\S+ \((instance|factory)\)")
SIGNATURE = "f(input_shape, num_classes, *, option=default, ...) -> nn.Module"


def is_module(obj: Any) -> bool:
    """Whether `obj` is an `nn.Module` instance, without importing torch.

    With no torch loaded none can exist, so checking a model spec does not wait for torch.
    """
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def is_import_spec(spec: Any) -> bool:
    """Whether `spec` spells an importable factory, "package.module:factory"."""
    return isinstance(spec, str) and IMPORT_SPEC.fullmatch(spec) is not None


def is_object_spec(spec: Any) -> bool:
    """Whether `spec` spells a recorded Python object, "module.Name (instance)" or "(factory)"."""
    return isinstance(spec, str) and OBJECT_SPEC.fullmatch(spec) is not None


def check_spec(spec: Any, names: Iterable[str]) -> None:
    """Refuse a model spec that is no registered name, importable factory or recorded object.

    Raise ValueError unless `spec` is a registered name, an importable "module:factory" (imported here, so
    a typo fails before any data is loaded) or a recorded Python object.
    """
    names = tuple(names)
    if not isinstance(spec, str):
        raise ModelError(f"model must be a name or a \"package.module:factory\" string; got a {type(spec).__name__} "
                         "(pass an nn.Module or a factory as dfl.run(config, model=...))")
    if spec in names or is_object_spec(spec):
        return
    if is_import_spec(spec):
        check_signature(factory_of(spec, names), repr(spec))
        return
    close = suggest(spec, names)
    hint = f" (did you mean {close!r}?)" if close else ""
    raise ModelError(f"model must be one of {', '.join(names)}, or \"package.module:factory\" for your own "
                     f"(importable from the working directory); got {spec!r}{hint}")


def factory_of(spec: str, names: Iterable[str] = ()) -> Callable:
    """The factory a non-registered spec names: imported for "module:factory"; an error otherwise."""
    if is_object_spec(spec):
        raise ModelError(
            f"model {spec!r} is a Python object that was passed to dfl.run(config, model=...); a config cannot "
            "rebuild it: pass the same object again (dfl.run(config, model=..., out=..., resume=True) to resume), or "
            "name an importable factory, model = \"package.module:factory\""
        )
    if not is_import_spec(spec):
        check_spec(spec, names)  # raises: not a name, not a spec
    module_name, attr = spec.split(":")
    _cwd_on_path()
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or anything the module raises while it is imported
        raise ModelError(f"model {spec!r}: cannot import module {module_name!r} (from the working directory "
                         f"{os.getcwd()} or sys.path): {type(exc).__name__}: {_first_line(exc)}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ModelError(f"model {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if is_module(obj):
        raise ModelError(f"model {spec!r} is an nn.Module instance; name a factory {SIGNATURE} (a function or an "
                         "nn.Module class), which dfl calls after seeding, so that runs are reproducible")
    if not callable(obj):
        raise ModelError(f"model {spec!r} is a {type(obj).__name__}, not a factory {SIGNATURE}")
    return obj


def check_signature(factory: Callable, label: str, options: dict | None = None) -> None:
    """Raise ModelError unless factory(input_shape, num_classes, **options) binds.

    With options None only the two positional arguments are checked (required keyword-only options may come from
    model_options).
    """
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # no signature to read (a builtin): the call will tell
    kwargs = dict(options or {})
    if options is None:
        kwargs = {p.name: None for p in signature.parameters.values()
                  if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty}
    try:
        signature.bind((1,), 2, **kwargs)
    except TypeError as exc:
        name = getattr(factory, "__qualname__", type(factory).__name__)
        raise ModelError(f"model {label} must be a factory {SIGNATURE}; {name}{signature} cannot be called so "
                         f"({exc})") from exc


def spec_of(obj: Any) -> str:
    """The spec `dfl.run(config, model=obj)` records.

    "module:factory" when that imports back to obj (then configs, sweeps and resume rebuild it), else "module.Name
    (instance)" / "module.name (factory)".
    """
    if isinstance(obj, str):
        return obj
    if is_module(obj):
        cls = type(obj)
        return f"{cls.__module__}.{cls.__qualname__} (instance)"
    if not callable(obj):
        raise ModelError(f"model= must be an nn.Module, a factory {SIGNATURE} or a spec string; "
                         f"got {type(obj).__name__}")
    module = getattr(obj, "__module__", None) or "?"
    qualname = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    spec = f"{module}:{qualname}"
    if module != "__main__" and is_import_spec(spec):
        found: Any = sys.modules.get(module)
        for part in qualname.split("."):
            found = getattr(found, part, None)
        if found is obj:
            return spec
    return f"{module}.{qualname} (factory)"


def _cwd_on_path() -> None:
    """Put the working directory first on sys.path (as `python -m` does; the `dfl` script starts without it)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a module file written after the first import attempt is found too


def _first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
