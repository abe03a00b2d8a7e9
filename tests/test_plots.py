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


def _drawn(monkeypatch):
    """Make plots._save keep each figure it writes, so a test can look at what was drawn."""
    saved = []
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path, *a: saved.append(fig) or save(fig, path, *a))
    return saved


def _inside(fig, text) -> bool:
    fig.canvas.draw()
    box = text.get_window_extent(fig.canvas.get_renderer())
    return 0 <= box.x0 and box.x1 <= fig.bbox.width and 0 <= box.y0 and box.y1 <= fig.bbox.height


def test_a_one_seed_figure_claims_no_spread_and_several_seeds_do(tmp_path, monkeypatch):
    saved = _drawn(monkeypatch)
    one = {"ring": {"dfedsam": plots.Curve([0, 1, 2], [10.0, 20.0, 30.0], [0.0, 0.0, 0.0])}}
    several = {"ring": {"dfedsam": plots.Curve([0, 1, 2], [10.0, 20.0, 30.0], [0.0, 1.5, 2.0])}}
    plots.curves(one, tmp_path / "one.png", ylabel="accuracy (%)", title="Test accuracy")
    plots.curves(several, tmp_path / "several.png", ylabel="accuracy (%)", title="Test accuracy")
    point = [plots.Series("ring", [plots.Point(0.1, 50.0, 0.0, "a"), plots.Point(0.5, 60.0, 0.0, "b")], None)]
    plots.gap_scatter(point, tmp_path / "g1.png", ylabel="accuracy (%)", title="Final accuracy")
    point[0].points[0] = plots.Point(0.1, 50.0, 2.0, "a")
    plots.gap_scatter(point, tmp_path / "g3.png", ylabel="accuracy (%)", title="Final accuracy")
    titles = [saved[0]._suptitle.get_text(), saved[1]._suptitle.get_text(), saved[2].axes[0].get_title(),
              saved[3].axes[0].get_title()]
    assert titles == ["Test accuracy", "Test accuracy (mean ± std over seeds)", "Final accuracy",
                      "Final accuracy (error bars: std over seeds)"]


def test_a_long_title_is_wrapped_inside_a_one_panel_figure(tmp_path, monkeypatch):
    saved = _drawn(monkeypatch)
    panels = {"ring": {"dfedsam": plots.Curve([0, 1], [1.0, 2.0], [0.5, 0.5])}}
    title = "Test accuracy vs simulated time of every client in the network"
    plots.curves(panels, tmp_path / "c.png", ylabel="accuracy (%)", title=title, integer_x=False)
    plots.distributions({"ring": [1.0, 2.0, 3.0]}, tmp_path / "d.png", xlabel="accuracy (%)", title=title * 2)
    curve_fig, box_fig = saved
    assert "\n" in curve_fig._suptitle.get_text() and _inside(curve_fig, curve_fig._suptitle)
    assert curve_fig._suptitle.get_text().replace("\n", " ").startswith(title)
    assert _inside(box_fig, box_fig.axes[0].title)


def test_log_panels_share_one_y_axis(tmp_path, monkeypatch):
    saved = _drawn(monkeypatch)
    panels = {"ring": {"a": plots.Curve([0, 1], [1.0, 0.5], [0.0, 0.0])},
              "full": {"a": plots.Curve([0, 1], [1e-12, 1e-13], [0.0, 0.0])},
              "none": {"a": plots.Curve([0, 1], [0.0, 0.0], [0.0, 0.0])}}
    plots.curves(panels, tmp_path / "c.png", ylabel="consensus distance", title="Consensus distance", logy=True)
    ring, full, none = saved[0].axes[:3]
    assert ring.get_yscale() == full.get_yscale() == "log"
    assert ring.get_ylim() == full.get_ylim() and ring.get_ylim()[0] < 1e-12 < 1 <= ring.get_ylim()[1]
    assert none.get_title() == "none (all zero: not on the log axis)"
