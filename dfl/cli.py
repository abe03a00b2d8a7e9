"""The `dfl` console script: one subcommand per capability."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dfl", description="Decentralized federated learning simulator (DFedSAM, DFedSAM-MGS and baselines)."
    )
    sub = parser.add_subparsers(dest="command")
    from dfl import topology_cli

    topology_cli.add_parser(sub)
    try:
        from dfl import run_cli
    except ImportError:  # the simulator CLI lands with the engine
        run_cli = None
    if run_cli is not None:
        run_cli.add_parser(sub)
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
