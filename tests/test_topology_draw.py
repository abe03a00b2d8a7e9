"""`dfl topology draw` and `topologies.draw`: figures of a topology, and the analysis rows of directed W."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import matplotlib
import pytest

matplotlib.use("Agg")

import topologies  # noqa: E402
from dfl.cli import main  # noqa: E402
from dfl.directories import figure_written_by_dfl  # noqa: E402
from topologies.draw import draw  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name,options,panels", [
    ("ring", {}, 1), ("one-peer-exponential", {}, 4), ("random-pull", {"k": 2}, 4),
    ("hierarchical", {"groups": 3, "outer": "ring"}, 1), ("directed-ring", {}, 1),
])
def test_draw_makes_one_panel_per_step(tmp_path, monkeypatch, name, options, panels):
    import matplotlib.figure

    seen = []
    saved = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        seen.append(sum(1 for ax in fig.axes if ax.collections))  # the panels that have nodes drawn
        return saved(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    path = draw(topologies.build(name, 9, **options), tmp_path / f"{name}.png")
    assert path.read_bytes()[:8] == PNG and seen == [panels]


def test_the_title_names_a_one_sided_kind_once():
    from topologies.draw import default_title

    assert default_title(topologies.build("random-pull", 10, k=2)) == "random-pull, n = 10, weights row-stochastic"
    assert default_title(topologies.build("ring", 8)) == "ring, n = 8, weights metropolis"
    sample = topologies.build("star", 4, weights="sample-count", sizes=[1, 2, 3, 4])
    assert default_title(sample) == "star, n = 4, weights sample-count, row-stochastic"


def test_draw_svg_and_the_arrows_of_a_directed_w(tmp_path):
    svg = draw(topologies.build("directed-ring", 6), tmp_path / "ring.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    with pytest.raises(ValueError, match="unsupported extension '.jpg'"):
        draw(topologies.build("ring", 6), tmp_path / "ring.jpg")
    with pytest.raises(ValueError, match="readable up to 256"):
        draw(topologies.build("ring", 300), tmp_path / "big.png")
    with pytest.raises(ValueError, match="steps must be an integer in 1..16"):
        draw(topologies.build("one-peer", 8), tmp_path / "x.png", steps=0)


def test_cli_draw_and_its_refusals(tmp_path, capsys):
    out = tmp_path / "one-peer.png"
    assert main(["topology", "draw", "one-peer", "--clients", "8", "--graph", "ring", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG and f"wrote {out}" in capsys.readouterr().out
    column = tmp_path / "column.png"  # a column-stochastic W: refused by runs, drawn and analysed here
    assert main(["topology", "draw", "star", "--clients", "6", "--weights", "column-stochastic", "--out",
                 str(column)]) == 0
    assert column.exists()
    for argv, message in [
        (["draw", "--clients", "8", "--out", "x.png"], "'dfl topology draw' needs a topology name"),
        (["ring", "--clients", "8", "--out", "x.png"], "--out only apply to 'dfl topology draw NAME'"),
        (["draw", "ring", "--clients", "8", "16", "--out", "x.png"], "give one --clients N"),
    ]:
        assert main(["topology", *argv]) == 2
        assert message in capsys.readouterr().err


def test_a_drawing_without_out_goes_into_a_new_file_under_runs(tmp_path, capsys):
    # the current directory is tmp_path (tests/cwd_guard.py): runs/ is made there
    assert main(["topology", "draw", "ring", "--clients", "6"]) == 0
    assert main(["topology", "draw", "ring", "--clients", "6"]) == 0  # the same second: -2
    drawn = sorted((tmp_path / "runs").iterdir(), key=lambda path: path.stat().st_mtime_ns)
    assert [re.fullmatch(r"topology-ring-\d{8}-\d{6}(-2)?\.png", path.name) is not None for path in drawn] == [True] * 2
    assert all(path.read_bytes()[:8] == PNG for path in drawn)
    assert capsys.readouterr().out.splitlines() == [f"wrote runs/{path.name}" for path in drawn]
    assert main(["topology", "draw", "ring", "--clients", "300"]) == 2  # refused: the reserved file is removed
    assert "readable up to 256" in capsys.readouterr().err
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_analysis_rows_of_one_sided_w(capsys):
    assert main(["topology", "star", "--clients", "8", "--weights", "row-stochastic", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["stochastic"] == "row" and row["phi"] is None and row["effective_neighbors"] is None
    assert row["pi_spread"] == pytest.approx([8 / 11, 32 / 11])  # leaves 1/11, centre 4/11 of the consensus
    assert 0 < row["lambda"] < 1 and row["sigma2"] > 0
    assert main(["topology", "exponential", "--clients", "16", "--exponent-base", "4", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["stochastic"] == "doubly" and row["pi_spread"] == pytest.approx([1, 1])
    assert row["sigma2"] == pytest.approx(row["lambda"])  # sigma_2 = ||W - J|| for a doubly stochastic W
    assert main(["topology", "hierarchical", "--clients", "12", "--groups", "3", "--inner", "ring"]) == 0
    assert "hierarchical" in capsys.readouterr().out


def test_the_cli_imports_no_torch_to_draw(tmp_path):
    code = ("import sys; from dfl.cli import main; rc = main(['topology', 'draw', 'ring', '--clients', '5', '--out', "
            f"{str(tmp_path / 'r.png')!r}]); print(rc, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split()[-2:] == ["0", "False"], proc.stderr


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_draw_replaces_its_own_figure_but_never_a_users_file(tmp_path, capsys, suffix):
    ours, theirs = tmp_path / f"ours{suffix}", tmp_path / f"theirs{suffix}"
    argv = ["topology", "draw", "ring", "--clients", "5", "--out"]
    assert main([*argv, str(ours)]) == 0 and figure_written_by_dfl(ours)  # marked as dfl's (Software / Creator)
    assert main([*argv, str(ours)]) == 0  # a figure dfl drew is drawn again
    drawn_by_matplotlib = tmp_path / f"plain{suffix}"  # a figure of the user's own, made with matplotlib
    draw(topologies.build("ring", 5), drawn_by_matplotlib)
    theirs.write_bytes(b"my figure")
    for path in (theirs, drawn_by_matplotlib):
        data = path.read_bytes()
        assert main([*argv, str(path)]) == 2
        assert "is an existing file that dfl did not write" in capsys.readouterr().err
        assert path.read_bytes() == data
    assert main([*argv, str(tmp_path)]) == 2 and "is a directory" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([ours.name, theirs.name, drawn_by_matplotlib.name])
