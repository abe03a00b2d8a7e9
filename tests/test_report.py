"""Reports: exact table numbers from hand-written run directories (means, sample stds, rounds to target,
generalization gap, consensus, bytes), layout options, runs that are not completed, the spectral-gap table
against the closed forms for ring and full, plots written and non-empty, and one real run directory."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

import dfl
from dfl.cli import main
from dfl.config import Config
from dfl.report import ReportError, Stat, fit_log_trend, format_stat, write_report, write_spectral_report

M = 8  # clients
RING_LAMBDA = 1 / 3 + 2 / 3 * math.cos(2 * math.pi / M)  # Metropolis ring: weights 1/3, λ = max |1/3 + 2/3 cos(2πk/m)|
LAMBDA = {"ring": RING_LAMBDA, "full": 0.0}
BYTES = {"ring": 240_000, "full": 840_000}
# (algorithm, topology) -> per seed: test_acc at rounds 5, 10, 15, and the final train_acc and consensus distance
ACC = {
    ("dfedavg", "ring"): [([0.40, 0.55, 0.60], 0.70, 1e-3), ([0.42, 0.50, 0.62], 0.74, 3e-3)],
    ("dfedavg", "full"): [([0.50, 0.72, 0.70], 0.80, 0.0), ([0.52, 0.70, 0.74], 0.84, 0.0)],
    ("dfedsam", "ring"): [([0.45, 0.60, 0.66], 0.70, 2e-3), ([0.47, 0.64, 0.66], 0.72, 2e-3)],
    ("dfedsam", "full"): [([0.55, 0.75, 0.80], 0.85, 0.0), ([0.60, 0.78, 0.78], 0.83, 0.0)],
}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(path: Path, config: Config, accs: list[float], train_acc: float, consensus: float,
              status: str = "completed", Q: int = 1, extra_summary: dict | None = None) -> Path:
    """A run directory as `dfl.run` writes it, with chosen numbers (evaluated every 5 rounds)."""
    path.mkdir(parents=True)
    (path / "config.toml").write_text(config.to_toml())
    lam = LAMBDA[config.topology]
    records = []
    for i, acc in enumerate(accs):
        last = i == len(accs) - 1
        rnd = 5 * (i + 1)
        records.append({
            "round": rnd, "test_acc": acc, "test_loss": 1.0 - acc, "train_acc": train_acc if last else acc + 0.05,
            "client_acc_mean": acc - 0.01, "consensus_distance": consensus if last else 10 * consensus + 1e-4,
            "client_acc": [acc - 0.02 + 0.005 * k for k in range(M)],
            "bytes_sent_total": BYTES[config.topology] * rnd // 15, "train_loss": 0.5,
        })
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"name": config.name, "algorithm": config.algorithm, "topology": config.topology, "lambda": lam,
               "spectral_gap": 1 - lam, "gossip_steps": Q, "lambda_Q": lam**Q, "clients": M, "status": status,
               "rounds": config.rounds, "rounds_completed": 5 * len(accs), **(extra_summary or {})}
    (path / "summary.json").write_text(json.dumps(summary))
    return path


@pytest.fixture
def sweep(tmp_path) -> Path:
    """2 algorithms x 2 topologies x 2 seeds, laid out as a sweep directory."""
    root = tmp_path / "sweep"
    for (algorithm, topology), seeds in ACC.items():
        for seed, (accs, train_acc, consensus) in enumerate(seeds):
            name = f"algorithm={algorithm},topology={topology},seed={seed}"
            config = Config(name=name, seed=seed, algorithm=algorithm, topology=topology, clients=M, rounds=15)
            write_run(root / "runs" / name, config, accs, train_acc, consensus)
    return root


def table(markdown: str, heading: str) -> dict[str, dict[str, str]]:
    """The Markdown table under `## heading...` as {row label: {column label: cell}}."""
    lines = markdown.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("## " + heading))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("|") and not line.startswith("|---"):
            rows.append([c.strip() for c in line.strip("|").split(" | ")])
    header = rows[0]
    return {r[0]: dict(zip(header[1:], r[1:])) for r in rows[1:]}


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


# ---------------------------------------------------------------------------------------------- tables
def test_report_tables_exact_numbers(sweep):
    files = write_report(sweep)
    md = files["report.md"].read_text()
    assert table(md, "Final test accuracy") == {
        "dfedavg": {"ring": "61.00 ± 1.41", "full": "72.00 ± 2.83"},
        "dfedsam": {"ring": "66.00 ± 0.00", "full": "79.00 ± 1.41"},
    }
    assert table(md, "Best test accuracy") == {
        "dfedavg": {"ring": "61.00 ± 1.41", "full": "73.00 ± 1.41"},
        "dfedsam": {"ring": "66.00 ± 0.00", "full": "79.00 ± 1.41"},
    }
    # default target 0.9 x 0.61 = 54.90%: dfedavg/ring reaches it at rounds 10 and 15
    assert "## Rounds to reach 54.90% test accuracy (default: 0.9 × the lowest mean final accuracy)" in md
    assert table(md, "Rounds to reach") == {
        "dfedavg": {"ring": "12.5 ± 3.5", "full": "10 ± 0.0"},
        "dfedsam": {"ring": "10 ± 0.0", "full": "5 ± 0.0"},
    }
    assert table(md, "Generalization gap") == {
        "dfedavg": {"ring": "11.00 ± 1.41", "full": "10.00 ± 0.00"},
        "dfedsam": {"ring": "5.00 ± 1.41", "full": "5.00 ± 0.00"},
    }
    assert table(md, "Final consensus distance") == {
        "dfedavg": {"ring": "2.00e-03 ± 1.4e-03", "full": "0.00e+00 ± 0.0e+00"},
        "dfedsam": {"ring": "2.00e-03 ± 0.0e+00", "full": "0.00e+00 ± 0.0e+00"},
    }
    assert table(md, "Total bytes sent") == {
        "dfedavg": {"ring": "234.4 KiB", "full": "820.3 KiB"},
        "dfedsam": {"ring": "234.4 KiB", "full": "820.3 KiB"},
    }
    assert "8 run(s) in 4 setting(s); rows: algorithm; columns: topology" in md
    assert "n = 2 per setting" in md
    assert "Runs not completed" not in md and "†" not in md
    # two gaps per algorithm: a line through 2 points would have R² = 1 by construction, so none is fitted
    assert "- dfedavg: not fitted (2 distinct gap(s); a trend needs 3)" in md
    assert "R² = 1.000" not in md


def test_execution_settings_do_not_split_a_setting(tmp_path):
    root = tmp_path / "sweep"
    for (algorithm, topology), seeds in ACC.items():
        for seed, (accs, train_acc, consensus) in enumerate(seeds):
            execution = dict(compile=True, client_chunk=4, device="cpu") if seed else {}
            config = Config(name=f"{algorithm}-{topology}-{seed}", seed=seed, algorithm=algorithm, topology=topology,
                            clients=M, rounds=15, **execution)
            write_run(root / "runs" / config.name, config, accs, train_acc, consensus)
    md = write_report(root)["report.md"].read_text()
    assert "8 run(s) in 4 setting(s)" in md and "n = 2 per setting" in md
    assert table(md, "Final test accuracy")["dfedavg"] == {"ring": "61.00 ± 1.41", "full": "72.00 ± 2.83"}


def test_settings_and_runs_csv(sweep):
    files = write_report(sweep)
    rows = read_csv(files["settings.csv"])
    assert [(r["algorithm"], r["topology"]) for r in rows] == [
        ("dfedavg", "ring"), ("dfedavg", "full"), ("dfedsam", "ring"), ("dfedsam", "full")]
    first = rows[0]
    assert first["setting"] == "dfedavg | ring"
    assert (first["runs"], first["seeds"], first["status"]) == ("2", "0;1", "completed:2")
    assert float(first["test_acc_mean"]) == pytest.approx(0.61, abs=1e-12)
    assert float(first["test_acc_std"]) == pytest.approx(math.sqrt(2) * 0.01, abs=1e-12)
    assert float(first["rounds_to_target_mean"]) == 12.5
    assert float(first["rounds_to_target_std"]) == pytest.approx(5 / math.sqrt(2))
    assert first["rounds_to_target_n"] == "2"
    assert float(first["gen_gap_mean"]) == pytest.approx(0.11)
    assert float(first["bytes_sent_total_mean"]) == 240_000 and float(first["bytes_sent_total_std"]) == 0
    assert float(first["lambda_mean"]) == pytest.approx(RING_LAMBDA)
    assert float(first["target_acc"]) == pytest.approx(0.549)

    runs = read_csv(files["runs.csv"])
    assert len(runs) == 8
    run = runs[1]  # sweep order: dfedavg/ring seed 1
    assert run["run"] == "runs/algorithm=dfedavg,topology=ring,seed=1"
    assert (run["seed"], run["status"], run["rounds_completed"], run["rounds"]) == ("1", "completed", "15", "15")
    assert (run["test_acc"], run["best_test_acc"], run["train_acc"]) == ("0.62", "0.62", "0.74")
    assert (run["rounds_to_target"], run["bytes_sent_total"], run["final_round"]) == ("15", "240000", "15")
    assert float(run["gen_gap"]) == pytest.approx(0.12)


def test_explicit_target_partial_and_never(sweep):
    md = write_report(sweep, target_acc=0.73)["report.md"].read_text()
    assert "## Rounds to reach 73.00% test accuracy; (k/n)" in md
    assert table(md, "Rounds to reach") == {
        "dfedavg": {"ring": "—", "full": "15 (1/2)"},
        "dfedsam": {"ring": "—", "full": "10 ± 0.0"},
    }


@pytest.mark.slow
def test_layout_options_and_folded_fields(sweep, tmp_path):
    md = write_report(sweep, tmp_path / "t", rows="topology", cols="algorithm")["report.md"].read_text()
    assert table(md, "Final test accuracy") == {
        "ring": {"dfedavg": "61.00 ± 1.41", "dfedsam": "66.00 ± 0.00"},
        "full": {"dfedavg": "72.00 ± 2.83", "dfedsam": "79.00 ± 1.41"},
    }
    # a third varied field (alpha) is folded into the column labels; one seed: no "±"
    config = Config(name="x", algorithm="dfedavg", topology="ring", clients=M, rounds=15, alpha=0.6)
    write_run(sweep / "runs" / "alpha", config, [0.3, 0.4, 0.5], 0.6, 1e-3)
    md = write_report(sweep, tmp_path / "u")["report.md"].read_text()
    acc = table(md, "Final test accuracy")
    # (an unset alpha is the Dirichlet default 0.3 the runs used: reports resolve each run's defaults)
    assert acc["dfedavg"] == {"topology=ring, alpha=0.6": "50.00", "topology=ring, alpha=0.3": "61.00 ± 1.41",
                              "topology=full, alpha=0.3": "72.00 ± 2.83"}
    assert acc["dfedsam"]["topology=ring, alpha=0.6"] == "n/a"
    assert "## Seeds per setting" in md  # n differs between settings
    # explicit --cols: the other varied field joins the rows
    md = write_report(sweep, tmp_path / "v", cols="topology")["report.md"].read_text()
    assert set(table(md, "Final test accuracy")) == {"algorithm=dfedavg, alpha=0.3",
                                                    "algorithm=dfedavg, alpha=0.6", "algorithm=dfedsam, alpha=0.3"}


def test_not_completed_runs_are_marked_and_listed(sweep):
    config = Config(name="d", seed=2, algorithm="dfedsam", topology="ring", clients=M, rounds=15)
    write_run(sweep / "runs" / "diverged", config, [0.5], 0.6, 1e-3, status="diverged",
              extra_summary={"error": "training diverged in round 7"})
    empty = sweep / "runs" / "empty"
    empty.mkdir()
    (empty / "config.toml").write_text(Config(seed=5).to_toml())
    (empty / "summary.json").write_text(json.dumps({"status": "running", "rounds": 15, "rounds_completed": 0}))
    corrupt = sweep / "runs" / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.toml").write_text("rounds = [")
    (corrupt / "summary.json").write_text("{")
    (sweep / "sweep.json").write_text(json.dumps({"runs": [
        {"name": "gone", "dir": "runs/gone", "status": "failed", "error": "ValueError: bad data"}]}))
    with pytest.warns(UserWarning) as caught:  # each unreadable file, named in one line
        files = write_report(sweep)
    assert sorted(str(w.message).split(":")[0] for w in caught) == [
        f"config file {corrupt / 'config.toml'}", f"summary file {corrupt / 'summary.json'}"]
    md = files["report.md"].read_text()
    acc = table(md, "Final test accuracy")
    assert acc["dfedsam"]["ring"] == "60.67 ± 9.24 †"  # (66 + 66 + 50) / 3, with the diverged seed
    assert acc["dfedavg"]["ring"] == "61.00 ± 1.41"
    listed = table(md, "Runs not completed")
    assert listed["runs/diverged"] == {"status": "diverged", "rounds": "5/15", "note": "training diverged in round 7"}
    assert listed["runs/empty"] == {"status": "running or interrupted", "rounds": "0/15", "note": "no metrics"}
    assert listed["runs/gone"]["status"] == "failed (no run directory)"
    assert listed["runs/corrupt"]["status"] == "unknown"
    assert listed["runs/corrupt"]["note"].startswith("config.toml unreadable (")
    assert "summary.json unreadable" in listed["runs/corrupt"]["note"]
    statuses = {r["run"]: r["status"] for r in read_csv(files["runs.csv"])}
    assert statuses["runs/empty"] == "running" and len(statuses) == 11


def test_plots_written_and_non_empty(sweep):
    files = write_report(sweep)
    for name in ("accuracy.png", "consensus.png", "spectral_gap.png", "client_accuracy.png"):
        data = files[name].read_bytes()
        assert files[name].parent == sweep / "report" / "plots"
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
    assert "- plots/spectral_gap.png" in files["report.md"].read_text()


def test_single_gap_skips_the_gap_plot(tmp_path):
    config = Config(name="one", algorithm="dfedavg", topology="ring", clients=M, rounds=15)
    run = write_run(tmp_path / "one", config, [0.3, 0.4, 0.5], 0.6, 0.0)
    files = write_report(run)
    assert "spectral_gap.png" not in files and files["accuracy.png"].stat().st_size > 0
    md = files["report.md"].read_text()
    assert "Not plotted: fewer than 2 distinct spectral gaps" in md
    assert table(md, "Final test accuracy") == {"dfedavg": {"ring": "50.00"}}
    assert files["consensus.png"].read_bytes().startswith(PNG_MAGIC)  # all-zero consensus: linear axis


# ---------------------------------------------------------------------------------------------- spectral
def test_spectral_report_matches_closed_forms(tmp_path):
    root = tmp_path / "ss"
    acc = {("ring", 1): 0.60, ("ring", 2): 0.65, ("full", 1): 0.80, ("full", 2): 0.80}
    for (topology, Q), a in acc.items():
        for seed in (0, 1):
            config = Config(name="s", seed=seed, algorithm="dfedsam-mgs", topology=topology, clients=M,
                            gossip_steps=Q, rounds=15)
            cd = 0.0 if topology == "full" else 1e-3 / Q
            write_run(root / "runs" / f"{topology}-{Q}-{seed}", config, [a - 0.1, a, a + 0.01 * seed], a + 0.1,
                      cd, Q=Q)
    files = write_spectral_report(root)
    rows = read_csv(files["spectral.csv"])
    assert [(r["topology"], r["Q"]) for r in rows] == [("ring", "1"), ("ring", "2"), ("full", "1"), ("full", "2")]
    gamma = 0.951
    eig = [1 / 3 + 2 / 3 * math.cos(2 * math.pi * k / M) for k in range(M)]
    ring_nw = M / ((1 - gamma) * sum(e**2 / (1 - gamma * e**2) for e in eig))
    for r in rows:
        Q = int(r["Q"])
        lam = LAMBDA[r["topology"]]
        phi = (lam**Q + 1) / ((1 - lam) ** 2 * M ** (2 * (Q - 1))) + (lam**Q + 1) / (1 - lam**Q) ** 2
        assert float(r["lambda"]) == pytest.approx(lam, abs=1e-12)
        assert float(r["gap_Q"]) == pytest.approx(1 - lam**Q, abs=1e-12)
        assert float(r["phi"]) == pytest.approx(phi, rel=1e-9)
        assert float(r["effective_neighbors"]) == pytest.approx(M if lam == 0 else ring_nw, rel=1e-9)
        assert r["clients"] == "8" and r["runs"] == "2"
    assert float(rows[2]["phi"]) == pytest.approx(2.0) and float(rows[3]["phi"]) == pytest.approx(1 + 1 / 64)
    assert float(rows[1]["test_acc_mean"]) == pytest.approx(0.655)
    md = files["spectral.md"].read_text()
    line = next(x for x in md.split("\n") if x.startswith("| ring | 2 |"))
    cells = [c.strip() for c in line.strip("|").split(" | ")]
    # default target 0.9 × 60.5% (the lowest mean final accuracy): ring Q = 2 reaches it at round 5 on both seeds
    assert cells[3:] == [f"{RING_LAMBDA:.4f}", f"{1 - RING_LAMBDA**2:.4g}", f"{float(rows[1]['phi']):.4g}",
                         f"{ring_nw:.2f}", "65.50 ± 0.71", "5 ± 0.0 (2/2)", "5.00e-04 ± 0.0e+00", "2"]
    assert "| rounds to 54.45% (k/n) |" in md
    assert [r["rounds_to_target_mean"] for r in rows] == ["10.0", "5.0", "5.0", "5.0"]
    for name in ("spectral_accuracy.png", "spectral_consensus.png"):
        assert files[name].read_bytes().startswith(PNG_MAGIC) and files[name].stat().st_size > 5000


# ---------------------------------------------------------------------------------------------- helpers, CLI
def test_stat_format_and_fit():
    assert Stat.of([0.5, None, float("nan"), 0.7]) == Stat(pytest.approx(0.6), pytest.approx(math.sqrt(0.02)), 2)
    assert Stat.of([]) == Stat(None, None, 0)
    assert format_stat(Stat(0.5, None, 1), "pct") == "50.00"
    assert format_stat(Stat(None, None, 0), "sci") == "—"
    assert format_stat(Stat(3 * 1024**2, 0.0, 2), "bytes") == "3.0 MiB"
    fit = fit_log_trend([0.1, 1.0, 0.01], [3.0, 5.0, 1.0])
    assert (fit.a, fit.b, fit.r2) == (pytest.approx(5.0), pytest.approx(2 / math.log(10)), pytest.approx(1.0))
    assert fit.n == 3 and fit.b_ci == (pytest.approx(fit.b), pytest.approx(fit.b))  # exact points: no spread
    assert fit_log_trend([0.5, 0.5], [1.0, 2.0]) is None
    assert fit_log_trend([0.5, 0.1, 0.5], [1.0, 2.0, 3.0]) is None  # 2 distinct x: a line fits any 2 points


def test_fit_slope_interval_matches_scipy():
    from scipy import stats

    xs = [0.01, 0.03, 0.1, 0.3, 1.0]
    ys = [60.0, 64.5, 66.0, 71.0, 72.5]
    fit = fit_log_trend(xs, ys)
    ref = stats.linregress([math.log(x) for x in xs], ys)
    half = stats.t.ppf(0.975, len(xs) - 2) * ref.stderr
    assert fit.b == pytest.approx(ref.slope) and fit.r2 == pytest.approx(ref.rvalue**2)
    assert fit.b_ci == (pytest.approx(ref.slope - half), pytest.approx(ref.slope + half))


def test_spectral_trends_are_fitted_within_a_client_count(tmp_path):
    """Runs with 8 and 16 clients are two regressions (one per client count), not one pooled fit."""
    root = tmp_path / "ss"
    for m, base in ((8, 0.6), (16, 0.5)):
        for i, (topology, Q) in enumerate((("ring", 1), ("ring", 2), ("ring", 4))):
            for seed in (0, 1):
                config = Config(name="s", seed=seed, algorithm="dfedsam-mgs", topology=topology, clients=m,
                                gossip_steps=Q, rounds=15)
                run = write_run(root / "runs" / f"{m}-{Q}-{seed}", config, [base, base + 0.05 * i, base + 0.05 * i],
                                0.9, 1e-3 / Q, Q=Q)
                summary = json.loads((run / "summary.json").read_text())
                summary.update(clients=m, lambda_Q=RING_LAMBDA**Q)
                (run / "summary.json").write_text(json.dumps(summary))
    md = write_spectral_report(root)["spectral.md"].read_text()
    fits = [line for line in md.split("\n") if line.startswith("- clients=") and "slope 95% CI" in line]
    assert len(fits) == 6, md  # accuracy, rounds to target and consensus, for each client count
    assert sum(line.startswith("- clients=8:") for line in fits) == 3
    assert all("n = 3 points" in line for line in fits)


@pytest.mark.slow
def test_cli_prints_table_and_files(sweep, capsys):
    assert main(["report", str(sweep), "--target", "0.7", "--spectral"]) == 0
    out = capsys.readouterr().out
    assert "| dfedsam | 66.00 ± 0.00 | 79.00 ± 1.41 |" in out
    assert "# Spectral-gap study" in out
    assert str(sweep / "report" / "plots" / "accuracy.png") in out


@pytest.mark.parametrize("argv, message", [
    (["--rows", "colour"], "--rows: unknown or non-setting field(s) colour; allowed: rounds, algorithm"),
    (["--cols", "seed"], "--cols: unknown or non-setting field(s) seed"),
    (["--rows", "topology", "--cols", "topology"], "share field(s) topology"),
    (["--target", "80"], "target accuracy must be a fraction in (0, 1]"),
    (["--target", "0"], "target accuracy must be a fraction in (0, 1]"),
])
def test_cli_errors(sweep, capsys, argv, message):
    assert main(["report", str(sweep), *argv]) == 2
    assert message in capsys.readouterr().err


def test_no_run_directories(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no run directories under" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(ReportError, match="no run directories"):
        write_spectral_report(tmp_path / "empty")


@pytest.mark.slow
def test_real_run_directories(tmp_path):
    tiny = dict(dataset="mnist1d", dataset_options={"num_samples": 400}, clients=4, model="logreg", rounds=3,
                eval_every=1, local_steps=2, batch_size=16, progress=False, device="cpu", train_eval_samples=50,
                algorithm="dfedavg")
    summaries = {}
    for topology in ("ring", "full"):
        result = dfl.run(Config(topology=topology, **tiny), out=tmp_path / "runs" / topology)
        summaries[topology] = result.summary
    files = write_report(tmp_path)
    acc = table(files["report.md"].read_text(), "Final test accuracy")
    assert acc == {"dfedavg": {t: f"{100 * s['test_acc']:.2f}" for t, s in summaries.items()}}
    for name, path in files.items():
        assert path.stat().st_size > 0, name
    spectral = write_spectral_report(tmp_path)
    rows = read_csv(spectral["spectral.csv"])
    assert [r["topology"] for r in rows] == ["ring", "full"]
    assert float(rows[0]["lambda"]) == pytest.approx(summaries["ring"]["lambda"])
    assert float(rows[1]["effective_neighbors"]) == pytest.approx(4.0)


def test_the_report_says_what_the_runs_share_and_flags_what_differs_beyond_the_axes(tmp_path):
    """DFedSAM's momentum 0.9 beside D-PSGD's none, and the bytes of a round, differ with the algorithm on one
    topology: flagged (and momentum, an algorithm default, is no column of the tables); a momentum that the study
    varies is not."""
    root = tmp_path / "runs"
    for algorithm, momentum, sent in (("dpsgd", None, 8 * 4 * 100 * 14), ("dfedsam", 0.9, 8 * 4 * 100 * 2)):
        config = Config(name=algorithm, algorithm=algorithm, clients=M, topology="ring", rounds=15, momentum=momentum)
        write_run(root / algorithm, config, [0.4, 0.5, 0.6], 0.7, 1e-3,
                  extra_summary={"num_params": 100, "clients": M})
        lines = (root / algorithm / "metrics.jsonl").read_text().splitlines()
        last = {**json.loads(lines[-1]), "bytes_sent": sent}
        (root / algorithm / "metrics.jsonl").write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
    text = (write_report(root)["report.md"]).read_text()
    section = text.split("## What the runs share and what differs", 1)[1].split("\n## ", 1)[0]
    assert "**⚠ Differs beyond the varied axes (algorithm, topology):** local momentum, effective lr = lr/(1 − " \
           "momentum), models sent per client per round, MiB sent per round (all clients)." in section
    assert "| dpsgd | 0 | 1 epoch | 0.1 | 1 | 14 |" in section and "| dfedsam | 0.9 | 1 epoch | 1 | 1 | 2 |" in section
    assert "**Shared by every run** (besides the fields at their defaults): rounds = 15, clients = 8" in section
    assert "momentum" not in table(text, "Final test accuracy (%)")["dpsgd"]  # not an axis of the tables
    varied = tmp_path / "varied"
    for momentum in (0.5, 0.9):
        write_run(varied / f"m{momentum}", Config(name=f"m{momentum}", algorithm="dfedsam", clients=M, rounds=15,
                                                 momentum=momentum), [0.4, 0.5, 0.6], 0.7, 1e-3)
    text = (write_report(varied)["report.md"]).read_text()
    assert "Nothing of the quantities below differs beyond the varied axes (algorithm, momentum)." in text
