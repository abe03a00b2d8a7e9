"""The `dfl topology` command."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest

from dfl.cli import main
from dfl.cli.topology import COLUMNS
from topologies import build, phi


def run_json(capsys, *argv):
    assert main(["topology", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_single_topology_table(capsys):
    assert main(["topology", "ring", "--clients", "64", "--gossip-steps", "4"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0].startswith("Q = 4 gossip step(s)")
    assert lines[1].split()[:4] == ["topology", "n", "weights", "degree"]
    row = lines[2].split()
    lam = 1 / 3 + 2 / 3 * math.cos(2 * math.pi / 64)
    assert row[:4] == ["ring", "64", "metropolis", "2/2/2"]
    assert float(row[4]) == pytest.approx(lam, abs=1e-4)
    assert float(row[6]) == pytest.approx(lam**4, abs=1e-4)
    steps = [key for key, _ in COLUMNS].index("consensus_steps")  # a row's cells have no spaces
    assert int(row[steps]) == math.ceil(math.log(0.1) / math.log(lam))  # gossip steps until lambda^T <= eps = 0.1


def test_json_values_match_the_library(capsys):
    (row,) = run_json(capsys, "grid", "--clients", "16", "--periodic", "-Q", "2", "--gamma", "0.9",
                      "--eps", "0.01")
    topo = build("grid", 16, periodic=True)
    lam = topo.second_eigenvalue()
    assert row["topology"] == "grid" and row["n"] == 16 and row["degree"] == [4, 4.0, 4]
    assert row["lambda"] == pytest.approx(lam) and row["spectral_gap"] == pytest.approx(1 - lam)
    assert row["gossip_lambda"] == pytest.approx(lam**2)
    assert row["phi"] == pytest.approx(phi(lam, 16, 2))
    assert row["effective_neighbors"] == pytest.approx(topo.effective_neighbors(0.9))
    assert row["consensus_steps"] == topo.consensus_steps(0.01)
    assert (row["Q"], row["gamma"], row["eps"]) == (2, 0.9, 0.01)


def test_options_and_weights_reach_build(capsys):
    (row,) = run_json(capsys, "random-regular", "--clients", "20", "--degree", "3", "--seed", "5",
                      "--weights", "lazy", "--base", "max-degree")
    assert row["weights"] == "lazy(max-degree)"
    expected = build("random-regular", 20, weights="lazy", degree=3, seed=5, base="max-degree")
    assert row["lambda"] == pytest.approx(expected.second_eigenvalue())
    (row,) = run_json(capsys, "grid", "--clients", "12", "--shape", "2", "6")
    assert row["lambda"] == pytest.approx(build("grid", 12, shape=(2, 6)).second_eigenvalue())


def test_undefined_values_are_null(capsys):
    (row,) = run_json(capsys, "random-k", "--clients", "8", "--k", "2")
    assert row["lambda"] is None and row["phi"] is None and row["effective_neighbors"] is None
    assert 0 <= row["gossip_lambda"] <= 1 and row["consensus_steps"] >= 1
    assert main(["topology", "random-k", "--clients", "8", "--k", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[4] == "-"


def test_compare_table_and_plot(capsys, tmp_path):
    plot = tmp_path / "gap.png"
    argv = ["topology", "compare", "--clients", "16", "32", "--topologies", "ring", "exponential", "full",
            "random-regular", "--degree", "4", "--plot", str(plot)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[:2] for line in lines[2:]] == [
        ["ring", "16"], ["ring", "32"], ["exponential", "16"], ["exponential", "32"], ["full", "16"],
        ["full", "32"], ["random-regular", "16"], ["random-regular", "32"]]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = run_json(capsys, "compare", "--clients", "8", "16")
    assert [r["topology"] for r in rows] == ["ring", "ring", "grid", "grid", "exponential", "exponential",
                                            "full", "full"]
    assert rows[-1]["lambda"] == 0.0 and rows[-1]["consensus_steps"] == 0


def test_infinite_values_in_json(capsys, tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("0 1\n")
    (row,) = run_json(capsys, "custom", "--path", str(path))
    assert row["n"] == 2 and row["lambda"] == 0.0
    assert phi(1.0, 2, 1) == math.inf  # inf is written as "inf"; a valid topology never has lambda = 1


@pytest.mark.parametrize("argv, message", [
    (["hypercube", "--clients", "12"], "hypercube needs n to be a power of 2"),
    (["ring", "--clients", "8", "--degree", "3"], "unknown option(s) degree for topology 'ring'"),
    (["ring"], "--clients is required"),
    (["ring", "--clients", "0"], "--clients must be integers >= 1"),
    (["compare", "--clients", "8", "--topologies", "ring", "torus"], "--topologies: unknown torus; allowed:"),
    (["ring", "--clients", "8", "--topologies", "grid"], "--topologies only applies to 'dfl topology"),
    (["star", "--clients", "8", "--weights", "uniform"], "not doubly stochastic on the irregular star"),
    (["ring", "--clients", "8", "-Q", "0"], "Q (gossip steps) must be an integer >= 1"),
    (["ring", "--clients", "8", "--gamma", "1"], "gamma must be a number with 0 <= gamma < 1"),
    (["erdos-renyi", "--clients", "64", "--p", "0.01"], "is disconnected"),
    # matplotlib's own "Format 'txt' is not supported ..." after the analysis, naming neither flag nor file, before
    (["ring", "--clients", "8", "--plot", "gap.txt"], "--plot gap.txt: unsupported extension '.txt'; use one of .png"),
    (["draw", "ring", "--clients", "8", "--out", "ring.jpg"], "--out ring.jpg: unsupported extension '.jpg'"),
])
def test_bad_input_is_a_clear_error(capsys, argv, message):
    assert main(["topology", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dfl topology: error: ") and message in captured.err
    assert "Traceback" not in captured.err


def test_argparse_errors_exit_nonzero(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["topology", "torus", "--clients", "8"])
    assert exc.value.code == 2
    assert "invalid choice: 'torus'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["topology", "ring", "--clients", "8", "--weights", "hastings"])
    assert exc.value.code == 2


def test_console_script():
    exe = shutil.which("dfl")
    cmd = [exe] if exe else [sys.executable, "-m", "dfl.cli"]
    proc = subprocess.run([*cmd, "topology", "ring", "--clients", "8"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    row = proc.stdout.strip().splitlines()[2].split()
    assert row[:2] == ["ring", "8"] and float(row[4]) == pytest.approx(0.8047, abs=1e-4)


def test_compare_skips_a_grid_that_does_not_exist_at_a_prime_count(capsys):
    assert main(["topology", "compare", "--clients", "16", "17", "--topologies", "ring", "grid", "--json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [(r["topology"], r["n"]) for r in rows] == [("ring", 16), ("ring", 17), ("grid", 16)]
    assert "skipped grid on 17 clients" in captured.err and "16 (4 × 4) or 18 (3 × 6)" in captured.err
    assert main(["topology", "grid", "--clients", "17"]) == 2
    assert "is prime" in capsys.readouterr().err


def test_compare_reports_the_measures_of_finite_time_topologies(capsys):
    """base-graph is exact after its period at every n; one-peer-exponential only at powers of 2; a single step of
    either has ||W_t - J||_2 = 1; peers, bytes per round and steps from a random start are the measured ones."""
    rows = run_json(capsys, "compare", "--clients", "16", "24", "--topologies", "base-graph", "one-peer-exponential",
                    "exponential", "od-equidyn", "-Q", "2", "--params", "1000")
    by = {(r["topology"], r["n"]): r for r in rows}
    assert by[("base-graph", 16)]["exact_steps"] == 4 and by[("base-graph", 24)]["exact_steps"] == 6
    assert by[("one-peer-exponential", 16)]["exact_steps"] == 4
    assert by[("one-peer-exponential", 24)]["exact_steps"] is None
    assert by[("one-peer-exponential", 24)]["period_norm"] == pytest.approx(
        build("one-peer-exponential", 24).gossip_lambda(5))
    assert by[("base-graph", 24)]["period_norm"] == 0.0 and by[("base-graph", 24)]["step_norm"] == pytest.approx(1)
    assert by[("exponential", 16)]["exact_steps"] is None and by[("exponential", 16)]["peers"] == [4, 4.0]
    assert by[("base-graph", 16)]["peers"] == [1, 1.0]
    assert by[("exponential", 16)]["bytes_per_round"] == 16 * 4 * 2 * 4 * 1000  # n x peers x Q x fp32 x params
    assert by[("base-graph", 16)]["random_start_steps"] == 4  # exact after 4 steps, from any start
    assert by[("od-equidyn", 24)]["period_norm"] is None and by[("od-equidyn", 24)]["random_start_steps"] > 4
    assert main(["topology", "compare", "--clients", "24", "--topologies", "base-graph", "matcha"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "exact" in header and "peers max/mean" in header and "bytes/round" in header


def test_new_topology_flags_reach_build(capsys):
    (row,) = run_json(capsys, "d-equistatic", "--clients", "20", "--M", "5", "--seed", "3")
    assert row["lambda"] == pytest.approx(build("d-equistatic", 20, M=5, seed=3).second_eigenvalue())
    (row,) = run_json(capsys, "u-equistatic", "--clients", "20", "--epsilon", "0.6", "--delta", "0.2")
    assert row["lambda"] == pytest.approx(build("u-equistatic", 20, epsilon=0.6, delta=0.2).second_eigenvalue())
    (row,) = run_json(capsys, "base-graph", "--clients", "30", "--k", "2")
    assert row["exact_steps"] == build("base-graph", 30, k=2).period
    (row,) = run_json(capsys, "matcha", "--clients", "12", "--graph", "ring", "--budget", "0.4")
    assert row["weights"] == "given" and row["peers"][0] <= 2
    assert main(["topology", "base-graph", "--clients", "8", "--weights", "metropolis"]) == 2
    assert "defines its own weights" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["ring", "--clients", "6", "8", "--plot"], ["draw", "ring", "--clients", "6",
                                                                                  "--out"]])
def test_plot_and_draw_treat_an_output_path_alike(tmp_path, capsys, command):
    """--plot and draw's --out make missing parent directories (as dfl run --out, dfl report --out and every file dfl
    writes do), refuse a path under a file and never replace a file dfl did not write."""
    flag = command[-1]
    new = tmp_path / "missing" / "dir" / "x.png"
    assert main(["topology", *command, str(new)]) == 0, capsys.readouterr().err
    assert new.read_bytes().startswith(b"\x89PNG")
    assert main(["topology", *command, str(new)]) == 0  # its own figure: replaced
    capsys.readouterr()
    blocker = tmp_path / "a-file"
    blocker.write_text("mine\n")
    assert main(["topology", *command, str(blocker / "x.png")]) == 2
    assert capsys.readouterr().err == f"dfl topology: error: {flag} {blocker / 'x.png'}: {blocker} is a file, not a " \
                                      "directory\n"
    users = tmp_path / "users.png"
    users.write_bytes(b"\x89PNG not dfl's")
    assert main(["topology", *command, str(users)]) == 2
    assert "is an existing file that dfl did not write" in capsys.readouterr().err
    assert users.read_bytes() == b"\x89PNG not dfl's" and blocker.read_text() == "mine\n"
