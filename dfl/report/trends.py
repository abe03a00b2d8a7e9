"""Spectral-gap trends: the gap 1 − λ^Q of a setting, least-squares fits of a metric on ln(1 − λ^Q)
(`fit_log_trend`) and the plotted series of setting means against the gap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dfl import plots
from dfl.report.layout import label
from dfl.report.settings import Setting, varying_fields

# Fields that set the spectral gap: a spectral-gap trend is fitted across them, within each combination of
# the other varied fields.
GAP_FIELDS = ("topology", "weights", "topology_options", "gossip_steps", "clients")
EXACT_AVERAGING = 1e-12  # λ^Q below this is exact averaging (topologies.spectral.ROUNDOFF)


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
