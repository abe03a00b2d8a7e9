"""`dfl list [CATEGORY]`: the registered choices of a category, with their options.

Every algorithm, topology, model, dataset, partition, weight scheme, logger, attack, aggregator and compressor, with a
one-line description and its options with their defaults (and, where its card declares them, each option's
type, allowed values and help: `dfl.specs`), read from the registries by `dfl.workflows.catalog` when the command
runs, so argument errors stay fast.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import textwrap
from typing import Any

from dfl import signatures
from dfl.workflows.catalog import CATEGORIES  # the catalog imports a registry only when it lists one

WIDTH = 120  # options lines wrap here (descriptions are one line each)
REQUIRED = signatures.REQUIRED  # the default shown for an option that has none


def add_parser(subparsers) -> None:
    """Add the `list` subcommand to the `dfl` parser."""
    p = subparsers.add_parser(
        "list",
        help="every algorithm, topology, model, dataset, partition, weight scheme, logger, attack, aggregator and "
             "compressor, with options",
        description="List the choices of one category (or, without CATEGORY, the names and one-line descriptions "
        f"of every category): {', '.join(CATEGORIES)}. With a category, each choice's options are shown with "
        "their defaults (algorithms: hyperparameters).",
    )
    p.add_argument("category", nargs="?", metavar="CATEGORY", help=f"one of {', '.join(CATEGORIES)} (default: all)")
    p.add_argument("--json", action="store_true", help="print JSON (category -> list of entries) for tools")
    p.set_defaults(handler=main)

# ------------------------------------------------------------------------------------------------ registries
DECLARED_OPTIONS = ("options", "hyperparameters")  # attributes holding an object's declared option defaults

EXTRA_COLUMN = {"algorithms": "centralized", "topologies": "kind", "datasets": "source", "attacks": "scale",
                "aggregators": "where"}


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
    if entry.get("note"):
        text += f" ({entry['note']})"
    return "options: " + text


def _spec_lines(entry: dict) -> list[str]:
    """One line per option of an entry whose card declares specs: name=default, its type and allowed values, help."""
    lines = []
    for key, value in entry["options"].items():
        spec = entry["specs"].get(key, {})
        kind = ", ".join(part for part in (spec.get("type", ""), spec.get("allowed", "")) if part)
        lines.append(f"{key}={_value(value)}" + (f" ({kind})" if kind else "") +
                     (f": {spec['help']}" if spec.get("help") else ""))
    if entry.get("note"):
        lines.append(f"({entry['note']})")
    return lines


def _extra(category: str, entry: dict) -> str | None:
    column = EXTRA_COLUMN.get(category)
    if column is None:
        return None
    value = entry[column]
    if column == "centralized":
        return "centralized" if value else "decentralized"
    return str(value)


def _one_line(text: str, limit: int) -> str:
    """Text cut to `limit` characters for the text listing (JSON keeps it whole).

    At the last top-level ', ', '; ' or '. ' (outside brackets) when that keeps most of it, else at a word boundary.
    """
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
    """The lines that list `entries` of `category`.

    Name, the category's extra column and description, then each option's line with `with_options`.
    """
    width = max(len(e["name"]) for e in entries) + 2
    extras = [_extra(category, e) for e in entries]
    extra_width = max((len(x) for x in extras if x is not None), default=-2) + 2
    indent = " " * (2 + width + extra_width)
    lines = [f"{category} ({len(entries)})"]
    for entry, extra in zip(entries, extras):
        extra_text = f"{extra:<{extra_width}}" if extra is not None else ""
        description = _one_line(entry["description"] or "-", max(60, WIDTH - len(indent)))
        lines.append(f"  {entry['name']:<{width}}{extra_text}{description}".rstrip())
        if with_options and entry.get("specs") and entry.get("options"):
            lines.append(f"{indent}options:")
            for line in _spec_lines(entry):
                lines += textwrap.wrap(line, WIDTH, initial_indent=indent + "  ", subsequent_indent=indent + "      ",
                                       break_on_hyphens=False)
        elif with_options:
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
    """`dfl list [CATEGORY]`.

    Print the choices of a category (a unique prefix will do), or of every category; the exit status.
    """
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
    from dfl.workflows import catalog

    listings = {name: catalog.entries(name) for name in chosen}
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
