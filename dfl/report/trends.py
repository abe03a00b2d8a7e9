"""Spectral-gap trends: the gap 1 − λ^Q of a setting and least-squares fits of a metric on it.

The gap 1 − λ^Q of a setting, least-squares fits of a metric on ln(1 − λ^Q) (`fit_log_trend`) and the plotted series of
setting means against the gap.

A trend is fitted within one client count m (and one combination of the other varied fields), never across
client counts: λ and the consensus distance both depend on m, so pooling m = 16 and m = 64 into one regression
mixes two effects. A fit needs MIN_FIT_POINTS distinct gaps (a line through 2 points has R² = 1 by
construction) and is reported with its number of points and a 95% confidence interval for the slope.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from dfl.report import plots
from dfl.report.layout import label
from dfl.report.settings import Setting, varying_fields

# Fields that set the spectral gap: a spectral-gap trend is fitted across them, within each combination of
# the other varied fields.
GAP_FIELDS = ("topology", "weights", "topology_options", "gossip_steps", "clients")
EXACT_AVERAGING = 1e-12  # λ^Q below this is exact averaging (topologies.spectral.ROUNDOFF)
MIN_FIT_POINTS = 3  # distinct x values a trend needs (2 points always fit exactly)


@dataclass
class Fit:
    """y = a + b·ln(x) by least squares (log_y: ln y = a + b·ln x).

    R2 = coefficient of determination; n points; b_ci = the 95% confidence interval of the slope b (Student t with n − 2
    degrees of freedom).
    """

    a: float
    b: float
    r2: float | None
    log_y: bool = False
    n: int = 0
    b_ci: tuple[float, float] | None = None

    def __call__(self, x: float) -> float:
        """The trend's value at `x`: a + b·ln x (exp of it for a fit on ln y)."""
        y = self.a + self.b * math.log(x)
        return math.exp(y) if self.log_y else y


def fit_log_trend(xs: list[float], ys: list[float], log_y: bool = False) -> Fit | None:
    """Least squares of y (or ln y) on ln x over the points with x > 0 (and y > 0 when log_y).

    None when fewer than MIN_FIT_POINTS distinct x remain. The slope's 95% interval is b ± t(0.975, n − 2)·se(b), se(b)²
    = (SS_res/(n − 2))/Σ(ln x − mean)².
    """
    from scipy.stats import t as student_t

    pts = [(math.log(x), math.log(y) if log_y else y) for x, y in zip(xs, ys) if x > 0 and (y > 0 or not log_y)]
    if len({p[0] for p in pts}) < MIN_FIT_POINTS:
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
    half = float(student_t.ppf(0.975, n - 2)) * math.sqrt(ss_res / (n - 2) / sxx)
    return Fit(a, b, 1 - ss_res / ss_tot if ss_tot > 0 else None, log_y, n, (b - half, b + half))


def describe_fit(fit: Fit, y: str = "y") -> str:
    """"y = a − b·ln(1 − λ^Q); slope 95% CI [lo, hi]; R² = r; n = N points" for reports and legends."""
    r2 = "—" if fit.r2 is None else f"{fit.r2:.3f}"
    sign = "−" if fit.b < 0 else "+"
    lo, hi = fit.b_ci if fit.b_ci else (float("nan"), float("nan"))
    return (f"{y} = {fit.a:.3g} {sign} {abs(fit.b):.3g}·ln(1 − λ^Q); slope 95% CI [{lo:.3g}, {hi:.3g}]; "
            f"R² = {r2}; n = {fit.n} points")


def gap_of(setting: Setting) -> float | None:
    """1 − λ^Q of a setting: 1 − the mean over its runs of summary.json lambda_Q."""
    lam_q = setting.stats["lambda_Q"].mean
    return None if lam_q is None else 1.0 - lam_q


def gap_series(settings: list[Setting], metric: str, point_label: Callable[[Setting], str],
                scale: float = 1.0, log_y: bool = False) -> tuple[list[plots.Series], list[str]]:
    """Series of (1 − λ^Q, metric mean ± std) points, and a line on each series' trend.

    One series per combination of the varied non-gap fields and client count (trends are fitted within a client count),
    each with its `fit_log_trend`; and one Markdown line per series saying what was fitted, or why not.
    """
    varying = varying_fields(settings)
    other = [f for f in varying if f not in GAP_FIELDS] + (["clients"] if "clients" in varying else [])
    groups: dict[str, list[Setting]] = {}
    for s in settings:
        name = label(s.values, other) if other else "runs"
        if other == ["clients"]:  # a bare number would not say what it is
            name = f"clients={name}"
        groups.setdefault(name, []).append(s)
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
            text = describe_fit(fit, "ln y" if log_y else "y")
            lo, hi = fit.b_ci if fit.b_ci else (float("nan"), float("nan"))
            trend = plots.Trend(fit, f"least squares, slope 95% CI [{lo:.3g}, {hi:.3g}]")
            notes.append(f"- {name}: {text}")
        elif points:
            distinct = len({round(p.x, 12) for p in fitted})
            notes.append(f"- {name}: not fitted ({distinct} distinct gap(s); a trend needs {MIN_FIT_POINTS})")
        if points:
            series.append(plots.Series(name, points, trend))
    return series, notes


def distinct_gaps(settings: list[Setting]) -> int:
    """The number of distinct spectral gaps 1 − λ^Q among `settings` (to 12 decimals)."""
    return len({round(g, 12) for g in (gap_of(s) for s in settings) if g is not None})
