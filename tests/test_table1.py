"""`dfl reproduce dfedsam-table1`: the grid (methods x splits x seeds, each method's settings), the refusals (one
line, before torch loads), the report in the paper's layout from synthetic run directories, the time it states,
`--quick` end to end and a second invocation that skips every finished run."""

from __future__ import annotations

import csv
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from dfl.algorithms import ALGORITHMS, Algorithm, RoundStats, register, resolve_hyperparameters
from dfl.cli import main
from dfl.config import Config
from dfl.engine.validation import unread_fields
from dfl.report.paper_table import expected_time, gpu_throughput, paper_tables, sam_steps, write_paper_table
from dfl.report.runs import load_runs
from dfl.workflows.reproduce import METHODS, SPLITS, table1_sweep
from dfl.workflows.sweep import SweepError, read_entries

pytestmark = pytest.mark.timeout(300)  # hang guard only

SEVEN = [m for m in METHODS if m != "dispfl"]


class StandIn(Algorithm):
    """DFedAvg's round, registered as `dispfl` only where DisPFL is not: the grid is planned, nothing runs."""

    def round(self, t: int) -> RoundStats:
        local = self.ctx.trainer.train(self.X, t, self.ctx.lr(t), self.ctx.rule(t))
        self.X = self.ctx.gossip.mix(local.Y, t, 1)
        return RoundStats(train_loss=local.loss, models_sent=self.ctx.gossip.sends(t, 1))


@pytest.fixture
def dispfl():
    """`dispfl` registered: the real one once merged, else the stand-in for this test only."""
    if "dispfl" in ALGORITHMS:
        yield
        return
    register("dispfl", StandIn)
    yield
    ALGORITHMS.unregister("dispfl")


def configs(sweep) -> dict[str, Config]:
    return {p.name: p.config for p in sweep.plan()}


# ---------------------------------------------------------------------------------------------- the grid
def test_grid_is_seven_methods_by_five_splits_by_three_seeds_with_each_methods_settings():
    runs = configs(table1_sweep(methods=SEVEN))
    assert len(runs) == 7 * 5 * 3
    assert list(runs)[:2] == ["method=fedavg,split=dir0.3,seed=0", "method=fedavg,split=dir0.3,seed=1"]
    assert {(c.algorithm, c.seed) for c in runs.values()} == {(m, s) for m in SEVEN for s in range(3)}

    def run(method, split="dir0.3", seed=0):
        return runs[f"method={method},split={split},seed={seed}"]

    for name, config in runs.items():  # the laptop scale, the same for every method
        assert (config.dataset, config.model, config.clients, config.rounds, config.batch_size) == \
            ("mnist1d", "cnn1d", 16, 40, 40), name
        assert (config.lr, config.lr_decay, config.weight_decay, config.clip_grad_norm) == (0.1, 0.998, 5e-4, 10)
        assert config.local_test_fraction == 0.2 and config.personal_train_eval
        assert unread_fields(config) == [], f"{name} sets options its algorithm does not read"
    for method in ("fedavg", "fedsam"):  # centralized: k of m clients a round, plain local steps
        assert (run(method).topology, run(method).participation, run(method).local_epochs) == ("full", 5 / 16, 2)
    assert (run("dpsgd").local_steps, run("dpsgd").local_epochs) == (1, None)  # one step, one gossip a round
    for method in ("dpsgd", "dfedavg", "dfedavgm", "dfedsam", "dfedsam-mgs"):
        assert (run(method).topology, run(method).topology_options) == ("random-pull", {"k": 5})
    assert {run(m).rho for m in ("fedsam", "dfedsam", "dfedsam-mgs")} == {0.01}  # one SAM radius
    assert [run(m).momentum for m in ("dfedavgm", "dfedsam", "dfedsam-mgs")] == [0.9] * 3
    assert dict(resolve_hyperparameters(run("dfedavg"))) == {} and run("dfedsam-mgs").gossip_steps == 4
    assert (run("dfedavg", "dir0.6").partition, run("dfedavg", "dir0.6").alpha) == ("dirichlet", 0.6)
    assert run("dfedavg", "path5").partition_options == {"classes_per_client": 5}
    assert run("dfedavg", "iid").partition == "iid"


def test_default_is_all_eight_methods_once_dispfl_is_registered(dispfl):
    sweep = table1_sweep()
    assert list(sweep.cases["method"]) == list(METHODS) and list(sweep.cases["split"]) == list(SPLITS)
    runs = configs(sweep)
    assert len(runs) == 8 * 5 * 3
    assert runs["method=dispfl,split=path2,seed=1"].algorithm == "dispfl"


def test_quick_and_full_scales(tmp_path):
    quick = table1_sweep(quick=True, methods=["dfedavg"], splits=["dir0.3"])
    assert [c.rounds for c in configs(quick).values()] == [4] and quick.parallel == 1
    full = table1_sweep(full=True, data_root=str(tmp_path), methods=["fedavg", "dfedsam-mgs"], splits=["path2"])
    runs = configs(full)
    assert len(runs) == 2 * 2 * 3  # methods x datasets x seeds
    mgs = runs["method=dfedsam-mgs,split=path2,dataset=cifar100,seed=0"]
    assert (mgs.clients, mgs.rounds, mgs.local_epochs, mgs.batch_size, mgs.model) == (100, 500, 5, 128, "resnet18")
    assert (mgs.topology_options, mgs.data_root, mgs.local_test_fraction) == ({"k": 10}, str(tmp_path), 0.1)
    assert runs["method=fedavg,split=path2,dataset=cifar10,seed=2"].participation == 0.1
    assert full.parallel == 1


def test_set_changes_a_field_where_the_methods_set_it():
    runs = configs(table1_sweep(methods=["fedsam", "dpsgd", "dfedsam"], splits=["iid"], seeds=1,
                                overrides={"rho": 0.05, "local_epochs": 3, "lr": 0.05,
                                           "topology_options.k": 3}))
    fedsam, dpsgd, dfedsam = runs.values()
    assert (fedsam.rho, dfedsam.rho, fedsam.local_epochs, dfedsam.local_epochs) == (0.05, 0.05, 3, 3)
    assert (dpsgd.local_steps, dpsgd.local_epochs, dpsgd.rho) == (1, None, None)  # D-PSGD keeps its one step
    assert {c.lr for c in runs.values()} == {0.05} and dfedsam.topology_options == {"k": 3}


@pytest.mark.parametrize("kwargs, message", [
    ({"splits": ["dir0.1"]}, r"--splits: unknown value\(s\) dir0.1; choose from dir0.3, dir0.6, path2, path5, iid"),
    ({"methods": ["scaffold"]}, r"--methods: unknown value\(s\) scaffold"),
    ({"methods": SEVEN, "full": True}, "--full trains on CIFAR-10/100 from local files and needs --data-root"),
    ({"methods": SEVEN, "full": True, "quick": True}, "--quick and --full exclude each other"),
    ({"methods": SEVEN, "datasets": ["cifar10"]}, "--datasets is for --full"),
    ({"methods": SEVEN, "seeds": 0}, "--seeds must be an integer >= 1"),
    ({"methods": SEVEN, "overrides": {"alpha": 0.1}}, "--set alpha: alpha is varied by this command; use --splits"),
    ({"methods": SEVEN, "overrides": {"seed": 4}}, "use --seeds"),
])
def test_bad_choices_are_refused(kwargs, message):
    with pytest.raises(SweepError, match=message):
        table1_sweep(**kwargs)


REFUSE = """
import sys
from dfl.cli import main
status = main({argv!r})
print(status, 'torch' in sys.modules)
"""


@pytest.mark.parametrize("argv", [
    ["--splits", "dir0.3,nope"], ["--full", "--methods", ",".join(SEVEN)], ["--methods", "fedavg,fedsm"],
    ["--quick", "--full"],
])
def test_cli_refusals_are_one_line_before_torch_loads(argv, tmp_path):
    proc = subprocess.run([sys.executable, "-c", REFUSE.format(argv=["reproduce", "dfedsam-table1", *argv])],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr[-2000:])
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("dfl reproduce dfedsam-table1: error: --")
    assert not any(tmp_path.iterdir())  # nothing written


# ---------------------------------------------------------------------------------------------- the report
def fake_run(root: Path, algorithm: str, split: dict, seed: int, record: dict, status: str = "completed",
             wall: float = 6.0) -> None:
    config = Config(algorithm=algorithm, seed=seed, rounds=10, clients=4, **split)
    name = f"method={algorithm},split={split['partition']}-{seed}"
    path = root / "runs" / f"{name},seed={seed}"
    path.mkdir(parents=True)
    (path / "config.toml").write_text(config.replace(name=path.name).to_toml())
    (path / "metrics.jsonl").write_text(json.dumps({"round": 10, **record}) + "\n")
    (path / "summary.json").write_text(json.dumps({
        "algorithm": algorithm, "status": status, "rounds": 10, "rounds_completed": 10 if status == "completed" else 4,
        "wall_seconds": wall}))


DIR = {"partition": "dirichlet", "alpha": 0.3}
PATH2 = {"partition": "pathological", "partition_options": {"classes_per_client": 2}}


def accuracies(train, test, avg_train=0.5, avg_test=0.4):
    return {"personal_train_acc_mean": train, "personal_acc_mean": test, "train_acc": avg_train,
            "test_acc": avg_test}


@pytest.fixture
def table_dir(tmp_path):
    root = tmp_path / "table"
    fake_run(root, "dfedavg", DIR, 0, accuracies(0.90, 0.70))
    fake_run(root, "dfedavg", DIR, 1, accuracies(0.94, 0.72))
    fake_run(root, "dfedavg", PATH2, 0, accuracies(0.99, 0.80), status="failed")
    fake_run(root, "fedavg", PATH2, 0, accuracies(0.97, 0.60, 0.8, 0.75))
    fake_run(root, "fedavg", PATH2, 1, accuracies(0.95, 0.64, 0.7, 0.65))
    fake_run(root, "fedavg", DIR, 0, accuracies(0.96, 0.50))
    return root


def test_table_is_the_papers_layout_mean_and_sd_over_seeds(table_dir):
    tables = paper_tables(load_runs(table_dir), methods=["fedavg", "fedsam", "dfedavg"], seeds=2)
    lines = tables["mnist1d"].splitlines()
    assert lines[0] == ("| method | Dirichlet 0.3 train | Dirichlet 0.3 test | Dirichlet 0.3 gap | Pathological 2 "
                        "train | Pathological 2 test | Pathological 2 gap |")
    fedavg, fedsam, dfedavg = lines[2:]
    def sd(difference):  # the sample sd of two values `difference` apart: |a - b| / sqrt(2)
        return f"{100 * difference / math.sqrt(2):.2f}"

    # the gap is taken per seed (37 and 31 points), then its mean and sd
    assert fedavg == (f"| fedavg | 96.00 (n=1) | 50.00 (n=1) | 46.00 (n=1) | 96.00 ± {sd(0.02)} | "
                      f"62.00 ± {sd(0.04)} | 34.00 ± {sd(0.06)} |")
    assert fedsam == "| fedsam | not run | not run | not run | not run | not run | not run |"
    assert dfedavg.startswith(f"| dfedavg | 92.00 ± {sd(0.04)} | 71.00 ± {sd(0.02)} | 21.00 ± {sd(0.02)} |")
    assert dfedavg.endswith("| 99.00 (n=1) † | 80.00 (n=1) † | 19.00 (n=1) † |")  # a failed run: marked


def test_written_report_has_both_tables_the_csv_and_the_time(table_dir):
    planned = [Config(algorithm=a, rounds=10, name=n).to_dict()
               for a, n in (("fedavg", "x"), ("dfedsam", "y"), ("dfedsam", "z"))]
    files = write_paper_table(table_dir, methods=["fedavg", "dfedavg"], seeds=2, planned=planned, parallel=2)
    text = files["table1.md"].read_text()
    assert "## Accuracy (%) of each client's own model (personalized)" in text
    assert "## Accuracy (%) of the averaged model" in text
    assert f"| fedavg | 50.00 (n=1) | 40.00 (n=1) | 10.00 (n=1) | 75.00 ± {100 * 0.1 / math.sqrt(2):.2f} |" in text
    assert "## Runs not completed" in text and "† includes runs that are not completed" in text
    assert "- Projected on one GPU: no GPU measurement yet" in text
    # none of the planned runs finished: fedavg at its measured 0.6 s a round, dfedsam (unmeasured) at the 0.6 s of
    # all finished runs: 3 x 10 rounds x 0.6 s = 0.3 min over 2 workers
    assert "- Runs: 3; 0 finished" in text and "Still to run" not in text
    assert ("0.1 min for the whole table (the runs' measured time; dfedsam from the other methods' time per round "
            "+ the workers' start (not measured by this invocation), over 2 worker(s)") in text
    rows = list(csv.DictReader(files["table1.csv"].open()))
    assert [(r["method"], r["split"], r["runs"]) for r in rows] == [
        ("dfedavg", "Dirichlet 0.3", "2"), ("dfedavg", "Pathological 2", "1"), ("fedavg", "Dirichlet 0.3", "1"),
        ("fedavg", "Pathological 2", "2")]
    assert float(rows[3]["gap_mean"]) == pytest.approx(0.34) and float(rows[3]["averaged_test_mean"]) == 0.7
    per_run = list(csv.DictReader(files["table1_runs.csv"].open()))
    assert [(r["method"], r["split"], r["seed"], r["status"]) for r in per_run][:3] == [
        ("dfedavg", "Dirichlet 0.3", "0", "completed"), ("dfedavg", "Dirichlet 0.3", "1", "completed"),
        ("dfedavg", "Pathological 2", "0", "failed")]
    assert (float(per_run[0]["train"]), float(per_run[0]["test"]), float(per_run[0]["wall_seconds"])) == (0.9, 0.7, 6)


def test_gpu_projection_from_a_gpu_check_report(tmp_path):
    report = tmp_path / "gpu_report.json"
    record = {"model": "resnet18", "batch_size": 32, "device_name": "NVIDIA H100",
              "loops": {"dfl engine": {"client_steps_per_s": 400.0}}}
    report.write_text(json.dumps({"device": "cuda", "steps": [
        {"key": "fp32", "status": "ok", "data": {"record": record}}]}))
    figure = gpu_throughput(report)
    assert figure["client_steps_per_s"] == 400.0
    planned = [Config(algorithm="dfedsam", dataset="cifar10", clients=100, rounds=500, local_epochs=5,
                      batch_size=128, rho=0.01, local_test_fraction=0.1).to_dict()]
    # 100 clients x 5 epochs x ceil(450 / 128) = 4 steps x 500 rounds, SAM, 4x the measured batch
    assert sam_steps(planned[0], 50_000) == 100 * 20 * 500
    lines = expected_time(planned, [], 1, figure)
    hours = 100 * 20 * 500 * 128 / (400 * 32) / 3600
    assert lines[-1].startswith(f"- Projected on one GPU (NVIDIA H100): {hours:.1f} h of local training")
    cpu = json.loads(report.read_text())
    cpu["device"] = "cpu"  # a --allow-cpu dry run is no GPU figure
    report.write_text(json.dumps(cpu))
    assert gpu_throughput(report) is None


# ---------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_quick_end_to_end_then_a_new_method_runs_alone_and_a_rerun_skips_everything(tmp_path, capsys):
    """As DisPFL's row will be added: the same command with one more method runs only that method's runs."""
    out = tmp_path / "t1"
    argv = ["reproduce", "dfedsam-table1", "--quick", "--splits", "dir0.3,path2", "--out", str(out), "--methods"]
    assert main([*argv, ",".join(SEVEN[:-1])]) == 0
    assert "| dfedavgm | " in capsys.readouterr().out
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").rglob("*") if p.is_file()}
    assert main([*argv, ",".join(SEVEN)]) == 0
    printed = capsys.readouterr().out
    assert "| dfedsam-mgs | " in printed and "Pathological 2 gap" in printed
    entries = read_entries(out)
    assert len(entries) == 7 * 2 and {e["status"] for e in entries} == {"completed"}
    assert {e["name"] for e in entries if e["action"] == "started"} == {
        "method=dfedsam-mgs,split=dir0.3,seed=0", "method=dfedsam-mgs,split=path2,seed=0"}
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # the finished runs untouched
    table = (out / "report" / "table1.md").read_text()
    tables = table.split("## Time")[0]
    assert "not run" not in tables and "—" not in tables
    rows = list(csv.DictReader((out / "report" / "table1.csv").open()))
    assert len(rows) == 14 and all(0 <= float(r["test_mean"]) <= 1 for r in rows)
    assert main([*argv, ",".join(SEVEN)]) == 0
    assert {e["action"] for e in read_entries(out)} == {"skipped"}
    assert (out / "report" / "table1.md").read_text().split("## Time")[0] == tables


def write_batch(path: Path, n: int, label_key: bytes, num_classes: int, seed: int) -> None:
    """A CIFAR "python version" pickle (uint8 [n, 3072] images, labels i mod num_classes), as the loader reads it."""
    import numpy as np

    rng = np.random.default_rng(seed)
    batch = {label_key: [i % num_classes for i in range(n)], b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(batch, protocol=2))


@pytest.mark.slow
def test_full_runs_on_cifar_files_shrunk_by_set(tmp_path):
    """--full end to end on tiny CIFAR-10/100 files in the official format: both datasets, a centralized and a
    decentralized method (a small model and 10 clients by --set)."""
    root = tmp_path / "cifar"
    for i in range(1, 6):  # 5 x 20 = 100 train images, 10 per class
        write_batch(root / "cifar-10-batches-py" / f"data_batch_{i}", 20, b"labels", 10, i)
    write_batch(root / "cifar-10-batches-py" / "test_batch", 20, b"labels", 10, 9)
    write_batch(root / "cifar-100-python" / "train", 400, b"fine_labels", 100, 1)
    write_batch(root / "cifar-100-python" / "test", 100, b"fine_labels", 100, 2)
    out = tmp_path / "full"
    assert main(["reproduce", "dfedsam-table1", "--full", "--data-root", str(root), "--methods", "fedsam,dfedsam-mgs",
                 "--splits", "dir0.6", "--seeds", "1", "--rounds", "1", "--set", "model=logreg", "--set", "clients=10",
                 "--set", "topology_options.k=3", "--set", "local_test_fraction=0.3", "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "report" / "table1_runs.csv").open()))
    assert sorted((r["dataset"], r["method"], r["status"]) for r in rows) == [
        ("cifar10", "dfedsam-mgs", "completed"), ("cifar10", "fedsam", "completed"),
        ("cifar100", "dfedsam-mgs", "completed"), ("cifar100", "fedsam", "completed")]
    text = (out / "report" / "table1.md").read_text()
    assert "### cifar10" in text and "### cifar100" in text


# ---------------------------------------------------------------------------------------------- the docs page
ROOT = Path(__file__).resolve().parents[1]


def test_study_page_numbers_are_generated_from_the_committed_results():
    """docs/study-table1.md's Results block is what docs/gen_table1.py makes of the committed per-run CSV."""
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_table1.py"), "--check"], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_orderings_verdicts_follow_the_paired_test(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import gen_table1
    finally:
        sys.path.remove(str(ROOT / "docs"))
    runs = {("dfedsam", "IID"): {0: (0.9, 0.80), 1: (0.9, 0.82), 2: (0.9, 0.81)},
            ("dfedavgm", "IID"): {0: (0.9, 0.70), 1: (0.9, 0.71), 2: (0.9, 0.72)},
            ("dfedavg", "IID"): {0: (0.9, 0.60), 1: (0.9, 0.90), 2: (0.9, 0.70)}}
    assert gen_table1.laptop_verdict(runs, "dfedsam", "dfedavgm", "test", "IID") == "+10.0 **holds**"
    assert gen_table1.laptop_verdict(runs, "dfedavgm", "dfedsam", "test", "IID") == "-10.0 **fails**"
    assert gen_table1.laptop_verdict(runs, "dfedavgm", "dfedavg", "test", "IID") == "-2.3 inconclusive"
    assert gen_table1.laptop_verdict(runs, "dfedsam", "dispfl", "test", "IID") == "not run"
    # gap: dfedsam's train - test is 0.09 on average, dfedavgm's 0.19: dfedsam's is smaller, the ordering holds
    assert gen_table1.laptop_verdict(runs, "dfedsam", "dfedavgm", "gap", "IID").endswith("**holds**")
    assert gen_table1.paper_verdict("dfedsam-mgs", "dfedsam", "test") == "✓ ✓ ✓ ✓ ✓ ✓"
    assert gen_table1.paper_verdict("dfedavg", "dpsgd", "test") == "✓ ✓ ✓ ✗ ✓ ✓"  # CIFAR-100 Dir 0.3: 27.62 < 27.98


def test_time_of_a_partly_run_table_says_what_is_left(table_dir):
    runs = load_runs(table_dir)
    planned = [r.config for r in runs if r.finished] + [Config(algorithm="dfedavg", rounds=20, name="new").to_dict()]
    started = [r.config["name"] for r in runs if r.finished][:4]
    lines = expected_time(planned, runs, 2, None, invocation=(started, 15.0))
    # 5 finished runs of 6 s; the new one: dfedavg's measured 0.6 s a round x 20 rounds = 12 s. The invocation ran 4
    # runs (24 s of run time) in 15 s on 2 workers: (2 x 15 - 24) / 4 = 1.5 s a run to start its worker
    assert lines[0] == "- Runs: 6; 5 finished, whose measured time adds up to 0.5 min (each run in its worker, " \
                       "set-up included)."
    assert lines[1] == "- This invocation ran 4 of them in 0.2 min, 2 at once: 1.5 s per run went to starting its " \
                       "worker process (elapsed x workers - the runs' time)."
    assert lines[2].split(": ", 1)[1].startswith("0.4 min for the whole table")  # (42 + 6 x 1.5) / 2 = 25.5 s
    assert lines[3] == "- Still to run: 1 runs, about 0.1 min."  # (12 + 1.5) / 2 s
