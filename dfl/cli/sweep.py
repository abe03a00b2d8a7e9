"""`dfl sweep SPEC.toml --out DIR`, and two sweeps built in code on the same machinery.

`dfl compare-topologies` (the DFedSAM paper's topology study) and `dfl spectral-study` (one algorithm across topologies
and gossip steps Q, with the accuracy/consensus-vs-spectral-gap table and plots).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from dfl.cli.lists import add_list
from dfl.cli.run import key_value
from dfl.config import unknown_field_hint
from dfl.directories import RUNS, NewDirectory, new_name
from dfl.errors import ConfigError, FileReadError, OutputPathError, SweepInterrupted
from dfl.workflows.launchers import LAUNCHERS, SLURM_KEYS, SlurmOptions, make_launcher
from dfl.workflows.presets import (
    ALGORITHM_DEFAULTS_NOTE,
    PAPER_ALGORITHMS,
    PAPER_TOPOLOGIES,
    compare_topologies_sweep,
    spectral_study_sweep,
)
from dfl.workflows.sweep import (
    CONFIG_FIELDS,
    Sweep,
    SweepError,
    format_status,
    format_sweep_status,
    is_table_key,
    left_out_lines,
    load_sweep,
    plan_runs,
    run_sweep,
    sweep_status,
    sync_entries,
)

SPEC_EXAMPLE = """\
example sweep.toml:
  [sweep]
  name = "alpha-study"
  [base]
  rounds = 50
  clients = 16
  [vary]
  algorithm = ["dfedavg", "dfedsam"]
  topology = ["ring", "exponential"]
  alpha = [0.1, 0.6]
  seed = [0, 1]
  [slurm]                 # only read by --launcher slurm / submitit-local; flags override
  partition = "gpu"
  time = "04:00:00"
  gpus_per_run = 1
  max_parallel = 16

on a Slurm cluster (pip install -e ".[cluster]"):
  dfl sweep study.toml --out runs/study --launcher slurm --partition gpu --time 04:00:00 --gpus-per-run 1
  dfl sweep status runs/study     # each run queued, running, done or failed
  dfl sweep study.toml --out runs/study --launcher slurm   # again: resubmits failed and missing runs only
"""

SLURM_KEYS_HELP = SLURM_KEYS
# what a command refuses with one line (exit 2): a bad spec, config or option; a file it cannot read (sweep.json,
# jobs.json); an --out that is not a sweep directory of dfl's (dfl.directories)
REFUSED = (SweepError, ConfigError, FileReadError, OutputPathError)



def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the `sweep`, `compare-topologies` and `spectral-study` subcommands to the `dfl` parser."""
    _add_sweep(subparsers)
    _add_compare_topologies(subparsers)
    _add_spectral_study(subparsers)


def _add_sweep(subparsers: argparse._SubParsersAction) -> None:
    """`dfl sweep SPEC.toml` and `dfl sweep status DIR`."""
    p = subparsers.add_parser(
        "sweep", help="run every combination of a sweep file ([base] + [vary]) into one sweep directory",
        description="Run the cartesian product of the [vary] lists, each combination into DIR/runs/<name>/ (DIR: "
        "--out, else a new runs/<sweep name>-<YYYYmmdd-HHMMSS>). "
        "Running it again with --out DIR skips finished runs, resumes interrupted ones (and runs whose process "
        "is gone) from their checkpoint, retries failed ones and keeps diverged ones (--retry-diverged starts "
        "them over); a failed run does not stop the others (exit status 1 if any failed). "
        "SIGINT/SIGTERM/SIGHUP stop every worker (exit status 130/143/129); the same command with --out DIR "
        "resumes them. "
        "--launcher slurm submits the runs as one Slurm job array through submitit and returns (runs still queued "
        "or running in their job are never submitted again); `dfl sweep status DIR` lists each run's state.",
        epilog=SPEC_EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("spec", help="sweep TOML file, or `status` followed by a sweep directory: `dfl sweep status DIR` "
                   "lists each run as queued, running, done, failed (with its error's last line) or pending")
    p.add_argument("status_dir", nargs="?", metavar="DIR", help=argparse.SUPPRESS)
    common_flags(p, out_help="sweep directory (default: a new runs/<sweep name>-<YYYYmmdd-HHMMSS>); an existing one of "
                 "dfl's is continued")
    launcher_flags(p)
    p.add_argument("--data-root", help="directory of a file-backed dataset (sets [base] data_root)")
    p.add_argument("--set", dest="overrides", action="append", default=[], type=assignment, metavar="FIELD=VALUE",
                   help="override a [base] field (not one in [vary]), e.g. --set rounds=50")
    p.set_defaults(handler=sweep_main)


def _add_compare_topologies(subparsers: argparse._SubParsersAction) -> None:
    """`dfl compare-topologies`: the DFedSAM paper's topology study."""
    p = subparsers.add_parser(
        "compare-topologies",
        help="the DFedSAM paper's topology study: 4 topologies x 5 decentralized algorithms (MNIST-1D, minutes)",
        description="Ring, grid, exponential and full topologies x D-PSGD, DFedAvg, DFedAvgM, DFedSAM and "
        "DFedSAM-MGS. By default a laptop-CPU setting on MNIST-1D (16 clients, Dirichlet 0.3, cnn1d, 100 rounds); "
        "--full uses the paper's CIFAR-10 setting (100 clients, VGG-11, 5 local epochs, 500 rounds) for a GPU. "
        + ALGORITHM_DEFAULTS_NOTE + " The spec is written to OUT/sweep.toml, so `dfl sweep OUT/sweep.toml --out "
        "OUT` resumes it.",
    )
    p.add_argument("--full", action="store_true", help="the paper's CIFAR-10 scale (needs --data-root; a GPU)")
    p.add_argument("--data-root", help="directory holding cifar-10-batches-py (for --full)")
    add_list(p, "--topologies", default=PAPER_TOPOLOGIES, metavar="NAME",
             help="topologies (default: " + " ".join(PAPER_TOPOLOGIES) + ")")
    add_list(p, "--algorithms", default=PAPER_ALGORITHMS, metavar="NAME",
             help="decentralized algorithms (default: " + " ".join(PAPER_ALGORITHMS) + ")")
    _study_flags(p)
    common_flags(p, out_help="sweep directory (default: a new runs/compare-topologies-<YYYYmmdd-HHMMSS>, or "
                 "compare-topologies-full-...); an existing one of dfl's is continued")
    p.set_defaults(handler=compare_topologies_main)


def _add_spectral_study(subparsers: argparse._SubParsersAction) -> None:
    """`dfl spectral-study`: one algorithm across topologies x gossip steps Q."""
    p = subparsers.add_parser(
        "spectral-study",
        help="one algorithm across topologies x gossip steps Q (x client counts): accuracy vs spectral gap",
        description="Run one algorithm on every topology x Q (x clients) x seed (laptop MNIST-1D setting unless "
        "--set changes it), then write the accuracy/consensus-vs-spectral-gap table and plots (columns lambda, "
        "1 - lambda^Q, Phi(lambda, m, Q), effective neighbours) into OUT/report/ and print the table.",
    )
    p.add_argument("--algorithm", default="dfedsam-mgs", help="default dfedsam-mgs")
    add_list(p, "--topologies", default=PAPER_TOPOLOGIES, metavar="NAME",
             help="topologies (default: " + " ".join(PAPER_TOPOLOGIES) + ")")
    add_list(p, "--gossip-steps", item=int, what="integers", default=None, metavar="Q",
             help="gossip steps per round (default 1 2 4; only for algorithms that take Q)")
    add_list(p, "--clients", item=int, what="integers", default=None, metavar="M",
             help="client counts (default: one count, the base's 16)")
    _study_flags(p)
    common_flags(p, out_help="sweep directory (default: a new runs/spectral-study-<YYYYmmdd-HHMMSS>); an existing "
                 "one of dfl's is continued")
    p.set_defaults(handler=spectral_study_main)


def common_flags(p: argparse.ArgumentParser, out_help: str) -> None:
    """The flags every sweep command takes: --out, --parallel, --dry-run, --retry-diverged, --no-report."""
    p.add_argument("--out", help=out_help)
    p.add_argument("--parallel", type=int, default=None, metavar="N",
                   help="run N runs at once in worker processes (default: [sweep] parallel, else 1)")
    p.add_argument("--dry-run", action="store_true", help="list the runs and what each would do (and why), run "
                   "nothing")
    p.add_argument("--retry-diverged", action="store_true",
                   help="start diverged runs over from scratch (by default they are kept and skipped, even when "
                   "rounds grew; they are not resumed: their last good checkpoint would diverge again)")
    p.add_argument("--no-report", action="store_true", help="do not write OUT/report/ at the end")


def launcher_flags(p: argparse.ArgumentParser) -> None:
    """Where a sweep's runs execute: --launcher and the Slurm options (default: the sweep file's [slurm] table)."""
    g = p.add_argument_group("launcher", "where the runs execute; the Slurm options default to the sweep file's "
                             "[slurm] table (flags override it)")
    g.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="local: worker processes on this machine (default, see --parallel); slurm: one Slurm job "
                   "array through submitit, returns once queued (pip install -e \".[cluster]\"); submitit-local: "
                   "the same submission on submitit's local executor, no Slurm")
    g.add_argument("--partition", help="Slurm partition")
    g.add_argument("--time", help="time limit per run, as sbatch takes it: MINUTES, HOURS:MINUTES:SECONDS, "
                   "DAYS-HOURS, ... (e.g. 04:00:00)")
    g.add_argument("--gpus-per-run", type=int, metavar="N", help="GPUs per run (default 0)")
    g.add_argument("--cpus-per-run", type=int, metavar="N", help="CPU cores per run (split over its processes)")
    g.add_argument("--tasks-per-run", type=int, metavar="N",
                   help="processes per run: a torch.distributed world (default 1)")
    g.add_argument("--nodes-per-run", type=int, metavar="N", help="nodes per run (default 1)")
    g.add_argument("--max-parallel", type=int, metavar="N", help="most array tasks running at once")
    g.add_argument("--slurm", dest="slurm_options", action="append", default=[], type=_slurm_option,
                   metavar="KEY=VALUE", help="another sbatch option, e.g. --slurm account=proj --slurm mem=32G "
                   "(keys: " + ", ".join(SLURM_KEYS_HELP) + ")")
    g.add_argument("--wait", action="store_true", help="with a submitit launcher: wait for the jobs, then print "
                   "the table and write the report")


def _slurm_option(text: str) -> tuple[str, Any]:
    return key_value(text, form="KEY=VALUE")


def _study_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, help="rounds per run (default 100; --full 500)")
    p.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 per setting (default 1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], type=assignment, metavar="FIELD=VALUE",
                   help="override a base Config field, e.g. --set lr=0.05 --set topology_options={'periodic':True} "
                   "--set algorithm_options.clip=0.5")


def assignment(text: str) -> tuple[str, Any]:
    """`--set FIELD=VALUE` (or FIELD.KEY=VALUE for one key of a table field) as (field, value); one line if unknown."""
    key, value = key_value(text, form="FIELD=VALUE")
    if key not in CONFIG_FIELDS and not is_table_key(key):  # FIELD.KEY sets one key of a table field
        raise argparse.ArgumentTypeError(f"unknown Config field {key!r}{unknown_field_hint(key)}")
    return key, value


# ---------------------------------------------------------------------------------------------- handlers
def sweep_main(args: argparse.Namespace) -> int:
    """`dfl sweep SPEC.toml` (or `dfl sweep status DIR`): run or submit the sweep and print each run's outcome.

    Returns:
        The exit status: 0, 1 when a run failed, 2 for a refused spec or option, 128 + a stop signal.
    """
    if args.spec == "status" and (args.status_dir is not None or not Path("status").is_file()):
        return status_main(args)
    if args.status_dir is not None:
        return refuse("sweep", f"unexpected argument {args.status_dir!r}: give one sweep file (or `dfl sweep status "
                      "DIR` to list a sweep's runs)")
    if out_refused("sweep", args):
        return 2
    try:
        overrides = dict(args.overrides)
        if args.data_root is not None:
            overrides["data_root"] = args.data_root
        sweep = load_sweep(args.spec, overrides)  # every combination validated, with the overrides
    except (SweepError, ConfigError) as exc:
        return refuse("sweep", exc)
    return execute_sweep("sweep", sweep, args)


def status_main(args: argparse.Namespace) -> int:
    """`dfl sweep status DIR`: print each run's state; the exit status."""
    if args.status_dir is None:
        return refuse("sweep status", "give the sweep directory: dfl sweep status DIR")
    try:
        rows = sweep_status(args.status_dir)
    except (*REFUSED, OSError) as exc:
        return refuse("sweep status", exc)
    print(format_sweep_status(rows))
    return 0


def _launcher(sweep: Sweep, args: argparse.Namespace):
    """The launcher the flags ask for (a bad Slurm option fails here, before anything is submitted)."""
    kind = getattr(args, "launcher", "local")
    if kind == "local":
        return make_launcher("local", parallel=sweep.parallel if args.parallel is None else args.parallel)
    flags = {"partition": args.partition, "time": args.time, "gpus_per_run": args.gpus_per_run,
             "cpus_per_run": args.cpus_per_run, "tasks_per_run": args.tasks_per_run,
             "nodes_per_run": args.nodes_per_run, "max_parallel": args.max_parallel,
             "extra": dict(args.slurm_options)}
    options = SlurmOptions.from_table(sweep.slurm).merged(flags).checked()
    return make_launcher(kind, options=options)


def out_refused(command: str, args: argparse.Namespace) -> bool:
    """Whether `--out` names a path a sweep may not write into (`dfl.directories`), said in one line.

    Checked before the sweep's runs are planned and validated (which loads torch), so the refusal is immediate.
    """
    if args.out is None:
        return False
    from dfl.directories import check_output_directory

    try:
        check_output_directory(args.out, "sweep")
    except OutputPathError as exc:
        refuse(command, exc)
        return True
    return False


def compare_topologies_main(args: argparse.Namespace) -> int:
    """`dfl compare-topologies`: the topology study's sweep, run into --out; the exit status."""
    if out_refused("compare-topologies", args):
        return 2
    data_root = args.data_root
    if args.full and data_root is None and "data_root" not in dict(args.overrides):  # checked by a dry run too
        return refuse("compare-topologies", "--full trains on CIFAR-10 and needs --data-root DIR (the directory "
                      "holding cifar-10-batches-py)")
    try:
        sweep = compare_topologies_sweep(full=args.full, rounds=args.rounds, seeds=args.seeds, data_root=data_root,
                                         topologies=args.topologies, algorithms=args.algorithms,
                                         overrides=dict(args.overrides))
    except (SweepError, ConfigError) as exc:
        return refuse("compare-topologies", exc)
    return execute_sweep("compare-topologies", sweep, args)


def spectral_study_main(args: argparse.Namespace) -> int:
    """`dfl spectral-study`: the spectral study's sweep, run, then its report printed; the exit status."""
    if out_refused("spectral-study", args):
        return 2
    try:
        sweep = spectral_study_sweep(algorithm=args.algorithm, topologies=args.topologies,
                                     gossip_steps=args.gossip_steps, clients=args.clients, rounds=args.rounds,
                                     seeds=args.seeds, overrides=dict(args.overrides))
    except (SweepError, ConfigError) as exc:
        return refuse("spectral-study", exc)
    return execute_sweep("spectral-study", sweep, args, spectral=True)


def execute_sweep(command: str, sweep: Sweep, args: argparse.Namespace, spectral: bool = False, report=None) -> int:
    """Run (or with --dry-run list) the sweep into --out, or into a new runs/<sweep name>-<time> made for it.

    Prints its status, then the report; returns the exit status. `report(out, status)` replaces the default report
    (`dfl report`, or the spectral study's with `spectral`).
    """
    new = NewDirectory(sweep.name, RUNS) if args.out is None else None
    try:
        launcher = _launcher(sweep, args)
        if args.dry_run:
            out = Path(args.out) if new is None else next(new_name(sweep.name, RUNS))  # named, not made
            planned = sweep.plan()
            retry = getattr(args, "retry_diverged", False)
            plans = plan_runs(out, planned, retry_diverged=retry, launcher=launcher)
            print(f"{len(planned)} runs into {out}/runs/:")
            for p, plan in zip(planned, plans):
                print(f"  {plan.action:<6} {p.name}" + (f"  ({plan.note})" if plan.note else ""))
            for line in left_out_lines(planned):
                print(line)
            return 0
        out = Path(args.out) if new is None else new.make("sweep")
        entries = run_sweep(sweep, out, retry_diverged=getattr(args, "retry_diverged", False), launcher=launcher)
        if launcher.kind != "local":
            return _submitted(command, launcher, out, args, spectral, report)
    except (*REFUSED, OSError) as exc:  # OSError: a directory that cannot be made or written (permissions, disk)
        _remove_if_unused(new)
        return refuse(command, exc)
    except SweepInterrupted as exc:  # the workers are stopped; their checkpoints stay
        stopped = f"stopped {exc.stopped} running run(s); " if exc.stopped else ""
        print(f"dfl {command}: {exc}: {stopped}{_again(out, new)} to resume the sweep", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # raised by a handler other than the sweep's (e.g. the run's own)
        _remove_if_unused(new)
        where = _again(new.path, new) if new is not None and new.path is not None else "run the same command again"
        print(f"dfl {command}: interrupted; {where} to resume the sweep", file=sys.stderr)
        return 130
    print(format_status(entries))
    print(f"sweep directory: {out}")
    status = 1 if any(e["status"] == "failed" for e in entries) else 0
    return report(out, status) if report is not None else _report(command, out, args, spectral, status)


def _again(out: Path, new: NewDirectory | None) -> str:
    """How to continue the sweep in `out`: the same command, with --out when the sweep chose the directory."""
    return "run the same command again" if new is None else f"run the same command again with --out {out}"


def _remove_if_unused(new: NewDirectory | None) -> None:
    """The new sweep directory, when the sweep stopped before writing anything into it, is removed again."""
    if new is not None:
        new.remove_if_unused()


def _submitted(command: str, launcher, out: Path, args: argparse.Namespace, spectral: bool, report=None) -> int:
    """After a submitit submission: the status table; with --wait, wait for the jobs first, then the report."""
    if not getattr(args, "wait", False):
        print(format_sweep_status(sweep_status(out)))
        again = "the same command again" if args.out is not None else f"the same command with --out {out}"
        print(f"watch it with: dfl sweep status {out}; run {again} to resubmit failed and missing "
              "runs (queued and running ones are left alone)")
        return 0
    launcher.wait()
    sync_entries(out)
    rows = sweep_status(out)
    print(format_sweep_status(rows))
    status = 1 if any(r["state"] == "failed" for r in rows) else 0
    return report(out, status) if report is not None else _report(command, out, args, spectral, status)


def _report(command: str, out: Path, args: argparse.Namespace, spectral: bool, status: int) -> int:
    if args.no_report:
        return status
    try:
        from dfl import report

        with warnings.catch_warnings(record=True) as caught:  # e.g. a run's unreadable file: one line naming it
            warnings.simplefilter("always")
            files = report.write_spectral_report(out) if spectral else report.write_report(out)
    except Exception as exc:  # the runs are on disk; say why there is no report
        print(f"dfl {command}: error: writing the report failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for message in dict.fromkeys(str(w.message) for w in caught):
        print(f"dfl {command}: warning: {message}", file=sys.stderr)
    for path in files.values():
        if spectral and Path(path).suffix == ".md":
            print(Path(path).read_text())
    print(f"report: {', '.join(str(p) for p in files.values())}")
    return status


def refuse(command: str, exc) -> int:
    """Print `dfl COMMAND: error: ...` in one line (an OSError as its file and reason) and return exit status 2."""
    if isinstance(exc, OSError) and exc.filename is not None:
        exc = f"{exc.filename}: {exc.strerror or exc}"
    print(f"dfl {command}: error: {exc}", file=sys.stderr)
    return 2
