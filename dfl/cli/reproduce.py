"""`dfl reproduce STUDY`: a paper's table as one resumable sweep, reported in the paper's layout.

`dfl reproduce dfedsam-table1`: the DFedSAM paper's Table 1 (`dfl.workflows.reproduce`), eight methods x the data
splits x 3 seeds on MNIST-1D in minutes, `--quick` in about a minute, `--full` at the paper's CIFAR scale.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

from dfl.cli.lists import add_list
from dfl.cli.sweep import (
    REFUSED,
    assignment,
    common_flags,
    execute_sweep,
    launcher_flags,
    out_refused,
    refuse,
)
from dfl.workflows.reproduce import FULL_DATASETS, METHODS, SPLITS, STUDIES, table1_sweep
from dfl.workflows.sweep import read_entries

GPU_REPORTS = "benchmarks/results/gpu_report*.json"  # where benchmarks/gpu_check.py's reports are kept


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add the `reproduce` subcommand to the `dfl` parser."""
    p = subparsers.add_parser(
        "reproduce", help="a paper's table as one resumable sweep: dfedsam-table1 (8 methods x 5 splits x 3 seeds)",
        description="dfedsam-table1: the DFedSAM paper's Table 1 (Shi et al., ICML 2023), FedAvg, FedSAM, D-PSGD, "
        "DFedAvg, DFedAvgM, DisPFL, DFedSAM and DFedSAM-MGS x Dirichlet 0.3 / 0.6, pathological 2 / 5 classes per "
        "client and IID x 3 seeds. By default a laptop scale on MNIST-1D (16 clients, 40 rounds; about 10 minutes on 2 "
        "idle cores), "
        "--quick a tiny one (under a minute), --full the paper's CIFAR-10/100 scale (100 clients, ResNet-18, 500 "
        "rounds, 5 local epochs of batch 128; a GPU). Rerunning the command skips finished runs and resumes the "
        "others. The report, OUT/report/table1.md and table1.csv, has train / test / gap per method and split "
        "(mean ± sd over seeds) and the time the table takes here and, from benchmarks/gpu_check.py's figures, on "
        "one GPU. What each method runs and why: docs/study-table1.md.",
    )
    p.add_argument("study", choices=STUDIES, help="the table to reproduce")
    p.add_argument("--full", action="store_true", help="the paper's CIFAR-10/100 scale (needs --data-root; a GPU)")
    p.add_argument("--quick", action="store_true", help="a tiny version to try the command (8 clients, 4 rounds, "
                   "1 seed; no accuracy meaning)")
    p.add_argument("--data-root", help="directory holding cifar-10-batches-py and cifar-100-python (for --full)")
    add_list(p, "--datasets", default=None, metavar="NAME",
             help="--full: a subset of " + " ".join(FULL_DATASETS) + " (default both)")
    add_list(p, "--methods", default=None, metavar="NAME", help="rows (default all: " + " ".join(METHODS) + ")")
    add_list(p, "--splits", default=None, metavar="NAME", help="columns (default all: " + " ".join(SPLITS) + ")")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 per cell (default 3; --quick 1)")
    p.add_argument("--rounds", type=int, help="rounds per run (default 40; --quick 4; --full 500)")
    p.add_argument("--set", dest="overrides", action="append", default=[], type=assignment, metavar="FIELD=VALUE",
                   help="override a Config field: where a method sets it (e.g. rho, momentum, local_epochs), there")
    p.add_argument("--gpu-report", action="append", default=None, metavar="FILE",
                   help=f"benchmarks/gpu_check.py's gpu_report.json for the GPU projection (default: {GPU_REPORTS} "
                   "under the current directory)")
    common_flags(p, out_help="sweep directory (default: a new runs/dfedsam-table1[-quick|-full]-<time>; give --out "
            "to resume or extend a table: rerunning with the same --out skips what is done)")
    launcher_flags(p)
    p.set_defaults(handler=reproduce_main)


def reproduce_main(args: argparse.Namespace) -> int:
    """`dfl reproduce dfedsam-table1`: the sweep run (or listed), then its table printed; the exit status."""
    command = f"reproduce {args.study}"
    if out_refused(command, args):
        return 2
    try:
        sweep = table1_sweep(full=args.full, quick=args.quick, methods=args.methods, splits=args.splits,
                             seeds=args.seeds, datasets=args.datasets, data_root=args.data_root,
                             rounds=args.rounds, overrides=dict(args.overrides))
    except REFUSED as exc:
        return refuse(command, exc)
    methods = list(sweep.cases["method"])
    began = time.perf_counter()

    def report(out_dir: Path, status: int) -> int:
        started = [e["name"] for e in read_entries(out_dir) if e.get("action") in ("started", "resumed")]
        return _table(command, sweep, out_dir, args, methods, status, (started, time.perf_counter() - began))

    status = execute_sweep(command, sweep, args, report=report)
    return _dry_time(sweep, args, args.out) if args.dry_run and status == 0 else status


def _gpu_figure(args: argparse.Namespace):
    from dfl.report.paper_table import read_gpu_figure

    paths = args.gpu_report if args.gpu_report is not None else sorted(Path().glob(GPU_REPORTS))
    return read_gpu_figure(paths)


def _planned(sweep) -> list[dict]:
    return [p.config.to_dict() for p in sweep.plan()]


def _dry_time(sweep, args: argparse.Namespace, out: str | Path | None) -> int:
    """--dry-run: the time the table takes, from the runs under `out` so far (none: not measured), writing nothing."""
    from dfl.report import find_run_dirs, load_runs
    from dfl.report.paper_table import expected_time, run_seconds

    parallel = sweep.parallel if args.parallel is None else args.parallel
    out = Path(out) if out is not None else None  # without --out the sweep would start in a new directory
    runs = load_runs(out) if out is not None and out.is_dir() and find_run_dirs(out) else []
    seconds = run_seconds(out, runs) if out is not None else {}
    print("\n".join(expected_time(_planned(sweep), runs, parallel, _gpu_figure(args), seconds)))
    return 0


def _table(command: str, sweep, out: Path, args: argparse.Namespace, methods: list[str], status: int,
           invocation: tuple[list[str], float]) -> int:
    """Write OUT/report/table1.md and table1.csv and print the table; `status`, or 1 if the report failed."""
    if args.no_report:
        return status
    try:
        from dfl.report.paper_table import write_paper_table

        parallel = sweep.parallel if args.parallel is None else args.parallel
        with warnings.catch_warnings(record=True) as caught:  # e.g. a run's unreadable file: one line naming it
            warnings.simplefilter("always")
            files = write_paper_table(out, methods=methods, seeds=len(sweep.vary["seed"]), planned=_planned(sweep),
                                      parallel=parallel, gpu=_gpu_figure(args), invocation=invocation,
                                      title=f"DFedSAM Table 1 ({sweep.name})")
    except (*REFUSED, OSError) as exc:
        print(f"dfl {command}: error: writing the report failed: {exc}", file=sys.stderr)
        return 1
    for message in dict.fromkeys(str(w.message) for w in caught):
        print(f"dfl {command}: warning: {message}", file=sys.stderr)
    print(files["table1.md"].read_text())
    print(f"report: {', '.join(str(p) for p in files.values())}")
    return status
