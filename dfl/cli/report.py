"""`dfl report PATH`: tables (Markdown, CSV) and plots of a run or of every run under a directory."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from dfl.cli.lists import add_list


def add_parser(subparsers) -> None:
    """Add the `report` subcommand to the `dfl` parser."""
    p = subparsers.add_parser(
        "report",
        help="tables and plots of a run directory or of all runs under a directory (e.g. a sweep)",
        description="Group the runs under PATH by setting (config without seed), aggregate over seeds (mean ± "
        "std) and write report.md, settings.csv, runs.csv and plots/*.png into PATH/report/ (or --out). Rows are "
        "algorithms and columns the other varied fields unless --rows/--cols say otherwise.",
    )
    p.add_argument("path", help="a run directory, or a directory holding run directories (searched recursively)")
    p.add_argument("--out", help="output directory (default PATH/report)")
    add_list(p, "--rows", metavar="FIELD", help="Config field(s) for the table rows (default algorithm)")
    add_list(p, "--cols", metavar="FIELD", help="Config field(s) for the columns (default: every other varied field)")
    p.add_argument("--target", type=float, metavar="ACC",
                   help="target test accuracy in (0, 1] for rounds-to-target (default 0.9 × the lowest mean "
                   "final accuracy)")
    p.add_argument("--spectral", action="store_true",
                   help="also write the spectral-gap table and plots (λ, 1 − λ^Q, Φ, effective neighbours)")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    """`dfl report PATH`.

    Write the report (and with --spectral the spectral study) and print its tables; the exit status.
    """
    from dfl.directories import check_output_directory
    from dfl.errors import FileReadError, OutputPathError, ReportError

    try:  # --out first, before torch and matplotlib load: a folder dfl did not make is refused at once
        if args.out is not None:
            check_output_directory(args.out, "report")
    except OutputPathError as exc:
        print(f"dfl report: error: {exc}", file=sys.stderr)
        return 2
    from dfl.report import check_target, write_report, write_spectral_report  # torch, matplotlib

    try:
        if args.target is not None:
            check_target(args.target)
        with warnings.catch_warnings(record=True) as caught:  # an unreadable file of a run: one line naming it
            warnings.simplefilter("always")
            files = write_report(args.path, args.out, rows=args.rows, cols=args.cols, target_acc=args.target)
            if args.spectral:
                files.update(write_spectral_report(args.path, args.out, target_acc=args.target))
        for message in dict.fromkeys(str(w.message) for w in caught):  # the spectral report reads the runs again
            print(f"dfl report: warning: {message}", file=sys.stderr)
    except (ReportError, OutputPathError, FileReadError) as exc:
        print(f"dfl report: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a report directory that cannot be made or written (permissions, a full disk)
        print(f"dfl report: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for path in files.values():
        if Path(path).suffix == ".md":
            print(Path(path).read_text())
    print("written:")
    for path in files.values():
        print(f"  {path}")
    return 0

