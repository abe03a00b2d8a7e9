"""The one syntax of every flag that takes a list: items separated by spaces, commas or both.

`--topologies ring grid`, `--topologies ring,grid` and `--topologies ring, grid` are the same list, under every
command (`dfl topology compare`, `dfl compare-topologies`, `dfl spectral-study`, `dfl report --rows`, `dfl run
--lr-milestones`, ...): `add_list` declares such a flag, and its help says so (`SYNTAX`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

SYNTAX = "space- or comma-separated"


class SeparatedList(argparse.Action):
    """Store the flag's values as one list: each value split at commas, every item converted by `item`."""

    def __init__(self, option_strings: list[str], dest: str, item: Callable[[str], Any] = str,
                 what: str = "names", **kwargs: Any) -> None:
        self.item, self.what = item, what
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        """Split each value at commas, convert each item, and store the list (an argparse error names a bad one)."""
        pieces = [piece.strip() for value in values for piece in str(value).split(",")]
        items = []
        for piece in (p for p in pieces if p):
            try:
                items.append(self.item(piece))
            except ValueError:
                parser.error(f"argument {option_string}: expected {self.what} ({SYNTAX}), got {piece!r}")
        if not items and self.nargs == "+":
            parser.error(f"argument {option_string}: expected at least one of {self.what} ({SYNTAX})")
        setattr(namespace, self.dest, items)


def add_list(parser: Any, flag: str, *, item: Callable[[str], Any] = str, what: str = "names", help: str = "",
             empty: bool = False, **kwargs: Any) -> argparse.Action:
    """Add `flag` taking a list (`SeparatedList`; `empty`: no items is the empty list), its help saying SYNTAX."""
    said = f"{help[:-1]}; {SYNTAX})" if help.endswith(")") else f"{help} ({SYNTAX})" if help else SYNTAX
    return parser.add_argument(flag, nargs="*" if empty else "+", action=SeparatedList, item=item, what=what,
                               help=said, **kwargs)
