"""Plot data against the round and per client.

Mean ± std curves over the seeds of each setting, one panel per table column, and the per-client accuracies of the final
models.
"""

from __future__ import annotations

from dfl.report import plots
from dfl.report.layout import Layout
from dfl.report.metrics import as_number
from dfl.report.settings import Setting, Stat


def _curve(setting: Setting, key: str) -> plots.Curve:
    """Mean and sample std over seeds at every evaluated round (rounds any seed evaluated)."""
    by_round: dict[int, list[float | None]] = {}
    for run in setting.runs:
        for rec in run.metrics:
            by_round.setdefault(int(rec["round"]), []).append(as_number(rec.get(key)))
    xs: list[float] = []
    means: list[float] = []
    stds: list[float] = []
    for rnd in sorted(by_round):
        st = Stat.of(by_round[rnd])
        if st.mean is not None:
            xs.append(rnd)
            means.append(st.mean)
            stds.append(st.std or 0.0)
    return plots.Curve(xs, means, stds)


def _curve_over(setting: Setting, key: str, over: str) -> plots.Curve:
    """`key` against the metric `over` (e.g. sim_time, bytes_sent_total).

    At every evaluated round, the seeds' mean of `over` and the mean ± std of `key` over the seeds that recorded both.
    """
    by_round: dict[int, list[tuple[float, float]]] = {}
    for run in setting.runs:
        for rec in run.metrics:
            x, y = as_number(rec.get(over)), as_number(rec.get(key))
            if x is not None and y is not None:
                by_round.setdefault(int(rec["round"]), []).append((x, y))
    xs: list[float] = []
    means: list[float] = []
    stds: list[float] = []
    for rnd in sorted(by_round):  # finite pairs only: both means exist
        st, x_mean = Stat.of(y for _, y in by_round[rnd]), Stat.of(x for x, _ in by_round[rnd]).mean
        if st.mean is not None and x_mean is not None:
            xs.append(x_mean)
            means.append(st.mean)
            stds.append(st.std or 0.0)
    return plots.Curve(xs, means, stds)


def curve_panels(layout: Layout, key: str, scale: float = 1.0, over: str | None = None,
            over_scale: float = 1.0) -> dict[str, dict[str, plots.Curve]]:
    """One panel per column, one curve per row: `key` against the round, or against the metric `over`."""
    panels = {}
    for ck in layout.col_keys:
        curves = {}
        for rk in layout.row_keys:
            s = layout.cells.get((rk, ck))
            if s is not None:
                c = _curve(s, key) if over is None else _curve_over(s, key, over)
                if c.x:
                    curves[layout.row_label(rk)] = plots.Curve([over_scale * x for x in c.x],
                                                               [scale * v for v in c.mean], [scale * v for v in c.std])
        panels[layout.col_label(ck)] = curves
    return panels


def client_groups(layout: Layout) -> dict[str, list[float]]:
    """Per-client test accuracies (%) of the final record, pooled over the seeds of each setting."""
    groups = {}
    for rk in layout.row_keys:
        for ck in layout.col_keys:
            s = layout.cells.get((rk, ck))
            if s is None:
                continue
            finals = [(r.final or {}).get("client_acc") or [] for r in s.runs]
            accs = [100 * a for acc in finals for a in acc if as_number(a) is not None]
            if accs:
                name = layout.row_label(rk) if len(layout.col_keys) == 1 else f"{layout.row_label(rk)} · " \
                    f"{layout.col_label(ck)}"
                groups[name] = accs
    return groups
