"""The command line shared by the docs generators (docs/gen_*.py): write their pages, or with `--check` say which
are stale.

    python docs/gen_X.py          # rewrite the pages (commit them)
    python docs/gen_X.py --check  # exit 1, with one line on stderr, if a page is not what the generator makes now

A generator imports this in its `main` (docs/ is on `sys.path` when the script runs, not when a test loads the
generator's module by its path) and passes the function that makes its pages, so `--help` makes nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def write_or_check(make: Callable[[], Mapping[Path, str]], stale: str, doc: str,
                   argv: Sequence[str] | None = None) -> int:
    """Write each page `make()` returns, or with `--check` compare them and return 1 if any differs or is missing.

    Args:
        make: returns {path: text} for every page the generator writes.
        stale: the line printed on stderr when a page is stale; `{pages}` stands for the stale paths, comma-separated.
        doc: the generator's docstring, its `--help`.
        argv: the arguments (default: the command line's).

    Returns:
        The exit status: 0, or 1 when `--check` found a stale page.
    """
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if a page differs from what it would be")
    args = p.parse_args(argv)
    pages = make()
    if args.check:
        differ = [str(path) for path, text in pages.items() if not path.is_file() or path.read_text() != text]
        if differ:
            print(stale.format(pages=", ".join(differ)), file=sys.stderr)
            return 1
        return 0
    for path, text in pages.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0
