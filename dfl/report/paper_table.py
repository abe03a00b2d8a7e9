"""A results table in the layout of the DFedSAM paper's Table 1, and the time a sweep of them takes.

Rows are methods (algorithms), columns are data splits, each split's cell three numbers: train accuracy, test
accuracy and their gap (train − test), each mean ± sample standard deviation over the seeds (the gap taken per seed,
then averaged). One table per dataset. Which metric a cell is, is a choice (`TableMetrics`): by default the
personalized pair every method has, each client's own model on its own training data (`personal_train_acc_mean`,
from `personal_train_eval`) and on its own local test set (`personal_acc_mean`, from `local_test_fraction`); the
averaged model on a training subset and on the test set (`train_acc`, `test_acc`) is the second table.

`write_paper_table(PATH)` writes `table1.md` (the tables, the runs not completed, the time), `table1.csv` (one
row per dataset, method and split) and `table1_runs.csv` (one row per run) into PATH/report/. `expected_time`
says how long a sweep takes on this machine from its finished runs' measured wall time, and on one GPU from
`benchmarks/gpu_check.py`'s throughput figure when one has been measured.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfl.errors import FileReadError
from dfl.files import read_json
from dfl.report.document import ReportDocument
from dfl.report.metrics import as_number
from dfl.report.runs import RunRecord, sweep_entries
from dfl.report.settings import Stat
from dfl.report.tables import NOT_COMPLETED_MARK, markdown_table, write_csv


@dataclass(frozen=True)
class TableMetrics:
    """Which final metrics are a cell's train and test accuracy, and what the table calls them."""

    train: str
    test: str
    title: str
    description: str


PERSONAL = TableMetrics(
    "personal_train_acc_mean", "personal_acc_mean", "each client's own model (personalized)",
    "Train: each client's own model on its own training data (`personal_train_acc_mean`); test: each client's own "
    "model on its own local test set (`personal_acc_mean`); both means over clients, after the last round's "
    "gossip (or the server's broadcast, where every client holds the averaged model).")
AVERAGED = TableMetrics(
    "train_acc", "test_acc", "the averaged model",
    "Train: the averaged model x̄ on a fixed subset of the pooled training data (`train_acc`, `train_eval_samples`); "
    "test: x̄ on the test set (`test_acc`). For a personalized method (DisPFL) x̄ is not the model it deploys.")


@dataclass
class Cell:
    """One method × split × dataset: its runs and the statistics of train, test and gap over their seeds."""

    runs: list[RunRecord]
    train: Stat
    test: Stat
    gap: Stat

    @property
    def completed(self) -> bool:
        """Every run finished (completed, or stopped on purpose)."""
        return all(r.finished for r in self.runs)


def split_of(config: dict[str, Any]) -> tuple[tuple[Any, ...], str]:
    """(sort key, label) of a run's data split: "Dirichlet 0.3", "Pathological 2", "IID", or the partition's name.

    Dirichlet by alpha, then pathological by classes per client, then IID, then the others by name.
    """
    partition = config.get("partition")
    options = config.get("partition_options") or {}
    if partition == "dirichlet":
        alpha = options.get("alpha", config.get("alpha"))
        alpha = 0.3 if alpha is None else alpha
        return (0, float(alpha), ""), f"Dirichlet {alpha:g}"
    if partition in ("pathological", "shards"):
        k = int(options.get("classes_per_client", 2))
        return (1 if partition == "pathological" else 2, k, ""), f"{partition.capitalize()} {k}"
    if partition == "iid":
        return (3, 0, ""), "IID"
    extra = ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
    return (4, 0, f"{partition}{extra}"), f"{partition} ({extra})" if extra else str(partition)


def cells(runs: Iterable[RunRecord], metrics: TableMetrics) -> dict[tuple[str, str, str], Cell]:
    """(dataset, algorithm, split label) -> its `Cell`, over the runs with metrics."""
    grouped: dict[tuple[str, str, str], list[RunRecord]] = {}
    for run in runs:
        if run.metrics:
            key = (str(run.config.get("dataset")), str(run.config.get("algorithm")), split_of(run.config)[1])
            grouped.setdefault(key, []).append(run)
    out = {}
    for key, group in grouped.items():
        train = [as_number((r.final or {}).get(metrics.train)) for r in group]
        test = [as_number((r.final or {}).get(metrics.test)) for r in group]
        gap = [a - b if a is not None and b is not None else None for a, b in zip(train, test)]
        out[key] = Cell(group, Stat.of(train), Stat.of(test), Stat.of(gap))
    return out


def _pct(stat: Stat) -> str:
    if stat.mean is None:
        return "—"
    return f"{100 * stat.mean:.2f}" + ("" if stat.std is None else f" ± {100 * stat.std:.2f}")


def paper_tables(runs: list[RunRecord], metrics: TableMetrics = PERSONAL, methods: list[str] | None = None,
                 seeds: int | None = None) -> dict[str, str]:
    """Dataset -> the Markdown table of `metrics`: a row per method, train / test / gap per split.

    Rows in the order of `methods` (default: as found), methods in `methods` without runs as "not run" rows;
    columns by `split_of`. "(n=k)" marks a cell with fewer than `seeds` finite values (default: the most of any
    cell), "†" one with runs not completed, "—" one without the metric.
    """
    table = cells(runs, metrics)
    seeds = seeds or max((len(c.runs) for c in table.values()), default=0)
    splits = sorted({(split_of(r.config)) for r in runs if r.metrics}, key=lambda s: s[0])
    labels = list(dict.fromkeys(label for _, label in splits))
    out = {}
    for dataset in dict.fromkeys(key[0] for key in table):
        found = list(dict.fromkeys(key[1] for key in table if key[0] == dataset))
        rows = [m for m in (methods or found)] + [m for m in found if methods and m not in methods]
        header = ["method"] + [f"{split} {part}" for split in labels for part in ("train", "test", "gap")]
        body = []
        for method in rows:
            row = [method]
            for split in labels:
                cell = table.get((dataset, method, split))
                if cell is None:
                    row += ["not run"] * 3
                    continue
                marks = ("" if cell.test.n >= seeds else f" (n={cell.test.n})") + \
                    ("" if cell.completed else f" {NOT_COMPLETED_MARK}")
                row += [_pct(cell.train) + marks, _pct(cell.test) + marks, _pct(cell.gap) + marks]
            body.append(row)
        out[dataset] = markdown_table(header, body)
    return out


def write_paper_table(path: str | Path, out: str | Path | None = None, *, methods: list[str] | None = None,
                      seeds: int | None = None, title: str = "Table 1 of the DFedSAM paper",
                      planned: list[dict[str, Any]] | None = None, parallel: int = 1,
                      gpu: dict[str, Any] | None = None,
                      invocation: tuple[list[str], float] | None = None) -> dict[str, Path]:
    """Write table1.md and table1.csv of the runs under `path` into `out` (default PATH/report/).

    Args:
        path: a sweep directory (or any directory holding run directories).
        out: the report directory.
        methods: the row order (algorithm names); methods without runs get a "not run" row.
        seeds: the seeds a complete cell has (fewer are marked "(n=k)").
        title: the document's title.
        planned: the configs (as dicts) of every run of the sweep: adds the Time section (`expected_time`).
        parallel: the runs at once, for the Time section.
        gpu: a GPU throughput figure (`read_gpu_figure`) for the Time section's projection.
        invocation: the runs the command just started and its elapsed seconds, for the Time section.

    Returns:
        Name -> written file.
    """
    doc = ReportDocument.open(path, out, title)
    time_lines = None if planned is None else expected_time(planned, doc.runs, parallel, gpu,
                                                            run_seconds(path, doc.runs), invocation)
    for metrics in (PERSONAL, AVERAGED):
        doc.add(f"## Accuracy (%) of {metrics.title}\n\n{metrics.description} Mean ± sample standard deviation over "
                "the seeds; gap = train − test, per seed.\n")
        for dataset, table in paper_tables(doc.runs, metrics, methods, seeds).items():
            doc.add(f"### {dataset}\n\n{table}\n")
    if not any(r.metrics for r in doc.runs):
        doc.add(f"{len(doc.runs)} run(s), none with metrics yet.\n")
    doc.add_not_completed_mark()
    doc.add_not_completed()
    if time_lines:
        doc.add("## Time\n\n" + "\n".join(time_lines) + "\n")
    doc.write("table1.md")
    doc.add_file("table1.csv", _write_csv(doc.out_dir / "table1.csv", doc.runs))
    doc.add_file("table1_runs.csv", _write_runs_csv(doc.out_dir / "table1_runs.csv", doc.runs))
    return doc.written()


def _write_csv(path: Path, runs: list[RunRecord]) -> Path:
    """One row per dataset, method and split: n, statuses, then mean and sd of train, test, gap of both tables."""
    personal, averaged = cells(runs, PERSONAL), cells(runs, AVERAGED)
    header = ["dataset", "method", "split", "runs", "completed"]
    for prefix in ("", "averaged_"):
        for part in ("train", "test", "gap"):
            header += [f"{prefix}{part}_mean", f"{prefix}{part}_sd", f"{prefix}{part}_n"]
    rows = []
    order = {label: key for key, label in (split_of(r.config) for r in runs)}
    for key in sorted(personal, key=lambda k: (k[0], k[1], order.get(k[2], ()))):
        row = [*key, len(personal[key].runs), personal[key].completed]
        for cell in (personal[key], averaged[key]):
            for stat in (cell.train, cell.test, cell.gap):
                row += [stat.mean, stat.std, stat.n]
        rows.append(row)
    return write_csv(path, header, rows)


def _write_runs_csv(path: Path, runs: list[RunRecord]) -> Path:
    """One row per run: dataset, method, split, seed, status, both tables' final train and test, its wall time."""
    header = ["dataset", "method", "split", "seed", "status", "train", "test", "averaged_train", "averaged_test",
              "rounds_completed", "wall_seconds", "run"]
    rows = []
    for run in sorted(runs, key=lambda r: (str(r.config.get("dataset")), str(r.config.get("algorithm")),
                                           split_of(r.config)[0], r.seed)):
        final = run.final or {}
        rows.append([run.config.get("dataset"), run.config.get("algorithm"), split_of(run.config)[1], run.seed,
                     run.status, *(as_number(final.get(k)) for k in (PERSONAL.train, PERSONAL.test, AVERAGED.train,
                                                                        AVERAGED.test)),
                     run.summary.get("rounds_completed"), as_number(run.summary.get("wall_seconds")), run.name])
    return write_csv(path, header, rows)


# ---------------------------------------------------------------------------------------------- time
def gpu_throughput(report: str | Path) -> dict[str, Any] | None:
    """The fp32 throughput figure of a `benchmarks/gpu_check.py` report (gpu_report.json), or None.

    None when the file has no passed fp32 throughput step (a CPU dry run, a failed step). The figure: SAM client-steps
    per second of the dfl engine, with the model, batch size and device it was measured on.
    """
    data = read_json(Path(report), "GPU check report")
    if not isinstance(data, dict) or data.get("device") != "cuda":
        return None
    for step in data.get("steps", []):
        record = (step.get("data") or {}).get("record") or {}
        rate = as_number(((record.get("loops") or {}).get("dfl engine") or {}).get("client_steps_per_s"))
        if step.get("key") == "fp32" and step.get("status") == "ok" and rate:
            return {"client_steps_per_s": float(rate), "model": record.get("model"),
                    "batch_size": record.get("batch_size"), "device_name": record.get("device_name"),
                    "file": str(report)}
    return None


def sam_steps(config: dict[str, Any], train_samples: int) -> float:
    """A run's local work in SAM-step units of its batch: client-steps × (1 for SAM, ½ for a plain step).

    Clients per round (all for a decentralized method, `participation` × m for a centralized one), steps per round
    (`local_steps`, or `local_epochs` × ⌈n_i / batch⌉ with n_i = the client's training share) and rounds.
    """
    clients = int(config.get("clients") or 1)
    share = train_samples / clients * (1 - float(config.get("local_test_fraction") or 0))
    batch = int(config.get("batch_size") or 0) or max(1, int(share))
    steps = config.get("local_steps") or (config.get("local_epochs") or 1) * math.ceil(share / batch)
    active = clients * float(config.get("participation") or 1.0)
    sam = 1.0 if (config.get("rho") or 0) > 0 else 0.5
    return active * steps * int(config.get("rounds") or 0) * sam


def run_seconds(path: str | Path, runs: list[RunRecord]) -> dict[str, float]:
    """Run name -> its measured seconds, finished runs only.

    The sweep's (sweep.json `seconds`: the run in its worker, set-up included), else the run's own `wall_seconds`.
    """
    entries = {str(e.get("name")): as_number(e.get("seconds")) for e in sweep_entries(Path(path))}
    out = {}
    for run in runs:
        name = str(run.config.get("name"))
        seconds = entries.get(name) or as_number(run.summary.get("wall_seconds"))
        if run.finished and seconds:
            out[name] = float(seconds)
    return out


def expected_time(planned: list[dict[str, Any]], runs: list[RunRecord], parallel: int,
                  gpu: dict[str, Any] | None, seconds: dict[str, float] | None = None,
                  invocation: tuple[list[str], float] | None = None) -> list[str]:
    """Markdown lines: the time the `planned` runs (configs) take here and on one GPU.

    Here: each finished run's measured seconds (`seconds`, default `run_seconds` without a sweep: the runs' own wall
    time); the others get the mean measured seconds per round of the finished runs of their algorithm (else of all
    finished runs, said so) times their rounds; plus, when `invocation` (the runs this command started, its elapsed
    seconds) measured it, the start of each run's worker process: elapsed × workers − the started runs' seconds, per
    run. The sum over `parallel` workers. On one GPU: `sam_steps` of every run over `gpu`'s client-steps per second,
    scaled by batch size / the measured batch (a projection from one model's throughput, evaluation not counted); or
    "no GPU measurement yet".
    """
    if seconds is None:
        seconds = {str(r.config.get("name")): float(r.summary["wall_seconds"]) for r in runs
                   if r.finished and as_number(r.summary.get("wall_seconds"))}
    measured: dict[str, list[float]] = {}
    for run in runs:
        done_rounds = as_number(run.summary.get("rounds_completed"))
        spent = seconds.get(str(run.config.get("name")))
        if spent and done_rounds:
            measured.setdefault(str(run.config.get("algorithm")), []).append(spent / done_rounds)
    everyone = [v for values in measured.values() for v in values]
    total, guessed, done_seconds, done = 0.0, set(), 0.0, 0
    for config in planned:
        spent = seconds.get(str(config.get("name")))
        if spent:
            done, done_seconds, total = done + 1, done_seconds + spent, total + spent
            continue
        per_round = measured.get(str(config.get("algorithm"))) or everyone
        if not per_round:
            total = math.nan
            break
        if not measured.get(str(config.get("algorithm"))):
            guessed.add(str(config.get("algorithm")))
        total += sum(per_round) / len(per_round) * int(config.get("rounds") or 0)
    start = None
    if invocation is not None and invocation[0] and parallel > 1:
        started, elapsed = invocation
        inside = sum(seconds.get(name, 0.0) for name in started)
        start = max(0.0, elapsed * min(parallel, len(started)) - inside) / len(started)
    host = f"{platform.node() or 'this machine'} ({os.cpu_count()} cores, {platform.machine()})"
    lines = [f"- Runs: {len(planned)}; {done} finished, whose measured time adds up to {done_seconds / 60:.1f} min "
             "(each run in its worker, set-up included)."]
    if invocation is not None and invocation[0]:
        lines.append(f"- This invocation ran {len(invocation[0])} of them in {invocation[1] / 60:.1f} min, "
                     f"{parallel} at once" + ("" if start is None else f": {start:.1f} s per run went to starting its "
                                              "worker process (elapsed x workers - the runs' time)") + ".")
    if math.isnan(total):
        lines.append(f"- Expected on {host}: not measured yet (no finished run); the first runs' times give it.")
    else:
        note = f"; {', '.join(sorted(guessed))} from the other methods' time per round" if guessed else ""
        starts = "" if parallel == 1 else " + the workers' start" + (
            " (not measured by this invocation)" if start is None else f", {start:.1f} s a run")
        total += (start or 0.0) * len(planned)
        lines.append(f"- Expected on {host}: {total / 60 / parallel:.1f} min for the whole table (the runs' measured "
                     f"time{note}{starts}, over {parallel} worker(s); on a machine other jobs may share).")
        if 0 < done < len(planned):
            left = (total - done_seconds - (start or 0.0) * done) / 60 / parallel
            lines.append(f"- Still to run: {len(planned) - done} runs, about {left:.1f} min.")
    if gpu is None:
        lines.append("- Projected on one GPU: no GPU measurement yet (benchmarks/gpu_check.py's throughput step has "
                     "not run on a GPU).")
        return lines
    work = sum(sam_steps(c, _train_samples(c)) * int(c.get("batch_size") or 1) for c in planned)
    gpu_seconds = work / (gpu["client_steps_per_s"] * int(gpu["batch_size"] or 1))
    lines.append(f"- Projected on one GPU ({gpu['device_name']}): {gpu_seconds / 3600:.1f} h of local training, from "
                 f"{gpu['client_steps_per_s']:.0f} SAM client-steps/s of {gpu['model']} at batch {gpu['batch_size']} "
                 f"({gpu['file']}), scaled by each run's batch and model-agnostic (evaluation not counted).")
    return lines


def _train_samples(config: dict[str, Any]) -> int:
    """The training set size of a run's dataset, from its card (0 when the card does not say)."""
    from dfl.data.dataset import data_shape

    try:
        shape = data_shape(str(config.get("dataset")), dict(config.get("dataset_options") or {}))
    except (ValueError, KeyError):
        return 0
    return shape.train if shape is not None else 0


def read_gpu_figure(paths: Iterable[str | Path]) -> dict[str, Any] | None:
    """The first GPU throughput figure among `paths` (`gpu_throughput`); unreadable files are skipped."""
    for path in paths:
        try:
            figure = gpu_throughput(path)
        except FileReadError:
            continue
        if figure is not None:
            return figure
    return None
