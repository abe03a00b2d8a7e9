"""PNG figures for reports, drawn with matplotlib's Agg canvas (no pyplot: no global state, no display).

The functions take plain data (curves, points, samples, loss grids), so they know nothing of run directories;
`dfl.report` and `dfl landscape` compute what they draw.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, cast

from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import FuncFormatter, MaxNLocator

from dfl.directories import figure_metadata
from dfl.files import atomic_write_bytes

MAX_COLUMNS = 4  # panels per row of a multi-panel figure
DPI = 120


class Curve(NamedTuple):
    """A line of `curves`: the mean over seeds at each x, and the std drawn as a band (all 0 with one seed)."""

    x: list[float]
    mean: list[float]
    std: list[float]


class Point(NamedTuple):
    """A marker of `gap_scatter` at (x, y) with error bar ± yerr (0 with one seed), annotated with `text`."""

    x: float
    y: float
    yerr: float
    text: str


class Trend(NamedTuple):
    """A fitted trend of a `Series`: `fn` gives y at x, `label` names it in the legend."""

    fn: Callable[[float], float]
    label: str


class Series(NamedTuple):
    """The points of one setting (e.g. an algorithm) in `gap_scatter`, with an optional trend line."""

    label: str
    points: list[Point]
    trend: Trend | None


def _figure(width: float, height: float) -> Figure:
    """A figure of `width` × `height` inches on an Agg canvas, laid out by matplotlib's constrained layout."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _renderer(fig: Figure) -> RendererAgg:
    """The Agg renderer of a figure made by `_figure`, to measure text and axes in display pixels."""
    return cast(FigureCanvasAgg, fig.canvas).get_renderer()


def _fit_title(fig: Figure, text: Text) -> None:
    """Wrap a title onto as many lines as it needs to lie within the figure's width (less a small margin).

    Constrained layout makes room for a title's height but not for its width: a one-panel figure is narrower than a
    long title, and the title's ends were cut off. The wrapping width in characters is scaled down from the measured
    width until the text fits; constrained layout then gives the extra lines their room when the figure is saved.
    """
    renderer = _renderer(fig)
    limit = 0.96 * fig.bbox.width
    words = text.get_text()
    columns = len(words)
    while columns > 8 and text.get_window_extent(renderer).width > limit:
        columns = min(columns - 1, int(columns * limit / text.get_window_extent(renderer).width))
        text.set_text(textwrap.fill(words, max(columns, 8)))


def spread_note(spreads: Iterable[float], note: str) -> str:
    """Return `note` (e.g. " (mean ± std over seeds)") when any spread is positive, else "".

    A figure says it shows a spread over seeds only when it draws one, so a one-seed figure (every std 0) does not
    claim one.
    """
    return note if any(v > 0 for v in spreads) else ""


def _save(fig: Figure, path: str | Path, fmt: str = "png") -> Path:
    """Write the figure to `path` atomically (`dfl.files`), marked as dfl's.

    The mark (`figure_metadata`) is how `dfl.directories` tells a figure dfl drew from a user's file.
    """
    path = Path(path)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, metadata=figure_metadata(fmt))
    atomic_write_bytes(path, buf.getvalue())
    return path


# tab10, then tab20's lighter variants of the same hues: 20 distinguishable colours
PALETTE = tuple(f"C{i}" for i in range(10)) + (
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")


def palette(names: list[str], order: tuple[str, ...] = ()) -> dict[str, str]:
    """Give each name a colour (name -> colour).

    A name in `order` (e.g. every algorithm, in registry order) always gets the colour of its position there, so one
    algorithm has one colour in every figure; other names take the unused colours in turn.
    """
    colors = {n: PALETTE[order.index(n) % len(PALETTE)] for n in names if n in order}
    free = [c for c in PALETTE if c not in colors.values()] or list(PALETTE)
    for i, n in enumerate(n for n in names if n not in colors):
        colors[n] = free[i % len(free)]
    return colors


LABEL_OFFSETS = ((5, 5), (5, -13), (-5, 5), (-5, -13), (8, -4), (-8, -4), (0, 12), (0, -20), (14, 14), (-14, 14),
                 (14, -22), (-14, -22))  # points; tried in order until a label covers no marker and no other label


def _place_labels(fig: Figure, ax, points: list[tuple[float, float, str, str]]) -> None:
    """Annotate each (x, y, text, colour) next to its marker.

    Each label goes to the first offset in LABEL_OFFSETS whose text box overlaps no marker and no label already
    placed (the least-overlapping one if none is free).
    """
    fig.canvas.draw()  # settles the constrained layout, so display coordinates are final
    renderer = _renderer(fig)
    pad = 4.0 * fig.dpi / 72  # a marker's half-size in pixels
    markers = []
    for x, y, _, _ in points:
        px, py = ax.transData.transform((x, y))
        markers.append((px - pad, py - pad, px + pad, py + pad))
    placed: list[tuple[float, float, float, float]] = []

    def overlap(a, b) -> float:
        w = min(a[2], b[2]) - max(a[0], b[0])
        h = min(a[3], b[3]) - max(a[1], b[1])
        return w * h if w > 0 and h > 0 else 0.0

    for x, y, text, color in points:
        best: tuple[float, Any, tuple[float, float, float, float]] | None = None
        for dx, dy in LABEL_OFFSETS:
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=7, color=color,
                               ha="left" if dx >= 0 else "right")
            box = note.get_window_extent(renderer)
            box = (box.x0, box.y0, box.x1, box.y1)
            axes_box = ax.get_window_extent(renderer)
            outside = box[0] < axes_box.x0 or box[2] > axes_box.x1 or box[1] < axes_box.y0 or box[3] > axes_box.y1
            cost = sum(overlap(box, m) for m in markers) + sum(overlap(box, q) for q in placed) + 1e6 * outside
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, note, box)
            else:
                note.remove()
            if cost == 0:
                break
        assert best is not None  # LABEL_OFFSETS is not empty
        placed.append(best[2])


def _legend_below(fig: Figure, axes: list[Any]) -> None:
    """One figure legend below the panels, outside them: every line label of `axes`, once, in order of appearance."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        fig.legend(list(seen.values()), list(seen.keys()), loc="outside lower center", ncol=min(len(seen), 5),
                   fontsize=9, frameon=False)


def curves(panels: dict[str, dict[str, Curve]], path: str | Path, *, ylabel: str, title: str,
           logy: bool = False, xlabel: str = "communication round", order: tuple[str, ...] = (),
           integer_x: bool = True) -> Path:
    """Draw one panel per key of `panels` (e.g. a topology) and one line per curve (e.g. an algorithm).

    A curve keeps its colour in every panel and, through `order`, in every figure (see `palette`): its mean, with a
    ± std band where the std is positive. The panels share one y axis, so their levels compare at a glance. The
    title, wrapped to the figure's width, says "mean ± std over seeds" only when a band is drawn (several seeds).

    Args:
        panels: panel title -> curve name -> `Curve`.
        path: the PNG to write.
        ylabel: the y axis' label.
        title: the figure's title.
        logy: a log y axis shared by every panel, nonpositive values hidden; a panel with no positive value says so
            in its title. Linear when no panel has a positive value.
        xlabel: the x axis' label.
        order: names whose colours are fixed by their position (see `palette`).
        integer_x: integer ticks on the x axis (rounds).

    Returns:
        `path`.
    """
    names = list(dict.fromkeys(n for p in panels.values() for n in p))
    colors = palette(names, order)
    ncols = min(len(panels), MAX_COLUMNS) or 1
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig = _figure(4.2 * ncols, 3.2 * nrows + 0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True)
    logy = logy and any(m > 0 for lines in panels.values() for c in lines.values() for m in c.mean)
    for ax, (panel, lines) in zip(axes.flat, panels.items()):
        for name, c in lines.items():
            ax.plot(c.x, c.mean, color=colors[name], label=name, marker="." if len(c.x) < 30 else None)
            if any(s > 0 for s in c.std):
                ax.fill_between(c.x, [m - s for m, s in zip(c.mean, c.std)], [m + s for m, s in zip(c.mean, c.std)],
                                color=colors[name], alpha=0.2, linewidth=0)
        positive = any(m > 0 for c in lines.values() for m in c.mean)
        if logy:
            ax.set_yscale("log", nonpositive="mask")
        ax.set_title(f"{panel} (all zero: not on the log axis)" if logy and not positive else panel, fontsize=10)
        ax.set(xlabel=xlabel, ylabel=ylabel if ax in axes[:, 0] else "")
        ax.xaxis.set_major_locator(MaxNLocator(integer=integer_x))
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    _legend_below(fig, list(axes.flat)[:len(panels)])
    spreads = (s for lines in panels.values() for c in lines.values() for s in c.std)
    _fit_title(fig, fig.suptitle(title + spread_note(spreads, " (mean ± std over seeds)")))
    return _save(fig, path)


def gap_scatter(series: list[Series], path: str | Path, *, ylabel: str, title: str, logy: bool = False,
                xlabel: str = r"spectral gap $1 - \lambda^Q$ (dimensionless)", order: tuple[str, ...] = ()) -> Path:
    """Draw points (x, y ± yerr over seeds) per series on a log x axis, each annotated with its text.

    A label goes where it covers no marker and no other label (`_place_labels`); each series' trend is drawn over
    its x range and named in the legend, which sits below the axes, outside them. The title says "error bars: std
    over seeds" only when some error bar is drawn, and is wrapped to fit the figure.

    Args:
        series: the settings to draw, one colour each (`palette(labels, order)`).
        path: the PNG to write.
        ylabel: the y axis' label.
        title: the figure's title.
        logy: a log y axis, nonpositive values hidden.
        xlabel: the x axis' label.
        order: names whose colours are fixed by their position (see `palette`).

    Returns:
        `path`.
    """
    fig = _figure(7.0, 4.8 + 0.22 * len(series))
    ax = fig.subplots()
    colors = palette([s.label for s in series], order)
    labels = []
    for s in series:
        color = colors[s.label]
        xs, ys, errs = [p.x for p in s.points], [p.y for p in s.points], [p.yerr for p in s.points]
        ax.errorbar(xs, ys, yerr=errs, fmt="o", color=color, capsize=3, label=s.label)
        labels += [(p.x, p.y, p.text, color) for p in s.points]
        if s.trend is not None and xs:
            lo, hi = min(xs), max(xs)
            grid = [lo * (hi / lo) ** (k / 49) for k in range(50)]
            ax.plot(grid, [s.trend.fn(x) for x in grid], "--", color=color, label=f"{s.label}: {s.trend.label}")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
    if logy:
        ax.set_yscale("log", nonpositive="mask")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    spreads = (p.yerr for s in series for p in s.points)
    _fit_title(fig, ax.set_title(title + spread_note(spreads, " (error bars: std over seeds)"), fontsize=11))
    ax.grid(True, which="both", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, names, loc="outside lower center", ncol=1 if len(names) > 4 else 2, fontsize=7,
                   frameon=False)
    _place_labels(fig, ax, labels)
    return _save(fig, path)


def distributions(groups: dict[str, list[float]], path: str | Path, *, xlabel: str, title: str) -> Path:
    """Draw a horizontal box plot per group (whiskers 1.5 IQR, outliers as points, the mean as a triangle).

    Returns:
        `path`.
    """
    names = list(groups)
    fig = _figure(7.0, 1.2 + 0.38 * len(names))
    ax = fig.subplots()
    ax.boxplot([groups[n] for n in names], orientation="horizontal", showmeans=True)
    ax.set_yticks(range(1, len(names) + 1), names, fontsize=8)
    ax.invert_yaxis()  # first group on top, as in the tables
    ax.set_xlabel(xlabel)
    _fit_title(fig, ax.set_title(title, fontsize=11))
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, path)


def landscape(alphas: list[float], betas: list[float], loss: list[list[float]], path: str | Path, *,
              title: str) -> Path:
    """Draw the loss contours (log-spaced levels when the loss is positive) and the 3-D surface over a grid.

    `loss[i][j]` is the loss at a = `alphas[i]`, b = `betas[j]`; the centre (0, 0), the averaged model, is
    marked.

    Returns:
        `path`.
    """
    import numpy as np

    a, b = np.meshgrid(alphas, betas, indexing="ij")
    grid = np.asarray(loss)
    fig = _figure(11.0, 4.6)
    left = fig.add_subplot(1, 2, 1)
    levels = np.geomspace(max(grid.min(), 1e-8), grid.max(), 25) if grid.max() > grid.min() > 0 else 25
    contour = left.contour(a, b, grid, levels=levels, cmap="viridis")
    left.clabel(contour, list(contour.levels)[::4], fontsize=7, fmt="%.3g")
    left.plot([0], [0], "r*", markersize=12, label="averaged model")
    left.set(xlabel="direction 1", ylabel="direction 2", title="loss contours")
    left.legend(loc="upper right", fontsize=8)
    right = fig.add_subplot(1, 2, 2, projection="3d")
    right.plot_surface(a, b, grid, cmap="viridis", linewidth=0, antialiased=True)
    right.set(xlabel="direction 1", ylabel="direction 2", zlabel="loss", title="loss surface")
    _fit_title(fig, fig.suptitle(title, fontsize=10))
    return _save(fig, path)


def gap_vs_clients(rows: list[dict], path: str | Path) -> Path:
    """Draw the spectral gap 1 − λ against the number of clients n on log-log axes, one line per topology.

    Args:
        rows: rows of `dfl.graphs.spectral_summary` (`dfl topology compare --plot`).
        path: the figure to write, in the format its suffix names; missing parent directories are made (like
            `dfl topology draw --out`, `dfl run --out` and every file dfl writes). Whether dfl may write there (a
            new file or a figure of dfl's) is `dfl.directories.check_output_plot`'s, asked before the analysis.

    Returns:
        `path`.
    """
    fig = _figure(6, 4)
    ax = fig.add_subplot()
    for name in dict.fromkeys(row["topology"] for row in rows):
        pts = [(r["n"], r["spectral_gap"]) for r in rows if r["topology"] == name and r["spectral_gap"]]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ns = sorted({r["n"] for r in rows})
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("clients n")
    ax.set_ylabel("spectral gap 1 - lambda")
    ax.set_title(f"weights: {rows[0]['weights']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    # format from the suffix; missing parent directories are made, as for every file dfl writes (`dfl.files`)
    return _save(fig, path, Path(path).suffix.lstrip(".").lower() or "png")

