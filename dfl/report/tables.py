"""The report's tables: Markdown cells and tables, and the CSV files.

Markdown cells (`format_stat`) and tables (`metric_table`), and the CSV files (settings.csv, runs.csv).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from dfl.engine.results import human_bytes
from dfl.files import atomic_write_text
from dfl.report.layout import Layout, format_value
from dfl.report.metrics import CSV_METRICS, run_metrics, run_target
from dfl.report.runs import RunRecord
from dfl.report.settings import Setting, Stat

NOT_COMPLETED_MARK = "†"


def _num(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def format_stat(stat: Stat, kind: str, n_runs: int | None = None) -> str:
    """One table cell.

    "71.00 ± 1.41" (pct: fractions shown in %), "3.20e-04 ± 1.1e-05" (sci), "7.9 MiB" (bytes), rounds "40 ± 5" and
    "(k/n)" when only k of the n seeds reached the target; "—" for no value.
    """
    if stat.mean is None:
        return "—"
    if kind == "pct":
        text = _num(100 * stat.mean, 2) + ("" if stat.std is None else " ± " + _num(100 * stat.std, 2))
    elif kind == "sci":
        text = f"{stat.mean:.2e}" + ("" if stat.std is None else f" ± {stat.std:.1e}")
    elif kind == "bytes":
        text = human_bytes(stat.mean) + ("" if not stat.std else " ± " + human_bytes(stat.std))
    elif kind == "rounds":
        mean = f"{stat.mean:.0f}" if stat.mean == int(stat.mean) else f"{stat.mean:.1f}"
        text = mean + ("" if stat.std is None else f" ± {stat.std:.1f}")
        if n_runs is not None and stat.n < n_runs:
            text += f" ({stat.n}/{n_runs})"
    else:
        raise ValueError(f"kind must be one of pct, sci, bytes, rounds; got {kind!r}")
    return text


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of `header` and `rows` (cells escaped for Markdown)."""
    lines = ["| " + " | ".join(_md_escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def metric_table(layout: Layout, metric: str, kind: str) -> str:
    """Rows × columns of one metric.

    "n/a" where a combination was not run, "†" on settings with runs that are not completed.
    """
    body = []
    for rk in layout.row_keys:
        row = [layout.row_label(rk)]
        for ck in layout.col_keys:
            s = layout.cells.get((rk, ck))
            if s is None:
                row.append("n/a")
                continue
            cell = format_stat(s.stats[metric], kind, n_runs=len(s.runs))
            row.append(cell if s.completed else f"{cell} {NOT_COMPLETED_MARK}")
        body.append(row)
    return markdown_table([layout.corner, *(layout.col_label(ck) for ck in layout.col_keys)], body)


def seed_table(layout: Layout) -> str:
    """Rows × columns of the number of seeds of each setting ("n/a" where a combination was not run)."""
    body = [[layout.row_label(rk), *(str(len(layout.cells[(rk, ck)].runs)) if (rk, ck) in layout.cells else "n/a"
                                     for ck in layout.col_keys)] for rk in layout.row_keys]
    return markdown_table([layout.corner, *(layout.col_label(ck) for ck in layout.col_keys)], body)


# ---------------------------------------------------------------------------------------------- CSV
def _csv_value(value: Any) -> Any:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, (dict, list)):
        return format_value(value)
    return value


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    """Write `header` and `rows` as the CSV file `path` (atomically; floats unrounded, None empty); returns `path`."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[_csv_value(v) for v in row] for row in rows])
    atomic_write_text(path, buf.getvalue())
    return path


def status_counts(runs: list[RunRecord]) -> str:
    """The statuses of `runs` and their counts, e.g. "completed:3;failed:1"."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    return ";".join(f"{k}:{v}" for k, v in counts.items())


def write_settings_csv(path: Path, layout: Layout, settings: list[Setting], target: float | None,
                       own_targets: bool = False) -> Path:
    """Write settings.csv: one row per setting; returns `path`.

    Its label, the layout fields, n, statuses, target (its runs' targets, ";"-joined when they differ), then
    <metric>_mean/_std/_n.
    """
    names = [*layout.rows, *layout.cols]
    header = ["setting", *names, "runs", "seeds", "status", "target_acc"]
    for m in CSV_METRICS:
        header += [f"{m}_mean", f"{m}_std", f"{m}_n"]
    rows = []
    for rk in layout.row_keys:
        for ck in layout.col_keys:
            s = layout.cells.get((rk, ck))
            if s is None:
                continue
            seeds = ";".join(str(r.seed) for r in s.runs)
            targets = list(dict.fromkeys(run_target(r, target, own_targets) for r in s.runs))
            row = [f"{layout.row_label(rk)} | {layout.col_label(ck)}", *(s.values[n] for n in names),
                   len(s.runs), seeds, status_counts(s.runs),
                   targets[0] if len(targets) == 1 else ";".join(map(str, targets))]
            for m in CSV_METRICS:
                st = s.stats[m]
                row += [st.mean, st.std, st.n]
            rows.append(row)
    return write_csv(path, header, rows)


def write_runs_csv(path: Path, runs: list[RunRecord], target: float | None, fields_: list[str],
                   own_targets: bool = False) -> Path:
    """Write runs.csv: one row per run, in discovery order; returns `path`.

    Its directory, the layout fields, seed, status, its target, final metrics.
    """
    header = ["run", *fields_, "seed", "status", "rounds_completed", "rounds", "target_acc", *CSV_METRICS,
              "problems", "error"]
    rows = []
    for r in runs:
        own = run_target(r, target, own_targets)
        m = run_metrics(r, own)
        rows.append([r.name, *(r.config.get(f) for f in fields_), r.seed, r.status,
                     r.summary.get("rounds_completed"), r.summary.get("rounds"), own,
                     *(m[k] for k in CSV_METRICS), "; ".join(r.problems), r.summary.get("error")])
    return write_csv(path, header, rows)
