"""The spectral-gap study (`write_spectral_report`).

λ, 1 − λ^Q, Φ(λ, m, Q) and effective neighbours of each setting against its final accuracy and consensus distance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfl.config import Config
from dfl.report import plots
from dfl.report.document import ReportDocument
from dfl.report.layout import format_value, registry_order, value_order, value_sort_key
from dfl.report.metrics import as_number
from dfl.report.settings import CONFIG_FIELDS, Setting, canonical, check_target, default_target, varying_fields
from dfl.report.tables import NOT_COMPLETED_MARK, format_stat, markdown_table, status_counts, write_csv
from dfl.report.trends import GAP_FIELDS, distinct_gaps, gap_of, gap_series


@dataclass
class SpectralRow:
    """One row of the spectral study.

    A setting, its topology, Q, clients m, λ, 1 − λ^Q, Φ(λ, m, Q), its effective neighbours, and notes on what could not
    be computed.
    """
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
    """λ, 1 − λ^Q, Φ(λ, m, Q) and n_W(0.951) of a setting.

    The topology is rebuilt from the first run's config (`dfl.engine.setup.build_topology`); Q and m are the run's
    resolved `gossip_steps` and `clients` (summary.json).

    λ = `Topology.second_eigenvalue()` (‖W − J‖₂; a periodic schedule's per-step rate), falling back to
    summary.json `lambda` when the topology cannot be rebuilt; 1 − λ^Q = 1 − summary.json `lambda_Q`, the
    contraction of a round's Q gossip steps (= λ^Q for a static symmetric W), averaged over the seeds. Φ and n_W
    are None ("—") where undefined (random-k has no period). A random graph drawn per seed (random-regular,
    erdos-renyi) is rebuilt for the first run's seed.
    """
    from dfl.engine.setup import build_topology

    cache = {} if cache is None else cache
    run = setting.runs[0]
    summary = run.summary
    Q = summary.get("gossip_steps")
    m: Any = summary.get("clients", run.config.get("clients"))  # from JSON; build_topology refuses a bad one
    topo_name = summary.get("topology", run.config.get("topology"))
    row = SpectralRow(setting, str(topo_name), Q, m, as_number(summary.get("lambda")), gap_of(setting), None, None)
    key = canonical([topo_name, m, {f: run.config.get(f) for f in ("topology", "weights", "topology_options", "seed")}])
    if key not in cache:
        try:
            config = Config.from_dict({k: v for k, v in run.config.items() if k in CONFIG_FIELDS})
            topo = build_topology(config, m)  # as dfl.run does (the complete graph for centralized algorithms)
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


def _rounds_cell(s: Setting) -> str:
    """Mean ± std of the rounds to target over the seeds that reached it, with (k/n)."""
    stat = s.stats["rounds_to_target"]
    return f"{format_stat(stat, 'rounds')} ({stat.n}/{len(s.runs)})"


def _fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "—"
    if math.isinf(value):
        return "∞"
    return format(value, spec)


def write_spectral_report(path: str | Path, out: str | Path | None = None,
                          target_acc: float | None = None) -> dict[str, Path]:
    """The spectral-gap study of the runs under `path` (e.g. a `dfl spectral-study` sweep).

    Writes spectral.md and spectral.csv (one row per setting: [other varied fields], topology, Q, clients, λ,
    1 − λ^Q, Φ(λ, m, Q), effective neighbours, final accuracy, rounds to the target and final consensus
    distance, mean ± std over seeds) and three views against 1 − λ^Q on a log axis: plots/spectral_accuracy.png
    (final accuracy at the round budget: mixes convergence speed and the limit reached),
    plots/spectral_rounds.png (rounds to the target: the speed the theory's rates speak to) and
    plots/spectral_consensus.png. Trends are fitted within one client count (`dfl.report.trends`).

    Args:
        path: a run directory, or a directory holding run directories.
        out: the report directory (default PATH/report/).
        target_acc: the test accuracy in (0, 1] of the rounds-to-target column (default: `default_target`).

    Returns:
        Name -> written file, tables first.
    """
    doc = ReportDocument.open(path, out, "Spectral-gap study")
    settings = doc.settings
    target = check_target(target_acc) if target_acc is not None else default_target(settings)
    for s in settings:
        s.aggregate(target)
    if not settings:
        doc.add_no_metrics()
        doc.write("spectral.md")
        return doc.files

    other = [f for f in varying_fields(settings) if f not in GAP_FIELDS]
    table = _spectral_rows(settings, other)
    target_text = "—" if target is None else f"{100 * target:.2f}%"
    doc.add(_intro(doc, target_text, target_given=target_acc is not None))
    doc.add_not_completed_mark()
    doc.add(_markdown(table, other, target_text) + "\n")
    notes = sorted({f"- {r.topology}: {n}" for r in table for n in r.notes})
    if notes:
        doc.add("Notes:\n\n" + "\n".join(notes) + "\n")
    _add_plots(doc, table, target_text)
    doc.add_not_completed()
    doc.write("spectral.md")
    doc.add_file("spectral.csv", _write_spectral_csv(doc.out_dir / "spectral.csv", table, other, target))
    return doc.written()


def _spectral_rows(settings: list[Setting], other: list[str]) -> list[SpectralRow]:
    """One row per setting, in table order: the other varied fields, then topology (registry order), Q, m."""
    cache: dict[str, tuple] = {}
    table = [spectral_quantities(s, cache) for s in settings]
    order = value_order(settings, other) if other else [()]
    rank = {k: i for i, k in enumerate(order)}
    topo_order = value_sort_key([s.values["topology"] for s in settings], "topology")
    table.sort(key=lambda r: (rank[tuple(canonical(r.setting.values[f]) for f in other)],
                              topo_order(r.setting.values["topology"]), r.Q or 0, r.clients or 0))
    return table


def _intro(doc: ReportDocument, target_text: str, target_given: bool) -> str:
    """The paragraph that defines the columns: λ, 1 − λ^Q, Φ(λ, m, Q), effective neighbours, rounds to target."""
    return (
        f"{len(doc.runs)} run(s) in {len(doc.settings)} setting(s), mean ± sample standard deviation over seeds. λ = "
        "‖W − J‖₂ (per-step rate of a periodic schedule), 1 − λ^Q = 1 − the contraction of one round's Q gossip "
        "steps (summary.json lambda_Q), Φ(λ, m, Q) = (λ^Q + 1)/((1 − λ)² m^(2(Q−1))) + (λ^Q + 1)/(1 − λ^Q)² "
        "(DFedSAM-MGS bound), effective neighbours n_W(γ = 0.951) (Vogels et al. 2022). Rounds to "
        f"{target_text}: the first evaluated round whose test accuracy reaches it, mean over the k of n seeds that "
        "reached it (target " + ("given" if target_given else "by default 0.9 × the lowest mean final "
                                 "accuracy") + ").\n"
    )


def _markdown(table: list[SpectralRow], other: list[str], target_text: str) -> str:
    """The study's Markdown table."""
    header = [*other, "topology", "Q", "clients", "λ", "1 − λ^Q", "Φ(λ, m, Q)", "effective neighbours",
              "final accuracy (%)", f"rounds to {target_text} (k/n)", "final consensus distance", "n"]
    body = []
    for r in table:
        s = r.setting
        cell = format_stat(s.stats["test_acc"], "pct") + ("" if s.completed else f" {NOT_COMPLETED_MARK}")
        body.append([*(format_value(s.values[f]) for f in other), r.topology, _fmt(r.Q, "d"), _fmt(r.clients, "d"),
                     _fmt(r.lam, ".4f"), _fmt(r.gap_q, ".4g"), _fmt(r.phi, ".4g"),
                     _fmt(r.effective_neighbors, ".2f"), cell, _rounds_cell(s),
                     format_stat(s.stats["consensus_distance"], "sci"),
                     str(len(s.runs))])
    return markdown_table(header, body)


def _add_plots(doc: ReportDocument, table: list[SpectralRow], target_text: str) -> None:
    """Final accuracy, rounds to the target and consensus distance against 1 − λ^Q, and their trends.

    Plotted with 2 distinct gaps or more.
    """
    settings = doc.settings
    if distinct_gaps(settings) < 2:
        doc.add("Not plotted: fewer than 2 distinct spectral gaps 1 − λ^Q among the settings.\n")
        return

    def point_label(s: Setting) -> str:
        row = next(r for r in table if r.setting is s)
        return f"{row.topology} Q={row.Q}" + (f" m={row.clients}" if "clients" in varying_fields(settings) else "")

    acc_series, acc_fits = gap_series(settings, "test_acc", point_label, scale=100.0)
    cd_series, cd_fits = gap_series(settings, "consensus_distance", point_label, log_y=True)
    rt_series, rt_fits = gap_series(settings, "rounds_to_target", point_label, log_y=True)
    order = registry_order("algorithm")
    doc.add_file("spectral_accuracy.png", plots.gap_scatter(acc_series, doc.plot_dir / "spectral_accuracy.png",
                                                            ylabel="final test accuracy (%)",
                                                            title="Final accuracy vs spectral gap", order=order))
    if cd_series:
        doc.add_file("spectral_consensus.png", plots.gap_scatter(cd_series, doc.plot_dir / "spectral_consensus.png",
                                                                 ylabel="final consensus distance", logy=True,
                                                                 title="Consensus distance vs spectral gap",
                                                                 order=order))
    if rt_series:
        doc.add_file("spectral_rounds.png", plots.gap_scatter(rt_series, doc.plot_dir / "spectral_rounds.png",
                                                              ylabel=f"rounds to {target_text} test accuracy",
                                                              logy=True, title="Rounds to target vs spectral gap",
                                                              order=order))
    doc.add("## Trends (least squares over the setting means, within a client count)\n\nFinal accuracy (%) "
            "at the round budget:\n\n" + ("\n".join(acc_fits) or "- none")
            + f"\n\nRounds to {target_text} (ln y; a slope of −1 is rounds ∝ 1/(1 − λ^Q)):\n\n"
            + ("\n".join(rt_fits) or "- none (no setting reached the target)")
            + "\n\nFinal consensus distance (positive values only):\n\n" + ("\n".join(cd_fits) or "- none")
            + "\n")


def _write_spectral_csv(path: Path, table: list[SpectralRow], other: list[str], target: float | None) -> Path:
    """spectral.csv: the table's rows with their means, standard deviations and counts as numbers."""
    header = [*other, "topology", "Q", "clients", "lambda", "gap_Q", "phi", "effective_neighbors", "runs",
              "status", "test_acc_mean", "test_acc_std", "target_acc", "rounds_to_target_mean",
              "rounds_to_target_std", "reached_target", "consensus_distance_mean", "consensus_distance_std"]
    rows = []
    for r in table:
        s = r.setting
        acc, cd, rt = s.stats["test_acc"], s.stats["consensus_distance"], s.stats["rounds_to_target"]
        rows.append([*(s.values[f] for f in other), r.topology, r.Q, r.clients, r.lam, r.gap_q, r.phi,
                     r.effective_neighbors, len(s.runs), status_counts(s.runs), acc.mean, acc.std, target,
                     rt.mean, rt.std, rt.n, cd.mean, cd.std])
    return write_csv(path, header, rows)
