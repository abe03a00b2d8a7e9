"""Reports over run directories: tables in the layout of the papers' tables, CSV files and plots.

`write_report(PATH)` finds every run directory under PATH (a directory holding `summary.json` and
`config.toml`; PATH itself may be one), groups the runs into *settings* (the config without `seed`, `name`
and the fields that only change how a run executes or what it records, `NOT_SETTING_FIELDS`), aggregates
each setting over its seeds (mean ± sample standard deviation, n − 1 in the denominator) and writes

    report.md      one Markdown table per metric: rows = algorithm, columns = the other varied field(s)
    settings.csv   one row per setting: every aggregated metric as <metric>_mean, <metric>_std, <metric>_n
    runs.csv       one row per run (status, final metrics, rounds to the target accuracy, λ, λ^Q)
    plots/         accuracy.png, consensus.png (vs round), spectral_gap.png (final accuracy vs 1 − λ^Q),
                   client_accuracy.png (per-client accuracy of the final models)

The metrics of a run come from the last record of its `metrics.jsonl` ("final"): test accuracy of the
averaged model, best test accuracy over the evaluated rounds, the generalization gap train_acc − test_acc
(train_acc is measured on a fixed training subset), the consensus distance (1/m)Σ‖x_i − x̄‖², total bytes
sent, and the rounds to reach a target accuracy: the first evaluated round with test_acc ≥ target. The
default target is 0.9 × the lowest mean final accuracy over the settings, so that every setting reaches it
and the column compares speed on a common bar.

Runs that are not completed (running or interrupted, failed, diverged) are aggregated with the others,
their cells marked "†" and the runs listed under "Runs not completed"; a run without metrics is listed and
left out of the tables. `write_spectral_report(PATH)` writes the spectral-gap study (λ, 1 − λ^Q,
Φ(λ, m, Q), effective neighbours against final accuracy and consensus distance).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from dfl import plots
from dfl.config import Config
from dfl.results import human_bytes, read_metrics

CONFIG_FIELDS = tuple(f.name for f in fields(Config))
# Fields that do not change what a run computes, only how it executes or what it records: runs differing in
# them (and in `seed`) belong to one setting.
NOT_SETTING_FIELDS = (
    "name", "seed", "progress", "device", "backend", "gossip_mode", "client_chunk", "eval_batch_size",
    "dist_timeout", "data_root", "checkpoint_every", "eval_every", "train_eval_samples", "hessian_every",
    "hessian_samples", "hessian_iters",
)
SETTING_FIELDS = tuple(f for f in CONFIG_FIELDS if f not in NOT_SETTING_FIELDS)
# Fields that set the spectral gap: a spectral-gap trend is fitted across them, within each combination of
# the other varied fields.
GAP_FIELDS = ("topology", "weights", "topology_options", "gossip_steps", "clients")
DEFAULT_TARGET_FRACTION = 0.9
NOT_COMPLETED_MARK = "†"
REPORT_DIR = "report"
EXACT_AVERAGING = 1e-12  # λ^Q below this is exact averaging (topologies.spectral.ROUNDOFF)


class ReportError(ValueError):
    """Nothing to report on, or a bad report option; the message names the argument and the allowed values."""


# ---------------------------------------------------------------------------------------------- loading
@dataclass
class RunRecord:
    """One run directory as found on disk; `problems` lists what could not be read."""

    path: Path
    name: str  # path relative to the report root ("." for the root itself)
    config: dict[str, Any]  # Config defaults updated by config.toml
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    problems: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.summary.get("status", "unknown"))

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def final(self) -> dict[str, Any] | None:
        return self.metrics[-1] if self.metrics else None


def is_run_dir(path: Path) -> bool:
    return (path / "summary.json").is_file() and (path / "config.toml").is_file()


def find_run_dirs(path: str | Path, skip: Iterable[Path] = ()) -> list[Path]:
    """PATH itself when it is a run directory, else every run directory below it (not below `skip`, nor
    below a `report/` directory). Runs listed in PATH/sweep.json come first, in the sweep's order."""
    root = Path(path)
    if not root.exists():
        raise ReportError(f"path {root} does not exist")
    if is_run_dir(root):
        return [root]
    if not root.is_dir():
        raise ReportError(f"path {root} is neither a run directory nor a directory holding run directories")
    skipped = {p.resolve() for p in skip}
    found: list[Path] = []
    for dirpath, dirnames, _ in os.walk(root):
        here = Path(dirpath)
        if is_run_dir(here):
            found.append(here)
            dirnames[:] = []
            continue
        dirnames[:] = sorted(
            d for d in dirnames
            if not d.startswith(".") and d != REPORT_DIR and (here / d).resolve() not in skipped
        )
    order = {(root / entry["dir"]).resolve(): i for i, entry in enumerate(_sweep_entries(root)) if "dir" in entry}
    return sorted(found, key=lambda p: (order.get(p.resolve(), len(order)), str(p)))


def _sweep_entries(root: Path) -> list[dict[str, Any]]:
    try:
        runs = json.loads((root / "sweep.json").read_text()).get("runs", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [e for e in runs if isinstance(e, dict)]


def load_run(path: str | Path, root: str | Path | None = None) -> RunRecord:
    """Read config.toml, summary.json and metrics.jsonl; unreadable files become `problems`, never errors."""
    path = Path(path)
    name = os.path.relpath(path, root) if root is not None else "."
    if name == ".":
        name = path.resolve().name
    problems: list[str] = []
    config = Config().to_dict()
    try:
        with (path / "config.toml").open("rb") as fh:
            config.update(tomllib.load(fh))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        problems.append(f"config.toml unreadable ({exc})")
    summary: dict[str, Any] = {}
    try:
        loaded = json.loads((path / "summary.json").read_text())
        summary = loaded if isinstance(loaded, dict) else {}
    except (OSError, ValueError) as exc:
        problems.append(f"summary.json unreadable ({exc})")
    metrics: list[dict[str, Any]] = []
    if (path / "metrics.jsonl").is_file():
        try:
            metrics = [m for m in read_metrics(path) if isinstance(m, dict) and "round" in m]
        except (OSError, ValueError) as exc:
            problems.append(f"metrics.jsonl unreadable ({exc})")
    if not metrics:
        problems.append("no metrics")
    return RunRecord(path=path, name=name, config=config, summary=summary, metrics=metrics, problems=problems)


def load_runs(path: str | Path, skip: Iterable[Path] = ()) -> list[RunRecord]:
    dirs = find_run_dirs(path, skip)
    if not dirs:
        raise ReportError(f"no run directories under {path} (a run directory holds summary.json and config.toml)")
    return [load_run(d, path) for d in dirs]


def missing_sweep_runs(root: str | Path, runs: list[RunRecord]) -> list[dict[str, Any]]:
    """sweep.json entries whose run directory holds no run (e.g. a run that failed before it started)."""
    root = Path(root)
    have = {r.path.resolve() for r in runs}
    return [e for e in _sweep_entries(root) if "dir" in e and (root / e["dir"]).resolve() not in have]


# ---------------------------------------------------------------------------------------------- per-run metrics
METRICS = (  # key, Markdown heading, cell format (see _format_cell)
    ("test_acc", "Final test accuracy (%)", "pct"),
    ("best_test_acc", "Best test accuracy (%)", "pct"),
    ("rounds_to_target", None, "rounds"),  # heading names the target
    ("gen_gap", "Generalization gap: train − test accuracy (percentage points)", "pct"),
    ("consensus_distance", "Final consensus distance (1/m)Σ‖x_i − x̄‖²", "sci"),
    ("bytes_sent_total", "Total bytes sent (all clients)", "bytes"),
    ("hessian_top_eig", "Top Hessian eigenvalue of the averaged model (last measurement; `hessian_every`)", "sci"),
)
OPTIONAL_METRICS = {"hessian_top_eig"}  # a table only when some run measured it
CSV_METRICS = (
    "test_acc", "best_test_acc", "rounds_to_target", "train_acc", "gen_gap", "test_loss", "train_loss",
    "client_acc_mean", "client_acc_std", "client_acc_min", "client_acc_max", "consensus_distance",
    "bytes_sent_total", "final_round", "lambda", "lambda_Q", "gossip_steps", "hessian_top_eig",
)


def _number(value: Any) -> float | None:
    """A finite number (ints stay ints), or None (missing, NaN, inf, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def rounds_to_target(metrics: list[dict[str, Any]], target: float | None) -> int | None:
    """The first evaluated round with test_acc >= target; None when never reached (or no target)."""
    if target is None:
        return None
    for record in metrics:
        acc = _number(record.get("test_acc"))
        if acc is not None and acc >= target:
            return int(record["round"])
    return None


def run_metrics(run: RunRecord, target: float | None) -> dict[str, float | None]:
    """The final-record metrics of one run; None where the run has no such value."""
    last = run.final or {}
    out = {k: _number(last.get(k)) for k in (
        "test_acc", "train_acc", "test_loss", "train_loss", "client_acc_mean", "client_acc_std",
        "client_acc_min", "client_acc_max", "consensus_distance", "bytes_sent_total",
    )}
    out["final_round"] = _number(last.get("round"))
    measured = [h for h in (_number(m.get("hessian_top_eig")) for m in run.metrics) if h is not None]
    out["hessian_top_eig"] = measured[-1] if measured else None
    accs = [a for a in (_number(m.get("test_acc")) for m in run.metrics) if a is not None]
    out["best_test_acc"] = max(accs) if accs else None
    gap = None
    if out["train_acc"] is not None and out["test_acc"] is not None:
        gap = out["train_acc"] - out["test_acc"]
    out["gen_gap"] = gap
    reached = rounds_to_target(run.metrics, target)
    out["rounds_to_target"] = reached
    for key in ("lambda", "lambda_Q", "gossip_steps"):
        out[key] = _number(run.summary.get(key))
    return out


# ---------------------------------------------------------------------------------------------- settings
def _canon(value: Any) -> str:
    """A hashable, order-free identity of a config value (dicts and lists included)."""
    return json.dumps(value, sort_keys=True, default=str)


@dataclass
class Stat:
    """mean ± std (sample std, n − 1; None when n < 2) over the n finite values."""

    mean: float | None
    std: float | None
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat:
        vals = [v for v in values if v is not None and math.isfinite(v)]
        if not vals:
            return cls(None, None, 0)
        mean = math.fsum(vals) / len(vals)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
        return cls(mean, std, len(vals))


@dataclass
class Setting:
    values: dict[str, Any]  # SETTING_FIELDS -> value
    runs: list[RunRecord]
    per_run: list[dict[str, float | None]] = field(default_factory=list)
    stats: dict[str, Stat] = field(default_factory=dict)

    @property
    def completed(self) -> bool:
        return all(r.status == "completed" for r in self.runs)

    def aggregate(self, target: float | None) -> None:
        self.per_run = [run_metrics(r, target) for r in self.runs]
        self.stats = {k: Stat.of(m[k] for m in self.per_run) for k in CSV_METRICS}


def group_settings(runs: list[RunRecord]) -> list[Setting]:
    """Runs with metrics, grouped by their setting (config minus NOT_SETTING_FIELDS), in order of appearance."""
    groups: dict[str, Setting] = {}
    for run in runs:
        if not run.metrics:
            continue
        values = {f: run.config.get(f) for f in SETTING_FIELDS}
        key = _canon(values)
        groups.setdefault(key, Setting(values, [])).runs.append(run)
    return list(groups.values())


def varying_fields(settings: list[Setting]) -> list[str]:
    return [f for f in SETTING_FIELDS if len({_canon(s.values[f]) for s in settings}) > 1]


def default_target(settings: list[Setting]) -> float | None:
    """DEFAULT_TARGET_FRACTION × the lowest mean final test accuracy over the settings (None if none > 0)."""
    means = []
    for s in settings:
        mean = Stat.of(_number((r.final or {}).get("test_acc")) for r in s.runs).mean
        if mean is not None and mean > 0:
            means.append(mean)
    return DEFAULT_TARGET_FRACTION * min(means) if means else None


def check_target(target: Any) -> float:
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise ReportError(f"target accuracy must be a fraction in (0, 1] (e.g. 0.8 for 80%), got {target!r}")
    return float(target)


# ---------------------------------------------------------------------------------------------- layout
def format_value(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={format_value(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def label(values: dict[str, Any], names: list[str]) -> str:
    """`value` for one field, `f1=v1, f2=v2` for several, "all" for none."""
    if not names:
        return "all"
    if len(names) == 1:
        return format_value(values[names[0]])
    return ", ".join(f"{n}={format_value(values[n])}" for n in names)


def _registry_order(name: str) -> tuple[str, ...]:
    """The canonical order of a categorical field's values (sparse to dense topologies, decentralized
    algorithms first, as in the papers' tables); empty for other fields."""
    if name == "topology":
        from topologies import NAMES

        return NAMES
    if name == "algorithm":
        from dfl.algorithms import ALGORITHMS

        return ALGORITHMS
    if name == "partition":
        from dfl.data import PARTITIONS

        return PARTITIONS
    return ()


def _sort_key(values: list[Any], name: str = "") -> Callable[[Any], Any]:
    """Numbers in numeric order (None last); topologies, algorithms and partitions in their registry order;
    anything else in order of first appearance."""
    numeric = all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values)
    if numeric:
        return lambda v: (v is None, v if v is not None else 0)
    registry = {v: i for i, v in enumerate(_registry_order(name))}
    first: dict[str, int] = {}
    for v in values:
        first.setdefault(_canon(v), len(first))
    return lambda v: (registry.get(v, len(registry)) if isinstance(v, str) else len(registry), first[_canon(v)])


def _order(settings: list[Setting], names: list[str]) -> list[tuple[str, ...]]:
    """The distinct value combinations of `names`, each field sorted by `_sort_key`, first field slowest."""
    keys = [tuple(_canon(s.values[n]) for n in names) for s in settings]
    sorters = [_sort_key([s.values[n] for s in settings], n) for n in names]
    by_key = {k: s for k, s in zip(keys, settings)}
    return sorted(by_key, key=lambda k: tuple(f(by_key[k].values[n]) for f, n in zip(sorters, names)))


@dataclass
class Layout:
    rows: list[str]
    cols: list[str]
    row_keys: list[tuple[str, ...]]
    col_keys: list[tuple[str, ...]]
    cells: dict[tuple[tuple[str, ...], tuple[str, ...]], Setting]

    def row_label(self, key: tuple[str, ...]) -> str:
        return label(dict(zip(self.rows, (json.loads(k) for k in key))), self.rows)

    def col_label(self, key: tuple[str, ...]) -> str:
        return label(dict(zip(self.cols, (json.loads(k) for k in key))), self.cols)

    @property
    def corner(self) -> str:
        return f"{', '.join(self.rows) or 'all'} \\ {', '.join(self.cols) or 'all'}"


def _field_list(text: str | list[str] | None, option: str) -> list[str] | None:
    if text is None:
        return None
    names = [t.strip() for t in text.split(",")] if isinstance(text, str) else list(text)
    names = [n for n in names if n]
    bad = [n for n in names if n not in SETTING_FIELDS]
    if bad or not names:
        raise ReportError(f"--{option}: unknown or non-setting field(s) {', '.join(bad) or repr(text)}; allowed: "
                          f"{', '.join(SETTING_FIELDS)}")
    return names


def make_layout(settings: list[Setting], rows: str | list[str] | None = None,
                cols: str | list[str] | None = None) -> Layout:
    """Rows = `rows` (default algorithm); columns = `cols` (default every other varied field). Varied fields
    named by neither are folded into the row label when `cols` is given, else into the column label."""
    row_names = _field_list(rows, "rows") or ["algorithm"]
    col_names = _field_list(cols, "cols")
    both = sorted(set(row_names) & set(col_names or []))
    if both:
        raise ReportError(f"--rows and --cols share field(s) {', '.join(both)}; a field is either rows or columns")
    varying = varying_fields(settings)
    if col_names is None:
        col_names = [f for f in varying if f not in row_names]
        if not col_names and "topology" not in row_names:
            col_names = ["topology"]  # nothing else varies: name the topology in the header
    else:
        row_names += [f for f in varying if f not in row_names and f not in col_names]
    row_keys, col_keys = _order(settings, row_names), _order(settings, col_names)
    cells = {}
    for s in settings:
        cells[(tuple(_canon(s.values[n]) for n in row_names), tuple(_canon(s.values[n]) for n in col_names))] = s
    return Layout(row_names, col_names, row_keys, col_keys, cells)


# ---------------------------------------------------------------------------------------------- formatting
def _num(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def format_stat(stat: Stat, kind: str, n_runs: int | None = None) -> str:
    """One table cell: "71.00 ± 1.41" (pct: fractions shown in %), "3.20e-04 ± 1.1e-05" (sci), "7.9 MiB"
    (bytes), rounds "40 ± 5" and "(k/n)" when only k of the n seeds reached the target; "—" for no value."""
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
    lines = ["| " + " | ".join(_md_escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def metric_table(layout: Layout, metric: str, kind: str) -> str:
    """Rows × columns of one metric; "n/a" where a combination was not run, "†" on settings with runs that
    are not completed."""
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


def _seed_table(layout: Layout) -> str:
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


def _write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[_csv_value(v) for v in row] for row in rows])
    path.write_text(buf.getvalue())
    return path


def _status_counts(runs: list[RunRecord]) -> str:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.status] = counts.get(r.status, 0) + 1
    return ";".join(f"{k}:{v}" for k, v in counts.items())


def write_settings_csv(path: Path, layout: Layout, settings: list[Setting], target: float | None) -> Path:
    """One row per setting: its label, the layout fields, n, statuses, target, then <metric>_mean/_std/_n."""
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
            row = [f"{layout.row_label(rk)} | {layout.col_label(ck)}", *(s.values[n] for n in names),
                   len(s.runs), seeds, _status_counts(s.runs), target]
            for m in CSV_METRICS:
                st = s.stats[m]
                row += [st.mean, st.std, st.n]
            rows.append(row)
    return _write_csv(path, header, rows)


def write_runs_csv(path: Path, runs: list[RunRecord], target: float | None, fields_: list[str]) -> Path:
    """One row per run, in discovery order: its directory, the layout fields, seed, status, final metrics."""
    header = ["run", *fields_, "seed", "status", "rounds_completed", "rounds", "target_acc", *CSV_METRICS,
              "problems", "error"]
    rows = []
    for r in runs:
        m = run_metrics(r, target)
        rows.append([r.name, *(r.config.get(f) for f in fields_), r.seed, r.status,
                     r.summary.get("rounds_completed"), r.summary.get("rounds"), target,
                     *(m[k] for k in CSV_METRICS), "; ".join(r.problems), r.summary.get("error")])
    return _write_csv(path, header, rows)


# ---------------------------------------------------------------------------------------------- plot data
def _curve(setting: Setting, key: str) -> plots.Curve:
    """Mean and sample std over seeds at every evaluated round (rounds any seed evaluated)."""
    by_round: dict[int, list[float | None]] = {}
    for run in setting.runs:
        for rec in run.metrics:
            by_round.setdefault(int(rec["round"]), []).append(_number(rec.get(key)))
    xs, means, stds = [], [], []
    for rnd in sorted(by_round):
        st = Stat.of(by_round[rnd])
        if st.mean is not None:
            xs.append(rnd)
            means.append(st.mean)
            stds.append(st.std or 0.0)
    return plots.Curve(xs, means, stds)


def _panels(layout: Layout, key: str, scale: float = 1.0) -> dict[str, dict[str, plots.Curve]]:
    """One panel per column, one curve per row."""
    panels = {}
    for ck in layout.col_keys:
        curves = {}
        for rk in layout.row_keys:
            s = layout.cells.get((rk, ck))
            if s is not None:
                c = _curve(s, key)
                curves[layout.row_label(rk)] = plots.Curve(c.x, [scale * v for v in c.mean], [scale * v for v in c.std])
        panels[layout.col_label(ck)] = curves
    return panels


@dataclass
class Fit:
    """y = a + b·ln(x) by least squares (log_y: ln y = a + b·ln x); r2 = coefficient of determination."""

    a: float
    b: float
    r2: float | None
    log_y: bool = False

    def __call__(self, x: float) -> float:
        y = self.a + self.b * math.log(x)
        return math.exp(y) if self.log_y else y


def fit_log_trend(xs: list[float], ys: list[float], log_y: bool = False) -> Fit | None:
    """Least squares of y (or ln y) on ln x over the points with x > 0 (and y > 0 when log_y); None when
    fewer than 2 distinct x remain."""
    pts = [(math.log(x), math.log(y) if log_y else y) for x, y in zip(xs, ys) if x > 0 and (y > 0 or not log_y)]
    if len({p[0] for p in pts}) < 2:
        return None
    n = len(pts)
    mx = math.fsum(p[0] for p in pts) / n
    my = math.fsum(p[1] for p in pts) / n
    sxx = math.fsum((p[0] - mx) ** 2 for p in pts)
    sxy = math.fsum((p[0] - mx) * (p[1] - my) for p in pts)
    b = sxy / sxx
    a = my - b * mx
    ss_tot = math.fsum((p[1] - my) ** 2 for p in pts)
    ss_res = math.fsum((p[1] - a - b * p[0]) ** 2 for p in pts)
    return Fit(a, b, 1 - ss_res / ss_tot if ss_tot > 0 else None, log_y)


def gap_of(setting: Setting) -> float | None:
    """1 − λ^Q of a setting: 1 − the mean over its runs of summary.json lambda_Q."""
    lam_q = setting.stats["lambda_Q"].mean
    return None if lam_q is None else 1.0 - lam_q


def _gap_series(settings: list[Setting], metric: str, point_label: Callable[[Setting], str],
                scale: float = 1.0, log_y: bool = False) -> tuple[list[plots.Series], list[str]]:
    """Series of (1 − λ^Q, metric mean ± std) points, one series per combination of the varied non-gap fields,
    each with its `fit_log_trend`; and one Markdown line per fitted series."""
    other = [f for f in varying_fields(settings) if f not in GAP_FIELDS]
    groups: dict[str, list[Setting]] = {}
    for s in settings:
        groups.setdefault(label(s.values, other) if other else "runs", []).append(s)
    series, notes = [], []
    for name, members in groups.items():
        points, nonpositive = [], 0
        for s in members:
            x, st = gap_of(s), s.stats[metric]
            if x is None or st.mean is None:
                continue
            if log_y and st.mean <= 0:
                nonpositive += 1
                continue
            points.append(plots.Point(x, scale * st.mean, scale * (st.std or 0.0), point_label(s)))
        if nonpositive:
            notes.append(f"- {name}: {nonpositive} setting(s) with a value of 0 not drawn (log axis)")
        # with exact averaging (λ^Q = 0) the consensus distance is float round-off: drawn, not fitted
        fitted = [p for p in points if not (log_y and p.x >= 1 - EXACT_AVERAGING)]
        if len(fitted) < len(points):
            notes.append(f"- {name}: {len(points) - len(fitted)} exact-averaging setting(s) (λ^Q = 0) drawn, "
                         "not fitted (their consensus distance is round-off)")
        fit = fit_log_trend([p.x for p in fitted], [p.y for p in fitted], log_y=log_y)
        trend = None
        if fit is not None:
            r2 = "—" if fit.r2 is None else f"{fit.r2:.3f}"
            sign = "−" if fit.b < 0 else "+"
            text = f"{'ln y' if log_y else 'y'} = {fit.a:.3g} {sign} {abs(fit.b):.3g}·ln(1 − λ^Q), R² = {r2}"
            trend = plots.Trend(fit, f"least squares: {text}")
            notes.append(f"- {name}: {text}")
        if points:
            series.append(plots.Series(name, points, trend))
    return series, notes


def _distinct_gaps(settings: list[Setting]) -> int:
    return len({round(g, 12) for g in (gap_of(s) for s in settings) if g is not None})


def _client_groups(layout: Layout) -> dict[str, list[float]]:
    """Per-client test accuracies (%) of the final record, pooled over the seeds of each setting."""
    groups = {}
    for rk in layout.row_keys:
        for ck in layout.col_keys:
            s = layout.cells.get((rk, ck))
            if s is None:
                continue
            finals = [(r.final or {}).get("client_acc") or [] for r in s.runs]
            accs = [100 * a for acc in finals for a in acc if _number(a) is not None]
            if accs:
                name = layout.row_label(rk) if len(layout.col_keys) == 1 else f"{layout.row_label(rk)} · " \
                    f"{layout.col_label(ck)}"
                groups[name] = accs
    return groups


# ---------------------------------------------------------------------------------------------- reports
def _out_dir(path: Path, out: str | Path | None) -> Path:
    return Path(out) if out is not None else path / REPORT_DIR


def _prepare(path: str | Path, out: str | Path | None) -> tuple[Path, Path, list[RunRecord], list[Setting]]:
    path = Path(path)
    out_dir = _out_dir(path, out)
    runs = load_runs(path, skip=[out_dir])
    settings = group_settings(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plots").mkdir(exist_ok=True)
    return path, out_dir, runs, settings


def _not_completed_section(runs: list[RunRecord], missing: list[dict[str, Any]]) -> str:
    body = []
    for r in runs:
        if r.status != "completed" or not r.metrics:
            done = f"{r.summary.get('rounds_completed', '?')}/{r.summary.get('rounds', '?')}"
            note = "; ".join([*(p for p in r.problems), *([str(r.summary["error"])] if r.summary.get("error") else [])])
            status = "running or interrupted" if r.status == "running" else r.status
            body.append([r.name, status, done, note or ""])
    for e in missing:
        body.append([str(e.get("dir")), f"{e.get('status', 'unknown')} (no run directory)", "0/?",
                     str(e.get("error") or "")])
    if not body:
        return ""
    return "## Runs not completed\n\n" + markdown_table(["run", "status", "rounds", "note"], body) + "\n"


def write_report(path: str | Path, out: str | Path | None = None, *, rows: str | list[str] | None = None,
                 cols: str | list[str] | None = None, target_acc: float | None = None) -> dict[str, Path]:
    """Tables (report.md, settings.csv, runs.csv) and plots (plots/*.png) of the runs under `path`, into
    `out` (default PATH/report/). Returns name -> written file. See the module docstring for the metrics."""
    if target_acc is not None:
        target_acc = check_target(target_acc)
    path = Path(path)
    if not path.exists():
        raise ReportError(f"path {path} does not exist")
    # validate --rows/--cols before touching the disk
    both = sorted(set(_field_list(rows, "rows") or ["algorithm"]) & set(_field_list(cols, "cols") or []))
    if both:
        raise ReportError(f"--rows and --cols share field(s) {', '.join(both)}; a field is either rows or columns")
    path, out_dir, runs, settings = _prepare(path, out)
    files: dict[str, Path] = {}
    missing = missing_sweep_runs(path, runs)
    target = target_acc if target_acc is not None else default_target(settings)
    target_note = "" if target_acc is not None else \
        f" (default: {DEFAULT_TARGET_FRACTION} × the lowest mean final accuracy)"
    for s in settings:
        s.aggregate(target)

    md = [f"# Report: {path}\n"]
    if not settings:
        md.append(f"{len(runs)} run(s), none with metrics yet.\n")
        md.append(_not_completed_section(runs, missing))
        files["report.md"] = out_dir / "report.md"
        files["report.md"].write_text("\n".join(part for part in md if part))
        files["runs.csv"] = write_runs_csv(out_dir / "runs.csv", runs, target, [])
        return files

    layout = make_layout(settings, rows, cols)
    n_seeds = {len(s.runs) for s in settings}
    seeds_text = f"n = {n_seeds.pop()} per setting" if len(n_seeds) == 1 else "n per setting below"
    md.append(
        f"{len(runs)} run(s) in {len(settings)} setting(s); rows: {', '.join(layout.rows)}; columns: "
        f"{', '.join(layout.cols) or 'all'}. Cells are mean ± sample standard deviation over seeds "
        f"({seeds_text}); final = the last evaluated round.\n"
    )
    if not all(s.completed for s in settings):
        md.append(f"{NOT_COMPLETED_MARK} includes runs that are not completed (see Runs not completed).\n")
    for metric, heading, kind in METRICS:
        if metric in OPTIONAL_METRICS and not any(s.stats[metric].n for s in settings):
            continue
        if metric == "rounds_to_target":
            if target is None:
                continue
            heading = f"Rounds to reach {100 * target:.2f}% test accuracy{target_note}; (k/n): k of n seeds reached it"
        md.append(f"## {heading}\n\n{metric_table(layout, metric, kind)}\n")
    if len(n_seeds) > 1:
        md.append(f"## Seeds per setting\n\n{_seed_table(layout)}\n")
    md.append(_not_completed_section(runs, missing))

    plot_dir = out_dir / "plots"
    files["accuracy.png"] = plots.curves(_panels(layout, "test_acc", 100.0), plot_dir / "accuracy.png",
                                         ylabel="test accuracy (%)", title="Test accuracy of the averaged model")
    files["consensus.png"] = plots.curves(_panels(layout, "consensus_distance"), plot_dir / "consensus.png",
                                          ylabel="consensus distance", title="Consensus distance", logy=True)
    if _distinct_gaps(settings) >= 2:
        series, fits = _gap_series(settings, "test_acc", lambda s: label(s.values, _gap_label_fields(settings)),
                                   scale=100.0)
        files["spectral_gap.png"] = plots.gap_scatter(series, plot_dir / "spectral_gap.png",
                                                      ylabel="final test accuracy (%)",
                                                      title="Final accuracy vs spectral gap")
        md.append("## Final accuracy vs spectral gap 1 − λ^Q\n\nLeast-squares trend of the mean final accuracy "
                  "(%) on ln(1 − λ^Q):\n\n" + ("\n".join(fits) or "- no series with 2 distinct gaps") + "\n")
    else:
        md.append("## Final accuracy vs spectral gap 1 − λ^Q\n\nNot plotted: fewer than 2 distinct spectral gaps "
                  "1 − λ^Q among the settings.\n")
    groups = _client_groups(layout)
    if groups:
        files["client_accuracy.png"] = plots.distributions(groups, plot_dir / "client_accuracy.png",
                                                           xlabel="client test accuracy (%)",
                                                           title="Per-client accuracy of the final models")
    plot_files = [p for k, p in files.items() if k.endswith(".png")]
    md.append("## Plots\n\n" + "\n".join(f"- {p.relative_to(out_dir)}" for p in plot_files) + "\n")

    files["report.md"] = out_dir / "report.md"
    files["report.md"].write_text("\n".join(part for part in md if part))
    files["settings.csv"] = write_settings_csv(out_dir / "settings.csv", layout, settings, target)
    files["runs.csv"] = write_runs_csv(out_dir / "runs.csv", _table_order(layout, runs), target,
                                       [*layout.rows, *layout.cols])
    return dict(sorted(files.items(), key=lambda kv: kv[0].endswith(".png")))


def _table_order(layout: Layout, runs: list[RunRecord]) -> list[RunRecord]:
    """Runs in table order (row, then column, then seed); runs without metrics last, in discovery order."""
    ordered = []
    for rk in layout.row_keys:
        for ck in layout.col_keys:
            s = layout.cells.get((rk, ck))
            if s is not None:
                ordered += sorted(s.runs, key=lambda r: (not isinstance(r.seed, int), r.seed if isinstance(r.seed, int)
                                                         else 0, r.name))
    seen = {id(r) for r in ordered}
    return ordered + [r for r in runs if id(r) not in seen]


def _gap_label_fields(settings: list[Setting]) -> list[str]:
    """The varied fields that set the gap (e.g. topology, gossip_steps); topology when none varies."""
    names = [f for f in varying_fields(settings) if f in GAP_FIELDS]
    return names or ["topology"]


# ---------------------------------------------------------------------------------------------- spectral study
@dataclass
class SpectralRow:
    setting: Setting
    topology: str
    Q: int | None
    clients: int | None
    lam: float | None
    gap_q: float | None  # 1 − λ^Q
    phi: float | None
    effective_neighbors: float | None
    notes: list[str] = field(default_factory=list)


def spectral_quantities(setting: Setting, cache: dict[str, tuple] | None = None) -> SpectralRow:
    """λ, 1 − λ^Q, Φ(λ, m, Q) and n_W(0.951) of a setting: the topology is rebuilt from the first run's config
    (`dfl.runner.build_topology`); Q and m are the run's resolved `gossip_steps` and `clients` (summary.json).

    λ = `Topology.second_eigenvalue()` (‖W − J‖₂; a periodic schedule's per-step rate), falling back to
    summary.json `lambda` when the topology cannot be rebuilt; 1 − λ^Q = 1 − summary.json `lambda_Q`, the
    contraction of a round's Q gossip steps (= λ^Q for a static symmetric W), averaged over the seeds. Φ and n_W
    are None ("—") where undefined (random-k has no period). A random graph drawn per seed (random-regular,
    erdos-renyi) is rebuilt for the first run's seed."""
    import topologies
    from dfl.algorithms import algorithm_class
    from dfl.runner import build_topology

    cache = {} if cache is None else cache
    run = setting.runs[0]
    summary = run.summary
    Q = summary.get("gossip_steps")
    m = summary.get("clients", run.config.get("clients"))
    topo_name = summary.get("topology", run.config.get("topology"))
    row = SpectralRow(setting, str(topo_name), Q, m, _number(summary.get("lambda")), gap_of(setting), None, None)
    key = _canon([topo_name, m, {f: run.config.get(f) for f in ("topology", "weights", "topology_options", "seed")}])
    if key not in cache:
        try:
            config = Config.from_dict({k: v for k, v in run.config.items() if k in CONFIG_FIELDS})
            centralized = getattr(algorithm_class(config.algorithm), "centralized", False)
            topo = topologies.build("full", m) if centralized else build_topology(config, m)  # as dfl.run does
            cache[key] = (topo, None)
        except Exception as exc:  # an unreadable config or a custom matrix that moved: keep the summary's λ
            cache[key] = (None, f"topology not rebuilt ({type(exc).__name__}: {exc})")
    topo, problem = cache[key]
    if problem:
        row.notes.append(problem)
    if topo is None:
        return row
    for attr, compute in (("lam", topo.second_eigenvalue), ("effective_neighbors", topo.effective_neighbors)):
        try:
            setattr(row, attr, float(compute()))
        except ValueError as exc:
            row.notes.append(str(exc))
    if isinstance(Q, int) and not isinstance(Q, bool):
        try:
            row.phi = float(topo.phi(Q))
        except ValueError as exc:
            row.notes.append(str(exc))
    return row


def _fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "—"
    if math.isinf(value):
        return "∞"
    return format(value, spec)


def write_spectral_report(path: str | Path, out: str | Path | None = None) -> dict[str, Path]:
    """The spectral-gap study of the runs under `path` (e.g. a `dfl spectral-study` sweep), into `out` (default
    PATH/report/): spectral.md and spectral.csv (one row per setting: [other varied fields], topology, Q,
    clients, λ, 1 − λ^Q, Φ(λ, m, Q), effective neighbours, final accuracy and final consensus distance, mean ±
    std over seeds) and plots/spectral_accuracy.png, plots/spectral_consensus.png (both against 1 − λ^Q on a
    log axis, with least-squares trends of accuracy on ln(1 − λ^Q) and of ln(consensus) on ln(1 − λ^Q))."""
    path, out_dir, runs, settings = _prepare(path, out)
    for s in settings:
        s.aggregate(None)
    missing = missing_sweep_runs(path, runs)
    md = [f"# Spectral-gap study: {path}\n"]
    files: dict[str, Path] = {}
    if not settings:
        md.append(f"{len(runs)} run(s), none with metrics yet.\n")
        md.append(_not_completed_section(runs, missing))
        files["spectral.md"] = out_dir / "spectral.md"
        files["spectral.md"].write_text("\n".join(part for part in md if part))
        return files

    other = [f for f in varying_fields(settings) if f not in GAP_FIELDS]
    cache: dict[str, tuple] = {}
    table = [spectral_quantities(s, cache) for s in settings]
    order = _order(settings, other) if other else [()]
    rank = {k: i for i, k in enumerate(order)}
    topo_order = _sort_key([s.values["topology"] for s in settings], "topology")
    table.sort(key=lambda r: (rank[tuple(_canon(r.setting.values[f]) for f in other)],
                              topo_order(r.setting.values["topology"]), r.Q or 0, r.clients or 0))

    header = [*other, "topology", "Q", "clients", "λ", "1 − λ^Q", "Φ(λ, m, Q)", "effective neighbours",
              "final accuracy (%)", "final consensus distance", "n"]
    body = []
    for r in table:
        s = r.setting
        cell = format_stat(s.stats["test_acc"], "pct") + ("" if s.completed else f" {NOT_COMPLETED_MARK}")
        body.append([*(format_value(s.values[f]) for f in other), r.topology, _fmt(r.Q, "d"), _fmt(r.clients, "d"),
                     _fmt(r.lam, ".4f"), _fmt(r.gap_q, ".4g"), _fmt(r.phi, ".4g"),
                     _fmt(r.effective_neighbors, ".2f"), cell, format_stat(s.stats["consensus_distance"], "sci"),
                     str(len(s.runs))])
    md.append(
        f"{len(runs)} run(s) in {len(settings)} setting(s), mean ± sample standard deviation over seeds. λ = "
        "‖W − J‖₂ (per-step rate of a periodic schedule), 1 − λ^Q = 1 − the contraction of one round's Q gossip "
        "steps (summary.json lambda_Q), Φ(λ, m, Q) = (λ^Q + 1)/((1 − λ)² m^(2(Q−1))) + (λ^Q + 1)/(1 − λ^Q)² "
        "(DFedSAM-MGS bound), effective neighbours n_W(γ = 0.951) (Vogels et al. 2022).\n"
    )
    if not all(s.completed for s in settings):
        md.append(f"{NOT_COMPLETED_MARK} includes runs that are not completed (see Runs not completed).\n")
    md.append(markdown_table(header, body) + "\n")
    notes = sorted({f"- {r.topology}: {n}" for r in table for n in r.notes})
    if notes:
        md.append("Notes:\n\n" + "\n".join(notes) + "\n")

    def point_label(s: Setting) -> str:
        row = next(r for r in table if r.setting is s)
        return f"{row.topology} Q={row.Q}" + (f" m={row.clients}" if "clients" in varying_fields(settings) else "")

    plot_dir = out_dir / "plots"
    if _distinct_gaps(settings) >= 2:
        acc_series, acc_fits = _gap_series(settings, "test_acc", point_label, scale=100.0)
        cd_series, cd_fits = _gap_series(settings, "consensus_distance", point_label, log_y=True)
        files["spectral_accuracy.png"] = plots.gap_scatter(acc_series, plot_dir / "spectral_accuracy.png",
                                                           ylabel="final test accuracy (%)",
                                                           title="Final accuracy vs spectral gap")
        if cd_series:
            files["spectral_consensus.png"] = plots.gap_scatter(cd_series, plot_dir / "spectral_consensus.png",
                                                                ylabel="final consensus distance", logy=True,
                                                                title="Consensus distance vs spectral gap")
        md.append("## Trends (least squares over the setting means)\n\nFinal accuracy (%):\n\n"
                  + ("\n".join(acc_fits) or "- none") + "\n\nFinal consensus distance (positive values only):\n\n"
                  + ("\n".join(cd_fits) or "- none") + "\n")
    else:
        md.append("Not plotted: fewer than 2 distinct spectral gaps 1 − λ^Q among the settings.\n")
    md.append(_not_completed_section(runs, missing))

    files["spectral.md"] = out_dir / "spectral.md"
    files["spectral.md"].write_text("\n".join(part for part in md if part))
    csv_header = [*other, "topology", "Q", "clients", "lambda", "gap_Q", "phi", "effective_neighbors", "runs",
                  "status", "test_acc_mean", "test_acc_std", "consensus_distance_mean", "consensus_distance_std"]
    csv_rows = []
    for r in table:
        s = r.setting
        acc, cd = s.stats["test_acc"], s.stats["consensus_distance"]
        csv_rows.append([*(s.values[f] for f in other), r.topology, r.Q, r.clients, r.lam, r.gap_q, r.phi,
                         r.effective_neighbors, len(s.runs), _status_counts(s.runs), acc.mean, acc.std, cd.mean,
                         cd.std])
    files["spectral.csv"] = _write_csv(out_dir / "spectral.csv", csv_header, csv_rows)
    return dict(sorted(files.items(), key=lambda kv: kv[0].endswith(".png")))
