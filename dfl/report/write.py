"""`write_report`: report.md, settings.csv, runs.csv and plots/ of the runs under a path (see `dfl.report`)."""

from __future__ import annotations

from pathlib import Path

from dfl.errors import ReportError
from dfl.report import plots
from dfl.report.comparison import comparison_section
from dfl.report.curves import client_groups, curve_panels
from dfl.report.document import ReportDocument
from dfl.report.layout import Layout, field_list, label, make_layout, registry_order
from dfl.report.metrics import METRICS, OPTIONAL_METRICS
from dfl.report.runs import RunRecord
from dfl.report.settings import DEFAULT_TARGET_FRACTION, Setting, check_target, default_target, varying_fields
from dfl.report.tables import metric_table, seed_table, write_runs_csv, write_settings_csv
from dfl.report.trends import GAP_FIELDS, distinct_gaps, gap_series

# accuracy against what the runs spent: simulated seconds (mode = async, stragglers) and bytes sent
# (file name, metric on the x axis, its scale, the axis label, what the title says)
SPENT = (("accuracy_time.png", "sim_time", 1.0, "simulated time (s; 1 local step = 1 s)", "simulated time"),
         ("accuracy_bytes.png", "bytes_sent_total", 2.0**-20, "bytes sent by all clients (MiB)", "bytes sent"))


def write_report(path: str | Path, out: str | Path | None = None, *, rows: str | list[str] | None = None,
                 cols: str | list[str] | None = None, target_acc: float | None = None) -> dict[str, Path]:
    """Tables (report.md, settings.csv, runs.csv) and plots (plots/*.png) of the runs under `path`.

    See `dfl.report` for the metrics.

    Args:
        path: a run directory, or a directory holding run directories (searched recursively).
        out: the report directory (default PATH/report/).
        rows: the Config field(s) of the table rows (default algorithm), a list or comma-separated.
        cols: the field(s) of the columns (default: every other varied field).
        target_acc: the test accuracy in (0, 1] of the rounds-to-target table (default: the runs'
            `target_accuracy`, else 0.9 × the lowest mean final accuracy).

    Returns:
        Name -> written file, tables first.

    Raises:
        ReportError: for a path that does not exist, fields that are both rows and columns, or an unknown field.
    """
    if target_acc is not None:
        target_acc = check_target(target_acc)
    path = Path(path)
    if not path.exists():
        raise ReportError(f"path {path} does not exist")
    # validate --rows/--cols before touching the disk
    both = sorted(set(field_list(rows, "rows") or ["algorithm"]) & set(field_list(cols, "cols") or []))
    if both:
        raise ReportError(f"--rows and --cols share field(s) {', '.join(both)}; a field is either rows or columns")
    doc = ReportDocument.open(path, out, "Report")
    settings = doc.settings
    target, own_targets, target_heading = _targets(settings, target_acc)
    for s in settings:
        s.aggregate(target, own_targets)
    if not settings:
        doc.add_no_metrics()
        doc.write("report.md")
        doc.add_file("runs.csv", write_runs_csv(doc.out_dir / "runs.csv", doc.runs, target, []))
        return doc.files

    layout = make_layout(settings, rows, cols)
    _add_tables(doc, layout, target_heading)
    doc.add_not_completed()
    _add_plots(doc, layout)
    doc.write("report.md")
    doc.add_file("settings.csv", write_settings_csv(doc.out_dir / "settings.csv", layout, settings, target,
                                                    own_targets))
    doc.add_file("runs.csv", write_runs_csv(doc.out_dir / "runs.csv", _table_order(layout, doc.runs), target,
                                            [*layout.rows, *layout.cols], own_targets))
    return doc.written()


def _add_tables(doc: ReportDocument, layout: Layout, target_heading: str | None) -> None:
    """The paragraph that says what a cell is, then one table per metric.

    And the seeds per setting when they differ.
    """
    settings = doc.settings
    n_seeds = {len(s.runs) for s in settings}
    seeds_text = f"n = {next(iter(n_seeds))} per setting" if len(n_seeds) == 1 else "n per setting below"
    doc.add(
        f"{len(doc.runs)} run(s) in {len(settings)} setting(s); rows: {', '.join(layout.rows)}; columns: "
        f"{', '.join(layout.cols) or 'all'}. Cells are mean ± sample standard deviation over seeds "
        f"({seeds_text}); final = the last evaluated round.\n"
    )
    doc.add_not_completed_mark()
    doc.add(comparison_section(settings, [*layout.rows, *layout.cols]))
    for metric, heading, kind in METRICS:
        if metric in OPTIONAL_METRICS and not any(s.stats[metric].n for s in settings):
            continue
        if metric == "rounds_to_target":
            if target_heading is None:
                continue
            heading = f"Rounds to reach {target_heading}; (k/n): k of n seeds reached it"
        doc.add(f"## {heading}\n\n{metric_table(layout, metric, kind)}\n")
    if len(n_seeds) > 1:
        doc.add(f"## Seeds per setting\n\n{seed_table(layout)}\n")


def _add_plots(doc: ReportDocument, layout: Layout) -> None:
    """The plots and their list.

    The curves over rounds and over what the runs spent, final accuracy against the spectral gap (with its trend),
    the per-client accuracies.
    """
    order = registry_order("algorithm")
    doc.add_file("accuracy.png", plots.curves(curve_panels(layout, "test_acc", 100.0), doc.plot_dir / "accuracy.png",
                                              ylabel="test accuracy (%)", title="Test accuracy of the averaged model",
                                              order=order))
    doc.add_file("consensus.png", plots.curves(curve_panels(layout, "consensus_distance"),
                                               doc.plot_dir / "consensus.png", ylabel="consensus distance",
                                               title="Consensus distance", logy=True, order=order))
    for name, over, scale, xlabel, what in SPENT:
        panels = curve_panels(layout, "test_acc", 100.0, over=over, over_scale=scale)
        if any(panels.values()):
            doc.add_file(name, plots.curves(panels, doc.plot_dir / name, ylabel="test accuracy (%)", xlabel=xlabel,
                                            title=f"Test accuracy vs {what}", order=order, integer_x=False))
    _add_gap_plot(doc)
    groups = client_groups(layout)
    if groups:
        doc.add_file("client_accuracy.png", plots.distributions(groups, doc.plot_dir / "client_accuracy.png",
                                                                xlabel="client test accuracy (%)",
                                                                title="Per-client accuracy of the final models"))
    plot_files = [p for k, p in doc.files.items() if k.endswith(".png")]
    doc.add("## Plots\n\n" + "\n".join(f"- {p.relative_to(doc.out_dir)}" for p in plot_files) + "\n")


def _add_gap_plot(doc: ReportDocument) -> None:
    """Final accuracy against the spectral gap 1 − λ^Q, and its least-squares trend.

    Plotted with 2 distinct gaps or more.
    """
    settings = doc.settings
    if distinct_gaps(settings) < 2:
        doc.add("## Final accuracy vs spectral gap 1 − λ^Q\n\nNot plotted: fewer than 2 distinct spectral gaps "
                "1 − λ^Q among the settings.\n")
        return
    series, fits = gap_series(settings, "test_acc", lambda s: label(s.values, _gap_label_fields(settings)),
                              scale=100.0)
    doc.add_file("spectral_gap.png", plots.gap_scatter(series, doc.plot_dir / "spectral_gap.png",
                                                       ylabel="final test accuracy (%)",
                                                       title="Final accuracy vs spectral gap",
                                                       order=registry_order("algorithm")))
    doc.add("## Final accuracy vs spectral gap 1 − λ^Q\n\nLeast-squares trend of the mean final accuracy "
            "(%) on ln(1 − λ^Q):\n\n" + ("\n".join(fits) or "- no series with 2 distinct gaps") + "\n")


def _targets(settings: list[Setting], target_acc: float | None) -> tuple[float | None, bool, str | None]:
    """The rounds-to-target rule.

    (report target, whether runs use their own `target_accuracy`, the table's heading; None when there is no target).
    `--target` wins; else the runs' target_accuracy (config), each run its own; runs without one (or when none has one)
    use 0.9 × the lowest mean final accuracy.
    """
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
