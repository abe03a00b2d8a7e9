"""The `dfl` console script: one thin module per command (parse, call the library, print).

Parsing stays fast: only the invoked subcommand's module is imported to build its parser (`dfl --help` and a
mistyped command import none), and those modules reach torch only through the library, when a command runs
(an import-linter contract forbids `dfl.cli` to import torch itself). Nothing outside `dfl.cli` imports it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys

from dfl import threads
from dfl.errors import ConfigError

# subcommand -> (module defining `add_parser(subparsers)`, which registers it, and its one-line help). The help
# is repeated here so `dfl --help` lists every command without importing any; a test keeps both in sync.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("dfl.cli.run", "run one experiment (default: DFedSAM-MGS, ring, 16 clients, MNIST-1D, Dirichlet 0.3)"),
    "topology": ("dfl.cli.topology", "spectral analysis of communication topologies"),
    "sweep": ("dfl.cli.sweep", "run every combination of a sweep file ([base] + [vary]) into one sweep directory"),
    "compare-topologies": ("dfl.cli.sweep", "the DFedSAM paper's topology study: 4 topologies x 5 decentralized "
                                            "algorithms (MNIST-1D, minutes)"),
    "spectral-study": ("dfl.cli.sweep", "one algorithm across topologies x gossip steps Q (x client counts): "
                                        "accuracy vs spectral gap"),
    "reproduce": ("dfl.cli.reproduce", "a paper's table as one resumable sweep: dfedsam-table1 (8 methods x 5 "
                                       "splits x 3 seeds)"),
    "report": ("dfl.cli.report", "tables and plots of a run directory or of all runs under a directory (e.g. a sweep)"),
    "list": ("dfl.cli.listing", "every algorithm, topology, model, dataset, partition, weight scheme, logger, attack, "
                                "aggregator and compressor, with options"),
    "landscape": ("dfl.cli.landscape", "2-D loss landscape and top Hessian eigenvalue of a run's final averaged model"),
    "torchrun": ("dfl.cli.torchrun", "dfl run on N processes of this machine (torchrun), a refusal in one line"),
}
COMMAND_MODULES = tuple(dict.fromkeys(module for module, _ in COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `dfl` parser.

    `command=None`: every subcommand in full; a command name: that command's module in full and the others as one-line
    entries (enough for `dfl --help` and for choosing a command); any other string: only the one-line entries.
    """
    parser = argparse.ArgumentParser(
        prog="dfl", description="Decentralized federated learning simulator (DFedSAM, DFedSAM-MGS and baselines). "
        "`dfl` alone runs the default experiment; `dfl COMMAND --help` describes a command's options.",
    )
    sub = parser.add_subparsers(dest="command")
    wanted = COMMANDS[command][0] if command in COMMANDS else None
    for module in COMMAND_MODULES:
        if command is None or module == wanted:
            importlib.import_module(module).add_parser(sub)
            for name, (owner, _) in COMMANDS.items():
                if owner == module:
                    _short_usage(sub.choices[name])
        else:
            for name, (owner, help_text) in COMMANDS.items():
                if owner == module:
                    sub.add_parser(name, help=help_text, add_help=False)
    parser.set_defaults(subparsers=sub.choices)
    return parser


def _short_usage(parser: argparse.ArgumentParser) -> None:
    """A command's usage line as its positionals and `[options]`, unless it writes its own.

    A mistake then prints two lines (usage, error), not argparse's list of every option (which `--help` shows).
    """
    if parser.usage is None:
        formatter = argparse.HelpFormatter(parser.prog)
        positionals = [action for action in parser._actions if not action.option_strings]
        words = [formatter._format_args(action, action.dest.upper()) for action in positionals]
        parser.usage = " ".join(["%(prog)s", *words, "[options]"])


def unrecognized(parser: argparse.ArgumentParser, command: str | None, extra: list[str]) -> None:
    """Exit 2 with the command's own usage, naming the unknown arguments and the closest options."""
    target = parser._defaults["subparsers"].get(command, parser) if command else parser
    known = [s for action in target._actions for s in action.option_strings if s.startswith("--")]
    hints = []
    for arg in extra:
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=2, cutoff=0.75)
            if close:
                hints.append(f"{arg}: did you mean {' or '.join(close)}?")
    target.error(f"unrecognized arguments: {' '.join(extra)}" + "".join(f"\n  {h}" for h in hints))


def main(argv: list[str] | None = None) -> int:
    """The `dfl` command.

    Parse `argv` (default sys.argv[1:]; none runs the default experiment), run the subcommand and return its exit
    status.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        argv = ["run"]  # `dfl` alone runs the default experiment
    command = argv[0] if argv[0] in COMMANDS else None
    parser = build_parser(command or "")
    args, extra = parser.parse_known_args(argv)
    if extra:
        unrecognized(parser, command, extra)
    try:  # --threads is refused before a command loads torch (whose OpenMP runtime dfl prepares at import)
        threads.check(getattr(args, "threads", threads.AUTO))
    except ConfigError as exc:
        print(f"dfl {command or ''}".rstrip() + f": error: {exc}", file=sys.stderr)  # as the command's own errors
        return 2
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    return int(args.handler(args) or 0)

