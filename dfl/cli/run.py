"""`dfl run [CONFIG.toml] [--field value ...]`: one flag per Config field; flags override the file.

Without --out the run writes into a new directory runs/<name>-<YYYYmmdd-HHMMSS> (`dfl.directories.NewDirectory`;
<name> is the algorithm unless `name` is set), so reruns never collide; an --out that holds a run is refused
unless --overwrite or --resume says what to do with it.

`dfl run --resume DIR [--rounds N ...]` continues the run in DIR from its checkpoint, with DIR/config.toml
as the config; flags may change the fields that are safe to change on resume (`dfl.engine.checkpoint`).
`dfl run --resume` alone continues the latest interrupted run under runs/ (`dfl.directories.latest_resumable_run`).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from dfl.cli.lists import add_list
from dfl.config import Config, Option, field_of, options, read_toml
from dfl.directories import RUNS, NewDirectory, check_output_directory, directory_kind, latest_resumable_run
from dfl.errors import ConfigError, NoCheckpoint

LATEST = ""  # `--resume` without a directory: the latest interrupted run under runs/
DEFAULT_NAME = "default"  # Config.name's default: the new run directory is named after the algorithm instead


def add_parser(subparsers) -> None:
    """Add the `run` subcommand to the `dfl` parser.

    One flag per Config field, grouped as `dfl.config.options()` groups them.
    """
    parser = subparsers.add_parser(
        "run",
        help="run one experiment (default: DFedSAM-MGS, ring, 16 clients, MNIST-1D, Dirichlet 0.3)",
        description="Run one experiment. Values come from the defaults, then CONFIG.toml, then flags.",
        usage="%(prog)s [CONFIG.toml] [--out DIR] [--overwrite] [--FIELD VALUE ...]\n"
              "       %(prog)s --resume [DIR] [--FIELD VALUE ...]",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument("config_file", nargs="?", help="TOML file of Config fields")
    parser.add_argument("--out", help="run directory (default: a new runs/<name>-<YYYYmmdd-HHMMSS>, <name> being "
                        "the algorithm unless --name is given); one that holds a run is refused without --overwrite "
                        "or --resume")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run directory")
    parser.add_argument(
        "--resume", metavar="DIR", nargs="?", const=LATEST,
        help="continue the run in DIR from its checkpoint (config from DIR/config.toml; flags may change "
        "rounds, progress, checkpoint_every and execution settings); without DIR, the latest interrupted run "
        "under runs/",
    )
    add_config_flags(parser)
    parser.set_defaults(handler=main)


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per Config field, grouped by the sections of the options reference.

    Each flag is described by `dfl.config.options()`: its type, default, choices and help line.
    """
    groups: dict[str, argparse._ArgumentGroup] = {}
    defaults = card_help()
    for opt in options():
        group = groups.get(opt.section) or groups.setdefault(opt.section, parser.add_argument_group(opt.section))
        flag = "--" + opt.name.replace("_", "-")
        facts = [opt.interval.describe()] if opt.interval is not None else []  # choices show in the metavar
        facts += [] if opt.default in (None, {}, []) else [f"default {opt.default}"]
        text = option_help(opt, defaults) + (f" ({'; '.join(facts)})" if facts else "")
        kind = opt.type
        metavar = "{" + ",".join(opt.choices) + "}" if opt.choices else None
        if opt.name == "loggers":  # --log tensorboard --log wandb, or --log tensorboard,wandb
            group.add_argument("--log", flag, dest=opt.name, action=_AppendNames, metavar="NAME", help=text)
        elif kind == "bool":
            group.add_argument(flag, dest=opt.name, action=argparse.BooleanOptionalAction, help=text)
        elif kind.startswith("dict"):
            group.add_argument(flag, dest=opt.name, nargs="+", metavar="KEY=VALUE", type=key_value,
                               help=text + "; one or more key=value pairs, values as Python literals")
        elif kind.startswith("list["):  # e.g. lr_milestones: --lr-milestones 100 150 (no values = empty list)
            add_list(group, flag, dest=opt.name, item=_scalar_type(kind[5:-1]), empty=True, metavar="N", help=text,
                     what="numbers")
        else:
            group.add_argument(flag, dest=opt.name, type=_scalar_type(kind), metavar=metavar, help=text)


def option_help(opt: Option, defaults: dict[str, str] | None = None) -> str:
    """The help line of a Config field; an algorithm hyperparameter's says its defaults, from the algorithms' cards.

    `defaults`: `card_help()`, when the caller has it (it reads every card).
    """
    said = (card_help() if defaults is None else defaults).get(opt.name)
    return f"{opt.help} ({said})" if said else opt.help


def algorithm_defaults(name: str) -> str:
    """What an unset algorithm hyperparameter `name` (a Config field) is (`hyperparameter_defaults`), or ""."""
    return hyperparameter_defaults().get(name, "")


def card_help() -> dict[str, str]:
    """Config field -> what the cards add to its help: a hyperparameter's defaults, else the built-ins it lists."""
    return {**capability_lists(), **hyperparameter_defaults()}


def capability_lists() -> dict[str, str]:
    """Config field -> which built-ins it offers or who takes it, from the cards (the help of --algorithm, ...).

    algorithm: the decentralized and the centralized algorithms (`AlgorithmCard.centralized`); mode: the algorithms
    with an asynchronous form (`asynchronous`); local_optimizer: those whose rule takes adam/adamw
    (`local_optimizers`); the built-in compressors and models; each attack's default strength. Read from the
    torch-free cards and registries, so `Config`'s own help never lists them by hand. (Topologies, weight schemes,
    datasets and partitions are left to `dfl list`: their packages import networkx, which the parser does not load.)
    """
    from dfl.algorithms.builtin import BUILTINS  # the cards: torch-free
    from dfl.models import MODELS
    from dfl.network.byzantine_settings import ATTACKS
    from dfl.network.settings import COMPRESSORS  # the compressors' cards: torch-free

    cards = {name: builtin.card for name, builtin in BUILTINS.items()}
    decentralized = [name for name, card in cards.items() if not card.centralized]
    centralized = [name for name, card in cards.items() if card.centralized]
    asynchronous = [name for name, card in cards.items() if card.asynchronous]
    adam = [name for name, card in cards.items() if "adam" in card.local_optimizers]
    return {
        "algorithm": f"decentralized: {', '.join(decentralized)}; centralized: {', '.join(centralized)}; or a "
                     "registered one",
        "mode": f"async runs with {', '.join(asynchronous)}",
        "local_optimizer": f"adam and adamw run with {', '.join(adam)}",
        "compressor": f"none or one of {', '.join(COMPRESSORS.declared())}",
        "model": f"{', '.join(MODELS.declared())}, or your own",
        "attack_scale": "unset = " + "; ".join(
            f"{name} {_shown(card.scale) if not callable(card.scale) else card.scale.__doc__.split(' (')[0]}"
            for name in ATTACKS.declared() for card in [ATTACKS.card(name)]),
    }


def hyperparameter_defaults(most: int = 3) -> dict[str, str]:
    """Config field -> what it is when unset, for each algorithm hyperparameter, from the built-in algorithms' cards.

    The values grouped by algorithm, the most common last as "for the others": "unset = the algorithm's: 0 for dsgt,
    kgt; 0.1 for fedsam, mofedsam; 0.01 for the others". One value read by at most `most` algorithms names them ("4
    for dfedsam-mgs"), by more just the value. The cards are read, not imported with the algorithms (no torch, no
    plug-ins).
    """
    from dfl.algorithms.builtin import BUILTINS  # the cards: torch-free

    readers: dict[str, dict[str, list[str]]] = {}  # field -> value as shown -> the algorithms whose default it is
    for algorithm, builtin in BUILTINS.items():
        for spec in builtin.card.specs():
            if spec.config_field:
                readers.setdefault(spec.name, {}).setdefault(_shown(spec.default), []).append(algorithm)
    out = {}
    for name, groups in readers.items():
        common = max(groups, key=lambda value: len(groups[value]))  # the first of the largest groups
        parts = [f"{value} for {', '.join(names)}" for value, names in groups.items() if value != common]
        if parts:
            parts.append(f"{common} for the others")
        else:
            names = groups[common]
            parts.append(f"{common} for {', '.join(names)}" if len(names) <= most else common)
        out[name] = "unset = the algorithm's: " + "; ".join(parts)
    return out


def _shown(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class _AppendNames(argparse.Action):
    """A list flag: each use adds its comma-separated names to the list.

    The flag's list replaces the config file's list (an empty value adds none: `--log ''` turns the file's loggers
    off).
    """

    def __call__(self, parser, namespace, values, option_string=None):
        names = list(getattr(namespace, self.dest, None) or [])
        setattr(namespace, self.dest, names + [n.strip() for n in values.split(",") if n.strip()])


def _scalar_type(kind: str):
    if kind == "int | str":  # e.g. client_chunk: a number, or a word such as "auto"
        return lambda text: int(text) if text.lstrip("-").isdigit() else text
    if kind.startswith("int"):
        return int
    if kind.startswith("float"):
        return float
    return str


def key_value(text: str, form: str = "KEY=VALUE") -> tuple[str, object]:
    """`key=value` → (key, value).

    The key with - as _; the value as a Python literal, true/false as in TOML, or the raw text for another bare
    word.
    """
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected {form}, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = {"true": True, "false": False}.get(raw, raw)  # a bare word is a string
    return key.strip().replace("-", "_"), value


def config_from_args(args: argparse.Namespace) -> Config:
    """The Config of `dfl run`: the defaults, then CONFIG.toml, then the flags that were given."""
    from dfl.engine.validation import option_owner  # no torch

    values = vars(args)
    config = Config.from_toml(values["config_file"], owner=option_owner) if values.get("config_file") else Config()
    return config.replace(**_flag_changes(args))


def _flag_changes(args: argparse.Namespace) -> dict:
    """The Config fields given as flags, with their values."""
    values = vars(args)
    return {f.name: dict(values[f.name]) if str(f.type).startswith("dict") else values[f.name]
            for f in fields(Config) if f.name in values}


def validate_args(args: argparse.Namespace, validate) -> Config:
    """`validate(config_from_args(args))`, every mistake of the file and the flags at once.

    The config file's wrong keys (`Config.load`) and then what `validate` finds in the rest; a refusal of a field
    that the config file set (and no flag replaced) names the file, as the file's own type and range errors do.
    """
    from dfl.engine.validation import option_owner  # no torch

    path = vars(args).get("config_file")
    config, found = Config.load(path, owner=option_owner) if path else (Config(), [])
    in_file = read_toml(path, "config file") if path else {}
    found = [p for p in found if field_of(p.split(": ", 1)[1]) not in vars(args)]  # a flag replaced the file's value
    wrong_keys = {field_of(problem.split(": ", 1)[1]) for problem in found}
    config = config.replace(**_flag_changes(args))
    try:
        config = validate(config)
    except ConfigError as exc:
        for problem in exc.problems:
            field = field_of(problem)
            if field in wrong_keys and field not in vars(args):
                continue  # the file's own wrong value, said above
            found.append(f"config file {path}: {problem}" if field in in_file and field not in vars(args) else problem)
    if found:
        raise ConfigError("; ".join(found), found)
    return config


def resume_args(args: argparse.Namespace) -> argparse.Namespace:
    """`--resume DIR`: the config file is DIR/config.toml and the run directory DIR.

    `--resume` without DIR: the latest interrupted run under runs/ (`latest_resumable_run`, whose refusal lists the
    runs there).
    """
    from dfl.engine.checkpoint import FILENAME

    if getattr(args, "config_file", None):
        raise ConfigError(f"give either a config file or --resume DIR, not both (got {args.config_file!r}); "
                          "on resume the config is DIR/config.toml, and flags override it")
    if getattr(args, "overwrite", False):
        raise ConfigError("--resume and --overwrite exclude each other")
    if args.resume == LATEST and getattr(args, "out", None):
        run_dir = Path(args.out)  # `--out DIR --resume`: that run
    else:
        run_dir = Path(args.resume) if args.resume != LATEST else latest_resumable_run(RUNS)
    if getattr(args, "out", None) and Path(args.out).resolve() != run_dir.resolve():
        raise ConfigError(f"--out {args.out} differs from --resume {run_dir}: a run resumes in its own directory")
    for name in ("config.toml", FILENAME):
        if not (run_dir / name).is_file():
            raise NoCheckpoint(f"cannot resume: {run_dir} {_not_resumable(run_dir, name)}")
    return argparse.Namespace(**{**vars(args), "resume": str(run_dir), "config_file": str(run_dir / "config.toml"),
                                 "out": str(run_dir)})


def _not_resumable(path: Path, missing: str) -> str:
    """Why `path` cannot be resumed, and what to do instead (`--overwrite` only for a run directory dfl made)."""
    if path.is_file():
        return "is a file, not a run directory; give the run's directory"
    if not path.exists():
        return "does not exist; start the run without --resume"
    if directory_kind(path) == "run":
        return (f"is not a resumable run directory (no {missing}); start the run again without --resume (with "
                "--overwrite to replace the directory)")
    return f"is not a run directory dfl made (no {missing}); start the run without --resume, with another --out"


def run_directory(args: argparse.Namespace, config: Config) -> Path | NewDirectory:
    """Where `dfl run` writes: --out (checked now, before torch loads), or a new directory under runs/.

    An --out dfl may not write into is refused (`dfl.directories.check_output_directory`): a folder dfl did not make
    (with or without --overwrite), a file, a path under a file, a sweep or report directory, or a run directory
    without --overwrite or --resume. Under torchrun only rank 0 checks (it alone writes there). Without --out: a
    `NewDirectory` named after `name`, or after the algorithm when `name` is left at its default; the run makes it.
    """
    out = getattr(args, "out", None)
    if out is None:
        return NewDirectory(config.name if config.name != DEFAULT_NAME else config.algorithm, RUNS)
    if int(os.environ.get("RANK", "0")) == 0 and getattr(args, "resume", None) is None:
        # --resume writes only into a run of dfl's, which resume_args and the run directory check
        check_output_directory(out, "run", overwrite=getattr(args, "overwrite", False))
    return Path(out)


@contextlib.contextmanager
def _signals_stop_run() -> Iterator[None]:
    """Within: SIGTERM (kill, torchrun, schedulers) and SIGHUP (a closed terminal) stop the run like Ctrl-C does.

    The run records status "interrupted", keeps its metrics and last checkpoint, and the command exits 128 + the
    signal number. Handlers are set in the main thread only (elsewhere Python cannot set them).
    """
    from dfl.errors import RunInterrupted

    def raise_on_signal(signum: int, frame: object) -> None:  # dfl.engine.runner's, without importing torch
        raise RunInterrupted(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, raise_on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(args: argparse.Namespace) -> int:
    """`dfl run`: validate the config and check --out (both before torch loads), run it and print its summary.

    Returns:
        The exit status: 0, 1 for a diverged run, 2 for a refused config or output, 128 + the signal that
        interrupted the run.
    """
    from dfl.engine.results import format_summary
    from dfl.engine.validation import validate  # no torch: every check that needs no data answers at once
    from dfl.errors import DivergenceError, RunDirectoryExists

    out: Path | NewDirectory | None = None
    with _signals_stop_run():
        try:
            resume = getattr(args, "resume", None)
            if resume is not None:
                args = resume_args(args)
            config = validate_args(args, validate)  # a mistake in the config is named before the directory's
            out = run_directory(args, config)
            from dfl.engine.runner import run  # torch loads here, once the config is known to be good

            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.formatwarning = lambda message, *a, **k: f"dfl run: warning: {message}\n"
                result = run(config, out=out, overwrite=getattr(args, "overwrite", False), resume=resume is not None)
        except (ConfigError, RunDirectoryExists, FileNotFoundError, ValueError) as exc:  # OutputPathError, ...
            print(f"dfl run: error: {exc}", file=sys.stderr)
            return 2
        except DivergenceError as exc:
            print(f"dfl run: error: {exc} ({_diverged_where(_made(out))})", file=sys.stderr)
            return 1
        except KeyboardInterrupt as exc:
            signum = getattr(exc, "signum", signal.SIGINT)
            print(f"dfl run: interrupted by {signal.Signals(signum).name}{_interrupted_where(_made(out))}",
                  file=sys.stderr)
            return 128 + int(signum)
        except OSError as exc:  # a read-only or full disk, --out naming a file, an unreadable data root, ...
            path = exc.filename if exc.filename is not None else _made(out)
            print(f"dfl run: error: {path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 reports
        print(format_summary(result.summary))
    return 0


def _made(out: Path | NewDirectory | None) -> Path | None:
    """The run directory as far as it exists: --out, or the new directory once the run made it."""
    return out.path if isinstance(out, NewDirectory) else out


def _diverged_where(out: Path | None) -> str:
    """Where a diverged run's metrics are, or that it recorded none."""
    from dfl.report.runs import has_metrics

    if out is not None and has_metrics(out):
        return f"the metrics so far are in {out}"
    return "it diverged before its first evaluation: no metrics were recorded"


def _interrupted_where(out: Path | None) -> str:
    """How to continue an interrupted run, or that it wrote no checkpoint yet."""
    if out is not None and (out / "checkpoint.pt").exists():
        return f"; the run so far is in {out}, continue with: dfl run --resume {out}"
    return "; no checkpoint was written yet"
