"""The `dfl` console script: one subcommand per capability."""

from __future__ import annotations

import argparse
import importlib
import sys

# Each module defines `add_parser(subparsers)` and registers its subcommand(s).
COMMAND_MODULES = ("dfl.run_cli", "dfl.topology_cli", "dfl.sweep_cli", "dfl.report_cli", "dfl.landscape_cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dfl", description="Decentralized federated learning simulator (DFedSAM, DFedSAM-MGS and baselines)."
    )
    sub = parser.add_subparsers(dest="command")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if not argv:
        argv = ["run"]  # `dfl` alone runs the default experiment
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
