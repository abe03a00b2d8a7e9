"""`dfl list [CATEGORY]`: every algorithm, topology, model, dataset, partition and weight scheme, with a one-line
description and its options with their defaults.

Everything is read from the registries when the command runs (`add_parser` imports none of them, so argument
errors stay fast): ALGORITHMS and each class's `hyperparameters`, topologies' NAMES and builders, MODELS and
`model_options`, DATASETS and `dataset_options`, PARTITIONS and `partition_options`, and the weight SCHEMES.
Descriptions are the first line of the matching docstring (the class, builder or loader, else its module)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable
from typing import Any

CATEGORIES = ("algorithms", "topologies", "models", "datasets", "partitions", "weights")
WIDTH = 120  # options lines wrap here (descriptions are one line each)
REQUIRED = "required"  # the default shown for an option that has none


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "list",
        help="every algorithm, topology, model, dataset, partition and weight scheme, with options and defaults",
        description="List the choices of one category (or, without CATEGORY, the names and one-line descriptions "
        f"of every category): {', '.join(CATEGORIES)}. With a category, each choice's options are shown with "
        "their defaults (algorithms: hyperparameters).",
    )
    p.add_argument("category", nargs="?", metavar="CATEGORY", help=f"one of {', '.join(CATEGORIES)} (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON (category -> list of entries) for tools")
    p.set_defaults(handler=main)


# ------------------------------------------------------------------------------------------------ docstrings
def _paragraph(doc: str | None) -> str:
    """The first paragraph of a docstring as one line ("" for none)."""
    if not doc:
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n", 1)[0].split())


def _own_doc(obj: Any) -> str:
    """obj's own docstring (a class's, not one inherited from a base class)."""
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return _paragraph(doc)


def _module_doc(obj: Any) -> str:
    module = sys.modules.get(getattr(obj, "__module__", ""), None)
    return _paragraph(getattr(module, "__doc__", None))


def _bullet(module_doc: str | None, key: str) -> str:
    """The text of the bullet `- key: text` or `- `key` (...): text` in a module docstring (continuation lines
    joined), up to its first ';' when it runs long."""
    if not module_doc:
        return ""
    lines = inspect.cleandoc(module_doc).splitlines()
    head = rf"^- (?:`{re.escape(key)}`|{re.escape(key)}(?![\w-]))"
    starts = [i for i, line in enumerate(lines) if re.match(head, line)]
    if len(starts) != 1:  # none, or one per variant (`CNN`, variant "mcmahan" ...): no single description
        return ""
    for i in starts:
        m = re.match(head + r"[^:]*:\s*(.*)$", lines[i])
        if not m:
            return ""
        text = [m.group(1)]
        for more in lines[i + 1:]:
            if not more.startswith(" ") or not more.strip():
                break
            text.append(more.strip())
        joined = " ".join(text).rstrip(";,")
        return joined.split("; ")[0] if len(joined) > 100 else joined
    return ""


def _default(value: Any) -> Any:
    return REQUIRED if value is inspect.Parameter.empty else value


def _signature_options(fn: Callable, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Keyword options of fn with their defaults: `names` (in that order) or every keyword-only parameter."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict.fromkeys(names or (), REQUIRED)
    if names is None:
        return {k: _default(p.default) for k, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return {k: _default(params[k].default) if k in params else REQUIRED for k in names}


# ------------------------------------------------------------------------------------------------ categories
def _algorithms() -> list[dict]:
    registry = importlib.import_module("dfl.algorithms")

    centralized = getattr(registry, "CENTRALIZED", ())
    entries = []
    for name in registry.ALGORITHMS:
        cls = registry.algorithm_class(name)
        entries.append({
            "name": name,
            "description": _own_doc(cls) or _module_doc(cls),
            "centralized": bool(getattr(cls, "centralized", cls in centralized)),
            "options": dict(getattr(cls, "hyperparameters", {}) or {}),
        })
    return entries


def _topologies() -> list[dict]:
    registry = importlib.import_module("topologies.build")

    entries = []
    for name in registry.NAMES:
        source = registry.STATIC.get(name) or registry.TIME_VARYING.get(name)
        if source is not None:
            fn, option_names = source
            description = _own_doc(fn)
            target = fn.__init__ if isinstance(fn, type) else fn
            options = _signature_options(target, tuple(option_names))
            kind = "time-varying" if name in registry.TIME_VARYING else "static"
        else:  # `custom`: described in build()'s docstring; exactly one of its sources is given
            sentences = re.split(r"(?<=\.)\s+", _paragraph((registry.build.__doc__ or "").replace("\n\n", " ")))
            description = next((s for s in sentences if s.startswith(f"`{name}`")), "")
            options = dict.fromkeys(getattr(registry, "CUSTOM_SOURCES", ()), None)
            kind = "custom"
        entries.append({"name": name, "description": description, "kind": kind, "options": options})
    return entries


def _model_target(builder: Callable, name: str) -> Any:
    """The class or function a model builder constructs (read from the names its code uses)."""
    code = getattr(builder, "__code__", None)
    if code is None:
        return None
    found = [builder.__globals__.get(n) for n in code.co_names]
    found = [o for o in found if callable(o) and getattr(o, "__module__", "").startswith("dfl.models.")
             and getattr(o, "__module__", "") not in ("dfl.models.layers", "dfl.models.shapes")]
    named = [o for o in found if o.__name__.lower() == name.lower()]
    return (named or found or [None])[0]


def _models() -> list[dict]:
    registry = importlib.import_module("dfl.models.registry")

    entries = []
    for name, builder in registry.MODELS.items():  # built-ins, then registered and installed (entry point) models
        target = _model_target(builder, name)
        description = _own_doc(builder)
        if target is not None and not description:
            module = sys.modules.get(target.__module__)
            description = (_own_doc(target) or _bullet(getattr(module, "__doc__", None), target.__name__)
                           or _module_doc(target))
        options = {k: _default(v) for k, v in registry.model_options(name).items()}
        entries.append({"name": name, "description": description or f"from {registry.MODELS.source(name)}",
                        "options": options})
    return entries


def _datasets() -> list[dict]:
    registry = importlib.import_module("dfl.data.dataset")

    entries = []
    for name in registry.DATASETS:
        loader = registry._loader(name)
        entries.append({
            "name": name,
            "description": _own_doc(loader) or _module_doc(loader),
            "source": "embedded" if name in registry.EMBEDDED else "local files (data_root)",
            "options": registry.dataset_options(name),
        })
    return entries


def _partition_descriptions(module_doc: str | None, names: tuple[str, ...], options: dict) -> dict[str, str]:
    """Descriptions from the partitioners' module docstring table: `name  options  description` rows."""
    lines = inspect.cleandoc(module_doc or "").splitlines()
    found = {}
    for i, line in enumerate(lines):
        head = line.strip().split(" ", 1)
        if head[0] not in names or head[0] in found or len(head) < 2:
            continue
        chunks = re.split(r"\s{3,}", head[1].strip())
        if len(chunks) > 1 or not options[head[0]]:
            text = chunks[-1]
        else:  # `name  a=1, b=2 description` with one space before the description: drop the options
            text = re.sub(r"^(\w+=[^,\s]+,?\s*)+", "", chunks[0])
        if not text and i + 1 < len(lines):
            text = lines[i + 1].strip()
        found[head[0]] = text
    return found


def _partitions() -> list[dict]:
    registry = importlib.import_module("dfl.data.partitioners")

    options = {name: registry.partition_options(name) for name in registry.PARTITIONS}
    described = _partition_descriptions(registry.__doc__, registry.PARTITIONS, options)
    return [{"name": name, "description": described.get(name, ""), "options": options[name]}
            for name in registry.PARTITIONS]


def _weights() -> list[dict]:
    registry = importlib.import_module("topologies.weights")

    entries = []
    for name in registry.SCHEMES:
        fn = getattr(registry, name.replace("-", "_"), None)
        description = _bullet(registry.__doc__, name) or (_own_doc(fn) if fn is not None else "")
        options = {"base": "metropolis"} if name == "lazy" else {}
        entry = {"name": name, "description": description, "options": options}
        if name == "lazy" and hasattr(registry, "LAZY_BASES"):
            entry["choices"] = {"base": list(registry.LAZY_BASES)}
        entries.append(entry)
    return entries


LISTERS: dict[str, Callable[[], list[dict]]] = {
    "algorithms": _algorithms, "topologies": _topologies, "models": _models,
    "datasets": _datasets, "partitions": _partitions, "weights": _weights,
}
EXTRA_COLUMN = {"algorithms": "centralized", "topologies": "kind", "datasets": "source"}


# ------------------------------------------------------------------------------------------------ rendering
def _value(value: Any) -> str:
    if isinstance(value, str):
        return value if value == REQUIRED else repr(value)
    return repr(value)


def _options_line(entry: dict) -> str:
    options = entry.get("options") or {}
    if not options:
        return "options: none"
    text = ", ".join(f"{k}={_value(v)}" for k, v in options.items())
    for key, choices in (entry.get("choices") or {}).items():
        text += f" ({key}: {' | '.join(choices)})"
    return "options: " + text


def _extra(category: str, entry: dict) -> str | None:
    column = EXTRA_COLUMN.get(category)
    if column is None:
        return None
    value = entry[column]
    if column == "centralized":
        return "centralized" if value else "decentralized"
    return str(value)


def _one_line(text: str, limit: int) -> str:
    """text cut to `limit` characters for the text listing (JSON keeps it whole): at the last top-level ', ',
    '; ' or '. ' (outside brackets) when that keeps most of it, else at a word boundary."""
    if len(text) <= limit:
        return text
    depth, cuts = 0, []
    for i, ch in enumerate(text[:limit]):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if depth == 0 and text[i:i + 2] in (", ", "; ", ". "):
            cuts.append(i)
    if cuts and cuts[-1] >= 0.6 * limit:
        return text[:cuts[-1]] + " …"
    return text[:limit - 2].rsplit(" ", 1)[0] + " …"


def render(category: str, entries: list[dict], with_options: bool) -> list[str]:
    width = max(len(e["name"]) for e in entries) + 2
    extras = [_extra(category, e) for e in entries]
    extra_width = max((len(x) for x in extras if x is not None), default=-2) + 2
    indent = " " * (2 + width + extra_width)
    lines = [f"{category} ({len(entries)})"]
    for entry, extra in zip(entries, extras):
        extra_text = f"{extra:<{extra_width}}" if extra is not None else ""
        description = _one_line(entry["description"] or "-", max(60, WIDTH - len(indent)))
        lines.append(f"  {entry['name']:<{width}}{extra_text}{description}".rstrip())
        if with_options:
            lines += textwrap.wrap(_options_line(entry), WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                                   break_on_hyphens=False)
    return lines


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def main(args: argparse.Namespace) -> int:
    category = args.category
    if category is not None and category not in CATEGORIES:  # a unique prefix ("algo", "weight") will do
        prefixed = [c for c in CATEGORIES if c.startswith(category.lower())] if category else []
        category = prefixed[0] if len(prefixed) == 1 else category
    if category is not None and category not in CATEGORIES:
        close = difflib.get_close_matches(category, CATEGORIES, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        print(f"dfl list: error: unknown category {category!r}{hint}; choose one of: {', '.join(CATEGORIES)}",
              file=sys.stderr)
        return 2
    chosen = (category,) if category else CATEGORIES
    listings = {name: LISTERS[name]() for name in chosen}
    if args.json:
        text = json.dumps(_jsonable(listings), indent=2, ensure_ascii=False)
    else:
        blocks = [render(name, entries, with_options=category is not None) for name, entries in listings.items()]
        text = "\n\n".join("\n".join(block) for block in blocks)
        if category is None:
            text += f"\n\n`dfl list CATEGORY` adds each choice's options with defaults ({', '.join(CATEGORIES)})"
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `dfl list | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (so the interpreter's final flush stays quiet)
    return 0

