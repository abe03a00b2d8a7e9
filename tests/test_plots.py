"""Figures people read: one colour per algorithm across figures, labels that cover no marker and no other label,
legends outside the axes."""

from __future__ import annotations

import math

from dfl.report import plots


def test_palette_gives_an_algorithm_one_colour_in_every_figure():
    order = ("dpsgd", "dfedavg", "dfedsam", "fedavg")
    one = plots.palette(["dfedsam", "fedavg"], order)
    other = plots.palette(["fedavg", "custom", "dpsgd", "dfedsam"], order)
    assert one["dfedsam"] == other["dfedsam"] == plots.PALETTE[2]
    assert one["fedavg"] == other["fedavg"]
    assert other["custom"] not in {other["fedavg"], other["dpsgd"], other["dfedsam"]}
    assert len(set(plots.palette([f"s{i}" for i in range(12)]).values())) == 12


def _boxes(fig, ax):
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in ax.texts]


def test_labels_cover_no_marker_and_no_other_label():
    fig = plots._figure(7.0, 4.8)
    ax = fig.subplots()
    pts = [(0.01 * 1.15**k, 60 + 0.3 * k, f"ring Q={k} m=16", "C0") for k in range(8)]  # a tight cluster
    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o")
    ax.set_xscale("log")
    ax.set_xlim(0.005, 0.05)
    ax.set_ylim(55, 70)
    plots._place_labels(fig, ax, pts)
    fig.canvas.draw()
    boxes = _boxes(fig, ax)
    assert len(boxes) == len(pts)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)
        for x, y, _, _ in pts:
            px, py = ax.transData.transform((x, y))
            assert not (a.x0 < px < a.x1 and a.y0 < py < a.y1)


def test_gap_scatter_puts_the_legend_outside_the_axes(tmp_path, monkeypatch):
    saved = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig) or save(fig, path))
    series = [plots.Series(name, [plots.Point(g, 50 + 10 * math.log10(g) + i, 1.0, f"{name} {g}")
                                  for g in (0.01, 0.1, 1.0)], None) for i, name in enumerate(("dfedsam", "dfedavg"))]
    path = plots.gap_scatter(series, tmp_path / "g.png", ylabel="accuracy (%)", title="t", order=("dfedavg",))
    assert path.stat().st_size > 5000
    (fig,) = saved
    (ax,) = fig.axes
    assert ax.get_legend() is None and len(fig.legends) == 1  # a figure legend, below the axes
    renderer = fig.canvas.get_renderer()
    assert fig.legends[0].get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0 + 1
    assert [line.get_color() for line in ax.lines[:1]] == [plots.PALETTE[1]]  # dfedsam: not in order, first free
