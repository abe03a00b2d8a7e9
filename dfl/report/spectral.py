"""The spectral-gap study (`write_spectral_report`): λ, 1 − λ^Q, Φ(λ, m, Q) and effective neighbours of each
setting against its final accuracy and consensus distance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from dfl.config import Config
from dfl.files import atomic_write_text
from dfl.report import plots
from dfl.report.layout import _order, _registry_order, _sort_key, format_value
from dfl.report.metrics import _number
from dfl.report.runs import missing_sweep_runs
from dfl.report.settings import CONFIG_FIELDS, Setting, _canon, check_target, default_target, varying_fields
from dfl.report.tables import NOT_COMPLETED_MARK, _status_counts, _write_csv, format_stat, markdown_table
from dfl.report.trends import GAP_FIELDS, _distinct_gaps, _gap_series, gap_of
from dfl.report.write import _not_completed_section, _prepare


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
    (`dfl.engine.setup.build_topology`); Q and m are the run's resolved `gossip_steps` and `clients` (summary.json).

    λ = `Topology.second_eigenvalue()` (‖W − J‖₂; a periodic schedule's per-step rate), falling back to
    summary.json `lambda` when the topology cannot be rebuilt; 1 − λ^Q = 1 − summary.json `lambda_Q`, the
    contraction of a round's Q gossip steps (= λ^Q for a static symmetric W), averaged over the seeds. Φ and n_W
    are None ("—") where undefined (random-k has no period). A random graph drawn per seed (random-regular,
    erdos-renyi) is rebuilt for the first run's seed."""
    from dfl.engine.setup import build_topology

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
    """The spectral-gap study of the runs under `path` (e.g. a `dfl spectral-study` sweep), into `out` (default
    PATH/report/): spectral.md and spectral.csv (one row per setting: [other varied fields], topology, Q,
    clients, λ, 1 − λ^Q, Φ(λ, m, Q), effective neighbours, final accuracy, rounds to `target_acc` (default:
    `default_target`) and final consensus distance, mean ± std over seeds) and three views against 1 − λ^Q on a
    log axis: plots/spectral_accuracy.png (final accuracy at the round budget: mixes convergence speed and the
    limit reached), plots/spectral_rounds.png (rounds to the target: the speed the theory's rates speak to) and
    plots/spectral_consensus.png. Trends are fitted within one client count (`dfl.report.trends`)."""
    path, out_dir, runs, settings = _prepare(path, out)
    target = check_target(target_acc) if target_acc is not None else default_target(settings)
    for s in settings:
        s.aggregate(target)
    missing = missing_sweep_runs(path, runs)
    md = [f"# Spectral-gap study: {path}\n"]
    files: dict[str, Path] = {}
    if not settings:
        md.append(f"{len(runs)} run(s), none with metrics yet.\n")
        md.append(_not_completed_section(runs, missing))
        files["spectral.md"] = out_dir / "spectral.md"
        atomic_write_text(files["spectral.md"], "\n".join(part for part in md if part))
        return files

    other = [f for f in varying_fields(settings) if f not in GAP_FIELDS]
    cache: dict[str, tuple] = {}
    table = [spectral_quantities(s, cache) for s in settings]
    order = _order(settings, other) if other else [()]
    rank = {k: i for i, k in enumerate(order)}
    topo_order = _sort_key([s.values["topology"] for s in settings], "topology")
    table.sort(key=lambda r: (rank[tuple(_canon(r.setting.values[f]) for f in other)],
                              topo_order(r.setting.values["topology"]), r.Q or 0, r.clients or 0))

    target_text = "—" if target is None else f"{100 * target:.2f}%"
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
    md.append(
        f"{len(runs)} run(s) in {len(settings)} setting(s), mean ± sample standard deviation over seeds. λ = "
        "‖W − J‖₂ (per-step rate of a periodic schedule), 1 − λ^Q = 1 − the contraction of one round's Q gossip "
        "steps (summary.json lambda_Q), Φ(λ, m, Q) = (λ^Q + 1)/((1 − λ)² m^(2(Q−1))) + (λ^Q + 1)/(1 − λ^Q)² "
        "(DFedSAM-MGS bound), effective neighbours n_W(γ = 0.951) (Vogels et al. 2022). Rounds to "
        f"{target_text}: the first evaluated round whose test accuracy reaches it, mean over the k of n seeds that "
        "reached it (target " + ("given" if target_acc is not None else "by default 0.9 × the lowest mean final "
                                 "accuracy") + ").\n"
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
        rt_series, rt_fits = _gap_series(settings, "rounds_to_target", point_label, log_y=True)
        files["spectral_accuracy.png"] = plots.gap_scatter(acc_series, plot_dir / "spectral_accuracy.png",
                                                           ylabel="final test accuracy (%)",
                                                           title="Final accuracy vs spectral gap",
                                                      order=_registry_order("algorithm"))
        if cd_series:
            files["spectral_consensus.png"] = plots.gap_scatter(cd_series, plot_dir / "spectral_consensus.png",
                                                                ylabel="final consensus distance", logy=True,
                                                                title="Consensus distance vs spectral gap",
                                                                order=_registry_order("algorithm"))
        if rt_series:
            files["spectral_rounds.png"] = plots.gap_scatter(rt_series, plot_dir / "spectral_rounds.png",
                                                             ylabel=f"rounds to {target_text} test accuracy",
                                                             logy=True, title="Rounds to target vs spectral gap",
                                                             order=_registry_order("algorithm"))
        md.append("## Trends (least squares over the setting means, within a client count)\n\nFinal accuracy (%) "
                  "at the round budget:\n\n" + ("\n".join(acc_fits) or "- none")
                  + f"\n\nRounds to {target_text} (ln y; a slope of −1 is rounds ∝ 1/(1 − λ^Q)):\n\n"
                  + ("\n".join(rt_fits) or "- none (no setting reached the target)")
                  + "\n\nFinal consensus distance (positive values only):\n\n" + ("\n".join(cd_fits) or "- none")
                  + "\n")
    else:
        md.append("Not plotted: fewer than 2 distinct spectral gaps 1 − λ^Q among the settings.\n")
    md.append(_not_completed_section(runs, missing))

    files["spectral.md"] = out_dir / "spectral.md"
    atomic_write_text(files["spectral.md"], "\n".join(part for part in md if part))
    csv_header = [*other, "topology", "Q", "clients", "lambda", "gap_Q", "phi", "effective_neighbors", "runs",
                  "status", "test_acc_mean", "test_acc_std", "target_acc", "rounds_to_target_mean",
                  "rounds_to_target_std", "reached_target", "consensus_distance_mean", "consensus_distance_std"]
    csv_rows = []
    for r in table:
        s = r.setting
        acc, cd, rt = s.stats["test_acc"], s.stats["consensus_distance"], s.stats["rounds_to_target"]
        csv_rows.append([*(s.values[f] for f in other), r.topology, r.Q, r.clients, r.lam, r.gap_q, r.phi,
                         r.effective_neighbors, len(s.runs), _status_counts(s.runs), acc.mean, acc.std, target,
                         rt.mean, rt.std, rt.n, cd.mean, cd.std])
    files["spectral.csv"] = _write_csv(out_dir / "spectral.csv", csv_header, csv_rows)
    return dict(sorted(files.items(), key=lambda kv: kv[0].endswith(".png")))
