"""`dfl torchrun N [dfl run arguments ...]`: `dfl run` on N ranks of this machine, a refusal in one line.

The config (and --out) is checked here first, before any process starts (as `dfl run` checks it, torch-free), with
the rules of a world of N processes (`dfl.engine.combinations`); a resume's config too (DIR/config.toml and the flags
over it: a resume may use another number of processes, and a Byzantine run may not use several); then
torchrun runs the ranks (`dfl.workflows.torchrun`), whose own failure report is dropped after a rank's one-line
refusal.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> None:
    """Add the `torchrun` subcommand to the `dfl` parser."""
    p = subparsers.add_parser(
        "torchrun",
        help="dfl run on N processes of this machine (torchrun), a refusal in one line",
        description="Run `dfl run ARGS` on N processes of this machine through torchrun (one node, --standalone; "
        "each rank one torch thread unless OMP_NUM_THREADS says otherwise). A config mistake is refused before "
        "any process starts; a refusal of a rank (e.g. an option a multi-process run does not support) is shown "
        "as dfl's one line, without torchrun's traceback and failure table, and the exit status is the rank's "
        "(2). Several nodes: torchrun itself (launch/slurm_multinode.sh).",
        usage="%(prog)s N [dfl run arguments ...]",
    )
    p.add_argument("nproc", metavar="N", type=int, help="processes (ranks): e.g. the GPUs of the machine, or 2 CPU "
                   "workers (gloo)")
    p.add_argument("run_args", nargs=argparse.REMAINDER, metavar="ARGS", help="arguments of dfl run")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    """`dfl torchrun`: check the run's config, then launch it; the exit status."""
    from dfl.cli import build_parser, unrecognized
    from dfl.cli.run import resume_args, run_directory, validate_args
    from dfl.engine import combinations  # no torch
    from dfl.engine.validation import validate  # no torch
    from dfl.errors import ConfigError

    if args.nproc < 1:
        print(f"dfl torchrun: error: N must be >= 1, got {args.nproc}", file=sys.stderr)
        return 2
    run_parser = build_parser("run")
    run_args, extra = run_parser.parse_known_args(["run", *args.run_args])
    if extra:  # a wrong flag: the usage of dfl run, the closest flags, exit 2
        unrecognized(run_parser, "run", extra)
    try:
        resume = getattr(run_args, "resume", None) is not None
        if resume:  # the config is DIR/config.toml with the flags over it, checked as a new run's
            run_args = resume_args(run_args)
        config = validate_args(run_args, validate)
        combinations.check(config, world=args.nproc)  # the table's rules of a world of N, before N processes start
        if not resume:  # a resume writes into its own run directory, which resume_args checked
            run_directory(run_args, config)
    except (ConfigError, ValueError, FileExistsError, FileNotFoundError) as exc:  # NoCheckpoint: --resume DIR
        print(f"dfl run: error: {exc}", file=sys.stderr)
        return 2
    from dfl.workflows import torchrun

    return torchrun.launch(args.nproc, args.run_args)
