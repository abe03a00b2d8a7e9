"""`write_report`: report.md, settings.csv, runs.csv and plots/ of the runs under a path (see `dfl.report`);
and what the spectral report shares with it (loading into settings, the runs-not-completed section).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dfl.directories import check_output_directory, claim_directory
from dfl.files import atomic_write_text
from dfl.report import plots
from dfl.report.curves import _client_groups, _panels
from dfl.report.layout import Layout, _field_list, _registry_order, label, make_layout
from dfl.report.metrics import METRICS, OPTIONAL_METRICS
from dfl.report.runs import REPORT_DIR, ReportError, RunRecord, load_runs, missing_sweep_runs
from dfl.report.settings import (
    DEFAULT_TARGET_FRACTION,
    Setting,
    check_target,
    default_target,
    group_settings,
    varying_fields,
)
from dfl.report.tables import (
    NOT_COMPLETED_MARK,
    _seed_table,
    markdown_table,
    metric_table,
    write_runs_csv,
    write_settings_csv,
)
from dfl.report.trends import GAP_FIELDS, _distinct_gaps, _gap_series


def _out_dir(path: Path, out: str | Path | None) -> Path:
    return Path(out) if out is not None else path / REPORT_DIR


def _prepare(path: str | Path, out: str | Path | None) -> tuple[Path, Path, list[RunRecord], list[Setting]]:
    """The runs under `path` and the report directory (`out`, default PATH/report/): a new or empty folder, or a
    report directory dfl made (`dfl.directories`; anything else is refused before the runs are read)."""
    path = Path(path)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is neither a run directory nor a directory holding run " \
            "directories"
        raise ReportError(f"path {path} {what}")
    out_dir = _out_dir(path, out)
    check_output_directory(out_dir, "report")
    runs = load_runs(path, skip=[out_dir])
    settings = group_settings(runs)
    claim_directory(out_dir, "report")
    return path, out_dir, runs, settings


def _not_completed_section(runs: list[RunRecord], missing: list[dict[str, Any]]) -> str:
    body = []
    for r in runs:
        if not r.finished or not r.metrics:
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
    `out` (default PATH/report/). Returns name -> written file. See `dfl.report` for the metrics."""
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
    target, own_targets, target_heading = _targets(settings, target_acc)
    for s in settings:
        s.aggregate(target, own_targets)

    md = [f"# Report: {path}\n"]
    if not settings:
        md.append(f"{len(runs)} run(s), none with metrics yet.\n")
        md.append(_not_completed_section(runs, missing))
        files["report.md"] = out_dir / "report.md"
        atomic_write_text(files["report.md"], "\n".join(part for part in md if part))
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
            if target_heading is None:
                continue
            heading = f"Rounds to reach {target_heading}; (k/n): k of n seeds reached it"
        md.append(f"## {heading}\n\n{metric_table(layout, metric, kind)}\n")
    if len(n_seeds) > 1:
        md.append(f"## Seeds per setting\n\n{_seed_table(layout)}\n")
    md.append(_not_completed_section(runs, missing))

    plot_dir = out_dir / "plots"
    files["accuracy.png"] = plots.curves(_panels(layout, "test_acc", 100.0), plot_dir / "accuracy.png",
                                         ylabel="test accuracy (%)", title="Test accuracy of the averaged model",
                                         order=_registry_order("algorithm"))
    files["consensus.png"] = plots.curves(_panels(layout, "consensus_distance"), plot_dir / "consensus.png",
                                          ylabel="consensus distance", title="Consensus distance", logy=True,
                                          order=_registry_order("algorithm"))
    # accuracy against what the runs spent: simulated seconds (mode = async, stragglers) and bytes sent
    for name, over, scale, xlabel, what in (
            ("accuracy_time.png", "sim_time", 1.0, "simulated time (s; 1 local step = 1 s)", "simulated time"),
            ("accuracy_bytes.png", "bytes_sent_total", 2.0**-20, "bytes sent by all clients (MiB)", "bytes sent")):
        panels = _panels(layout, "test_acc", 100.0, over=over, over_scale=scale)
        if any(panels.values()):
            files[name] = plots.curves(panels, plot_dir / name, ylabel="test accuracy (%)", xlabel=xlabel,
                                       title=f"Test accuracy vs {what}", order=_registry_order("algorithm"),
                                       integer_x=False)
    if _distinct_gaps(settings) >= 2:
        series, fits = _gap_series(settings, "test_acc", lambda s: label(s.values, _gap_label_fields(settings)),
                                   scale=100.0)
        files["spectral_gap.png"] = plots.gap_scatter(series, plot_dir / "spectral_gap.png",
                                                      ylabel="final test accuracy (%)",
                                                      title="Final accuracy vs spectral gap",
                                                      order=_registry_order("algorithm"))
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
    atomic_write_text(files["report.md"], "\n".join(part for part in md if part))
    files["settings.csv"] = write_settings_csv(out_dir / "settings.csv", layout, settings, target, own_targets)
    files["runs.csv"] = write_runs_csv(out_dir / "runs.csv", _table_order(layout, runs), target,
                                       [*layout.rows, *layout.cols], own_targets)
    return dict(sorted(files.items(), key=lambda kv: kv[0].endswith(".png")))


def _targets(settings: list[Setting], target_acc: float | None) -> tuple[float | None, bool, str | None]:
    """The rounds-to-target rule: (report target, whether runs use their own `target_accuracy`, the table's
    heading; None when there is no target). `--target` wins; else the runs' target_accuracy (config), each
    run its own; runs without one (or when none has one) use 0.9 × the lowest mean final accuracy."""
    if target_acc is not None:
        return target_acc, False, f"{100 * target_acc:.2f}% test accuracy"
    default = default_target(settings)
    runs = [r for s in settings for r in s.runs]
    own = sorted({r.config["target_accuracy"] for r in runs if r.config.get("target_accuracy") is not None})
    rule = f"{DEFAULT_TARGET_FRACTION} × the lowest mean final accuracy"
    if not own:
        return default, False, None if default is None else f"{100 * default:.2f}% test accuracy (default: {rule})"
    shown = ", ".join(f"{100 * t:.2f}%" for t in own)
    everyone = all(r.config.get("target_accuracy") is not None for r in runs)
    if len(own) == 1 and everyone:
        return default, True, f"{shown} test accuracy (the runs' target_accuracy)"
    text = f"each run's target_accuracy ({shown})"
    if not everyone:
        text += "; runs without one: " + (f"{100 * default:.2f}% ({rule})" if default is not None else "none")
    return default, True, text


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
