"""Reports over run directories: tables in the layout of the papers' tables, CSV files and plots.

`write_report(PATH)` finds every run directory under PATH (a directory holding `config.toml` and `summary.json` or
`metrics.jsonl`; PATH itself may be one), groups the runs into *settings* (the config without `seed`, `name` and
the fields that only change how a run executes or what it records, `NOT_SETTING_FIELDS`), aggregates each setting
over its seeds (mean ± sample standard deviation, n − 1 in the denominator) and writes

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
and the column compares speed on a common bar. Runs with local test sets (`local_test_fraction`) add the
personalized and global accuracy (means over clients) as tables, and their mean/std/min to the CSV files.

Runs that are not completed (running or interrupted, failed, diverged, killed) are aggregated with the others,
their cells marked "†" and the runs listed under "Runs not completed"; a run without metrics is listed and left out
of the tables, and so is one whose config.toml makes no Config (unreadable, an unknown field, a value of the wrong
type or out of range: a warning names the file and the field). A partly written last line of metrics.jsonl (a run
killed while writing it) is skipped with a warning naming the file and the line; the records before it are the
run's metrics so far. The files read are never changed. `write_spectral_report(PATH)` writes the spectral-gap study
(λ, 1 − λ^Q, Φ(λ, m, Q), effective neighbours against final accuracy and consensus distance).

Modules, each importing only those before it: `runs` (finding and reading run directories), `metrics` (the
values of one run), `settings` (runs grouped and aggregated over seeds), `layout` (rows, columns, value
order), `tables` (Markdown cells and tables, CSV files), `curves` and `trends` (plot data: curves over
rounds, per-client accuracies; spectral-gap fits), `write` (`write_report`) and `spectral`
(`write_spectral_report`).
"""

from __future__ import annotations

from dfl.errors import ReportError
from dfl.report.layout import Layout, format_value, label, make_layout
from dfl.report.metrics import CSV_METRICS, METRICS, OPTIONAL_METRICS, rounds_to_target, run_metrics
from dfl.report.runs import (
    REPORT_DIR,
    RunRecord,
    find_run_dirs,
    is_run_dir,
    load_run,
    load_runs,
    missing_sweep_runs,
)
from dfl.report.settings import (
    CONFIG_FIELDS,
    DEFAULT_TARGET_FRACTION,
    NOT_SETTING_FIELDS,
    SETTING_FIELDS,
    Setting,
    Stat,
    check_target,
    default_target,
    group_settings,
    varying_fields,
)
from dfl.report.spectral import SpectralRow, spectral_quantities, write_spectral_report
from dfl.report.tables import (
    NOT_COMPLETED_MARK,
    format_stat,
    markdown_table,
    metric_table,
    write_runs_csv,
    write_settings_csv,
)
from dfl.report.trends import EXACT_AVERAGING, GAP_FIELDS, Fit, fit_log_trend, gap_of
from dfl.report.write import write_report

__all__ = [  # in module order: runs, metrics, settings, layout, tables, trends, write, spectral
    "REPORT_DIR", "ReportError", "RunRecord", "find_run_dirs", "is_run_dir", "load_run", "load_runs",
    "missing_sweep_runs",
    "CSV_METRICS", "METRICS", "OPTIONAL_METRICS", "rounds_to_target", "run_metrics",
    "CONFIG_FIELDS", "DEFAULT_TARGET_FRACTION", "NOT_SETTING_FIELDS", "SETTING_FIELDS", "Setting", "Stat",
    "check_target", "default_target", "group_settings", "varying_fields",
    "Layout", "format_value", "label", "make_layout",
    "NOT_COMPLETED_MARK", "format_stat", "markdown_table", "metric_table", "write_runs_csv", "write_settings_csv",
    "EXACT_AVERAGING", "GAP_FIELDS", "Fit", "fit_log_trend", "gap_of",
    "write_report",
    "SpectralRow", "spectral_quantities", "write_spectral_report",
]
