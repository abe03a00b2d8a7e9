"""Table layout: the fields of rows and columns, the order of their values and their labels.

Which fields are rows and which are columns, the order of their values (numbers numerically, topologies, algorithms and
partitions in registry order) and their labels.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dfl.errors import ReportError
from dfl.report.settings import SETTING_FIELDS, Setting, canonical, varying_fields


def format_value(value: Any) -> str:
    """A setting's value as a table label writes it: None as "default", floats by `:g`, tables and lists spelled out."""
    if value is None:
        return "default"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={format_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def label(values: dict[str, Any], names: list[str]) -> str:
    """`value` for one field, `f1=v1, f2=v2` for several, "all" for none."""
    if not names:
        return "all"
    if len(names) == 1:
        return format_value(values[names[0]])
    return ", ".join(f"{n}={format_value(values[n])}" for n in names)


def registry_order(name: str) -> tuple[str, ...]:
    """The canonical order of a categorical field's values; empty for other fields.

    Sparse to dense topologies, decentralized algorithms first, as in the papers' tables.
    """
    if name == "topology":
        from topologies import NAMES

        return NAMES
    if name == "algorithm":
        from dfl.algorithms import ALGORITHMS

        return tuple(ALGORITHMS.names())
    if name == "partition":
        from dfl.data import PARTITIONS

        return tuple(PARTITIONS)
    return ()


def value_sort_key(values: list[Any], name: str = "") -> Callable[[Any], Any]:
    """The sort key of a field's values: numbers in numeric order (None last).

    Topologies, algorithms and partitions in their registry order; anything else in order of first appearance.
    """
    numeric = all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)
    if numeric:
        return lambda v: (v is None, v if v is not None else 0)
    registry = {v: i for i, v in enumerate(registry_order(name))}
    first: dict[str, int] = {}
    for v in values:
        first.setdefault(canonical(v), len(first))
    return lambda v: (registry.get(v, len(registry)) if isinstance(v, str) else len(registry), first[canonical(v)])


def value_order(settings: list[Setting], names: list[str]) -> list[tuple[str, ...]]:
    """The distinct value combinations of `names`, each field sorted by `value_sort_key`, first field slowest."""
    keys = [tuple(canonical(s.values[n]) for n in names) for s in settings]
    sorters = [value_sort_key([s.values[n] for s in settings], n) for n in names]
    by_key = {k: s for k, s in zip(keys, settings)}
    return sorted(by_key, key=lambda k: tuple(f(by_key[k].values[n]) for f, n in zip(sorters, names)))


@dataclass
class Layout:
    """The table layout.

    The `rows` and `cols` fields, their value combinations in order (`row_keys`, `col_keys`, each a tuple of `canonical`
    values) and the setting of each (row, column) cell.
    """
    rows: list[str]
    cols: list[str]
    row_keys: list[tuple[str, ...]]
    col_keys: list[tuple[str, ...]]
    cells: dict[tuple[tuple[str, ...], tuple[str, ...]], Setting]

    def row_label(self, key: tuple[str, ...]) -> str:
        """The label of the row with the values `key`."""
        return label(dict(zip(self.rows, (json.loads(k) for k in key))), self.rows)

    def col_label(self, key: tuple[str, ...]) -> str:
        """The label of the column with the values `key`."""
        return label(dict(zip(self.cols, (json.loads(k) for k in key))), self.cols)

    @property
    def corner(self) -> str:
        r"""The top-left cell of a table: `rows \ cols`."""
        return f"{', '.join(self.rows) or 'all'} \\ {', '.join(self.cols) or 'all'}"


def field_list(text: str | list[str] | None, option: str) -> list[str] | None:
    """The fields of `--rows` or `--cols` (a comma-separated string or a list); None when not given.

    Raises:
        ReportError: naming `--option`, for an empty list or a field that is not a setting field.
    """
    if text is None:
        return None
    names = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    bad = [n for n in names if n not in SETTING_FIELDS]
    if bad or not names:
        raise ReportError(f"--{option}: unknown or non-setting field(s) {', '.join(bad) or repr(text)}; allowed: "
                          f"{', '.join(SETTING_FIELDS)}")
    return names


def make_layout(settings: list[Setting], rows: str | list[str] | None = None,
                cols: str | list[str] | None = None) -> Layout:
    """Rows = `rows` (default algorithm).

    Columns = `cols` (default every other varied field). Varied fields named by neither are folded into the row label
    when `cols` is given, else into the column label.
    """
    row_names = field_list(rows, "rows") or ["algorithm"]
    col_names = field_list(cols, "cols")
    both = sorted(set(row_names) & set(col_names or []))
    if both:
        raise ReportError(f"--rows and --cols share field(s) {', '.join(both)}; a field is either rows or columns")
    varying = varying_fields(settings)
    if col_names is None:
        col_names = [f for f in varying if f not in row_names]
        if not col_names and "topology" not in row_names:
            col_names = ["topology"]  # nothing else varies: name the topology in the header
    else:
        row_names += [f for f in varying if f not in row_names and f not in col_names]
    row_keys, col_keys = value_order(settings, row_names), value_order(settings, col_names)
    cells = {}
    for s in settings:
        cells[(tuple(canonical(s.values[n]) for n in row_names), tuple(canonical(s.values[n]) for n in col_names))] = s
    return Layout(row_names, col_names, row_keys, col_keys, cells)
