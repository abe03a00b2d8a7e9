"""The runs and the command of a study script: each run made into its own folder once and read back when the script
runs again (`run_or_read`), and the command that runs them and writes the report (`study_main`).

Shared by benchmarks/privacy_study.py, benchmarks/byzantine_study.py and benchmarks/topology_study.py
(benchmarks/heterogeneity_study.py runs its grid as a `dfl sweep` and writes its own report).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.heterogeneity_study import Comparison, verdict

FINISHED = ("completed", "diverged")  # a run in one of these states is read back, not run again


def run_or_read(config, run_dir: Path) -> dict:
    """The summary of `config`'s run in `run_dir`: read back when it finished there, else run now (and say so).

    A run that diverges is a result, not an error (its summary says "diverged"; the studies list it and never average
    it in); one line per run made: its name, status, test accuracy and wall time.
    """
    import dfl
    from dfl.errors import DivergenceError

    summary_file = run_dir / "summary.json"
    if summary_file.exists() and json.loads(summary_file.read_text()).get("status") in FINISHED:
        return json.loads(summary_file.read_text())
    try:
        summary = dfl.run(config, out=run_dir, overwrite=True).summary
    except DivergenceError:
        summary = json.loads(summary_file.read_text())
    print(f"{run_dir.name}: {summary['status']} {summary.get('test_acc', float('nan')):.4f} "
          f"({summary.get('wall_seconds', float('nan')):.1f} s)", flush=True)
    return summary


def expectation_table(found: list[tuple[str, str, list[Comparison]]]) -> str:
    """Each expectation's verdict, then its comparisons (mean difference, 95% interval, seeds above 0, threshold)."""
    lines = ["| | expectation | verdict |", "|---|---|---|"]
    lines += [f"| {key} | {text} | **{verdict(comps)}** |" for key, text, comps in found]
    lines += ["", "| comparison | mean | 95% interval | seeds > 0 | expected | verdict |", "|---|---|---|---|---|---|"]
    lines += [c.row() for _, _, comps in found for c in comps]
    return "\n".join(lines) + "\n"


@dataclass
class Study:
    """What a study script tells `study_main`: its runs, its tables, its report's name and title.

    Attributes:
        doc: the script's docstring, its `--help`.
        name: the report in the runs folder is OUT/NAME.md.
        title: the report's first line, without the "# ".
        quick_help: what `--quick` runs (the tiny version for CI).
        run_all: (out, quick) -> one record a run (finished runs read back).
        tables: (records, quick) -> the Markdown tables of the results.
        expectations: records -> the pre-registered expectations with their comparisons; None: the study has none,
            and its report says neither how many runs nor how long they took.
        figure: (records, path, quick) -> None: draws the figure `--figure PATH` asks for; None: no `--figure`.
        figure_help: `--figure`'s help line.
    """
    doc: str
    name: str
    title: str
    quick_help: str
    run_all: Callable[[Path, bool], list[dict]]
    tables: Callable[[list[dict], bool], str]
    expectations: Callable[[list[dict]], list[tuple[str, str, list[Comparison]]]] | None = None
    figure: Callable[[list[dict], Path, bool], None] | None = None
    figure_help: str = ""


def study_main(study: Study, argv: list[str] | None = None) -> int:
    """A study script's command: run (or read back) every run, print the tables, write the report and the results.

    The report (the tables, then the pre-registered expectations' verdicts) goes to OUT/NAME.md and, with
    `--results PREFIX`, to PREFIX.md beside PREFIX.json (the records, the expectations, the seconds taken).
    """
    p = argparse.ArgumentParser(description=study.doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder of the runs (rerunning reads finished runs back)")
    p.add_argument("--results", default=None, help="write RESULTS.md and RESULTS.json (e.g. benchmarks/results/...)")
    if study.figure is not None:
        p.add_argument("--figure", default=None, help=study.figure_help)
    p.add_argument("--quick", action="store_true", help=study.quick_help)
    args = p.parse_args(argv)
    out = Path(args.out)
    tic = time.perf_counter()
    records = study.run_all(out, args.quick)
    text = study.tables(records, args.quick)
    found = study.expectations(records) if study.expectations is not None else None
    if found is not None:
        text = f"{text}\n## Pre-registered expectations\n\n{expectation_table(found)}"
    print(text)
    seconds = time.perf_counter() - tic
    runs = (f"{len(records)} runs, {seconds / 60:.1f} min on {platform.machine()} ({platform.node()}).\n\n"
            if found is not None else "")
    report = f"# {study.title}\n\n{runs}{text}"
    (out / f"{study.name}.md").write_text(report)
    if study.figure is not None and args.figure:
        study.figure(records, Path(args.figure), args.quick)
    if args.results:
        results = Path(args.results)
        results.parent.mkdir(parents=True, exist_ok=True)
        results.with_suffix(".md").write_text(report)
        verdicts = {} if found is None else {"expectations": [
            {"key": k, "text": t, "verdict": verdict(c), "comparisons": [x.to_dict() for x in c]} for k, t, c in found]}
        results.with_suffix(".json").write_text(json.dumps(
            {"records": records, **verdicts, "seconds": seconds, "quick": args.quick}, indent=1))
    return 0
