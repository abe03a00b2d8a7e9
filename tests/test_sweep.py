"""Sweeps: spec errors, expansion order and names, skip on re-run, resume of an interrupted run, a failed run
that does not stop the others, parallel = sequential, and the two presets."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import dfl
from dfl.cli import main
from dfl.config import Config
from dfl.engine.results import read_metrics
from dfl.workflows.presets import compare_topologies_sweep, spectral_study_sweep
from dfl.workflows.sweep import Sweep, SweepError, left_out_lines, load_sweep, read_entries, run_name, run_sweep

pytestmark = pytest.mark.timeout(300)  # hang guard only (worker subprocesses)

TINY = {
    "dataset": "mnist1d", "dataset_options": {"num_samples": 400}, "clients": 4, "model": "logreg",
    "rounds": 3, "eval_every": 1, "local_steps": 2, "batch_size": 16, "progress": False, "device": "cpu",
    "train_eval_samples": 50,
}
TIMING = {"seconds_per_round"}


def tiny_sweep(vary=None, **base) -> Sweep:
    vary = vary or {"topology": ["ring", "full"], "algorithm": ["dfedavg", "dfedsam"]}
    base = {k: v for k, v in {**TINY, **base}.items() if k not in vary}
    return Sweep.from_dict({"base": base, "vary": vary})


def write_spec(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def snapshot(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    # every file, those of the checkpoint's shard directories included
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(run_dir.rglob("*"))
            if p.is_file()}


def strip_timing(history):
    return [{k: v for k, v in h.items() if k not in TIMING} for h in history]


# ---------------------------------------------------------------------------------------------- spec
def test_every_mistake_of_a_sweep_file_is_said_at_once(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text("[swep]\nname = 'x'\n[base]\nalgoritm = 'dfedsam'\nlr = -1\n[vary]\ntopology = ['ring', 'grdi']\n")
    with pytest.raises(SweepError) as caught:
        load_sweep(spec)
    said = str(caught.value)
    for part in ["unknown table [swep] (did you mean [sweep]?)", "unknown Config field 'algoritm' in [base] (did you "
                 "mean 'algorithm'?)", "runs topology=ring and 1 more: lr must be > 0.0, got -1",
                 "run topology=grdi: topology must be one of", "(did you mean 'grid'?)"]:
        assert part in said, said
    assert len(said) < 1000 and "\n" not in said


@pytest.mark.parametrize("text, message", [
    ("[base]\nrounds = 2\n[vary]\nseed = [0]\n[extra]\nx = 1\n", r"unknown table \[extra\]; allowed: \[sweep\]"),
    ("rounds = 2\n[vary]\nseed = [0]\n", "outside a table"),
    ("[base]\nlearning_rate = 0.1\n[vary]\nseed = [0]\n",
     r"unknown Config field 'learning_rate' in \[base\]; .* listed by dfl run --help$"),
    ("[vary]\nalgoritm = ['dfedavg']\n",
     r"unknown Config field 'algoritm' in \[vary\] \(did you mean 'algorithm'\?\)$"),
    ("[vary]\ntopology = 'ring'\n", "topology must be a list"),
    ("[vary]\nseed = []\n", "seed is an empty list"),
    ("[base]\nseed = 1\n[vary]\nseed = [0, 1]\n", "seed in both"),
    ("[vary]\nname = ['a', 'b']\n", "'name' cannot be set"),
    ("[sweep]\nname = 'x'\nparalel = 2\n[vary]\nseed = [0]\n", "unknown key.*paralel"),
    ("[sweep]\nparallel = 0\n[vary]\nseed = [0]\n", "parallel must be an integer >= 1"),
    ("[vary]\nalgorithm = ['dfedavg', 'dfedsan']\n", "run algorithm=dfedsan: algorithm must be one of"),
    ("[vary]\nrounds = [2, 0]\n", "run rounds=0: rounds must be >= 1"),
    ("[vary\n", "not valid TOML"),
])
def test_spec_errors_name_the_field(tmp_path, text, message):
    with pytest.raises(SweepError, match=message):
        load_sweep(write_spec(tmp_path / "s.toml", text))


def test_without_out_each_sweep_gets_a_new_directory_under_runs(tmp_path, capsys):
    # the current directory is tmp_path (tests/cwd_guard.py)
    spec = tmp_path / "s.toml"
    spec.write_text(tiny_sweep({"seed": [0]}, rounds=1).to_toml())
    assert main(["sweep", str(spec), "--dry-run"]) == 0  # names the directory, makes nothing
    assert re.search(r"1 runs into runs/sweep-\d{8}-\d{6}/runs/", capsys.readouterr().out)
    assert not Path("runs").exists()
    assert main(["sweep", str(spec), "--no-report"]) == 0
    assert main(["sweep", str(spec), "--no-report"]) == 0  # again: a new directory, not a resume
    printed = capsys.readouterr().out
    sweeps = sorted(Path("runs").iterdir())
    assert len(sweeps) == 2 and all(re.fullmatch(r"sweep-\d{8}-\d{6}(-2)?", s.name) for s in sweeps), sweeps
    assert all(f"sweep directory: {s}" in printed and read_entries(s)[0]["status"] == "completed" for s in sweeps)
    spec.write_text("[vary]\nalgorithm = ['dfedsan']\n")
    assert main(["sweep", str(spec)]) == 2  # refused: no directory is left behind
    assert len(list(Path("runs").iterdir())) == 2


def test_spec_error_on_the_cli_is_one_line(tmp_path, capsys):
    spec = write_spec(tmp_path / "s.toml", "[vary]\nalgorithm = ['dfedavg', 'dfedsan']\n")
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "algorithm must be one of" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_expansion_order_names_and_configs(tmp_path):
    spec = write_spec(tmp_path / "s.toml", """
[sweep]
name = "demo"
[base]
rounds = 7
clients = 8
[vary]
topology = ["random-k", "random-pull"]
topology_options = [{k = 1}, {k = 2}]
lr = [0.1, 1e-05]
""")
    sweep = load_sweep(spec)
    runs = sweep.runs()
    assert sweep.name == "demo" and len(runs) == 8
    names = [name for name, _ in runs]
    assert names[:3] == ["topology=random-k,topology_options=k=1,lr=0.1",
                         "topology=random-k,topology_options=k=1,lr=1e-05",
                         "topology=random-k,topology_options=k=2,lr=0.1"]
    assert names[-1] == "topology=random-pull,topology_options=k=2,lr=1e-05"
    name, config = runs[-1]
    assert config == Config(name=name, rounds=7, clients=8, topology="random-pull", topology_options={"k": 2},
                            lr=1e-5)
    assert run_name({"topology_options": {}, "loggers": []}) == "topology_options=default,loggers=none"
    # every run is validated as it is planned: an option its topology does not take is refused, naming the run
    bad = write_spec(tmp_path / "bad.toml", "[sweep]\nname = 'bad'\n[vary]\ntopology = ['ring', 'random-k']\n"
                     "topology_options = [{k = 2}]\n")
    with pytest.raises(SweepError, match="run topology=ring,topology_options=k=2: topology: unknown option"):
        load_sweep(bad).runs()
    assert run_name({"model_options": {"hidden": [32, 16]}, "dataset": "a b/c"}) == \
        "model_options=hidden=32-16,dataset=a_b_c"
    # the written spec loads back to the same runs
    assert load_sweep(write_spec(tmp_path / "again.toml", sweep.to_toml())).runs() == runs


def test_a_base_field_goes_only_to_the_runs_that_read_it_and_a_varied_one_is_refused():
    sweep = Sweep.from_dict({"base": {"rho": 0.05, "data_root": "/nowhere"},
                             "vary": {"algorithm": ["dpsgd", "dfedsam"]}})
    dpsgd, dfedsam = sweep.plan()
    assert (dpsgd.config.rho, dpsgd.left_out, dfedsam.config.rho, dfedsam.left_out) == (
        None, ("rho", "data_root"), 0.05, ("data_root",))
    assert left_out_lines([dpsgd, dfedsam]) == [
        "[base] rho is left out of 1 of 2 runs, which do not read it (e.g. algorithm=dpsgd)",
        "[base] data_root is left out of 2 of 2 runs, which do not read it (e.g. algorithm=dpsgd)"]
    with pytest.raises(SweepError, match=r"^run algorithm=dpsgd,rho=0.01: rho = 0.01 is not read by dpsgd; remove it"):
        Sweep.from_dict({"vary": {"algorithm": ["dpsgd", "dfedsam"], "rho": [0.01, 0.05]}}).plan()


def test_same_names_are_an_error(tmp_path):
    (tmp_path / "a b").mkdir()
    (tmp_path / "a_b").mkdir()
    with pytest.raises(SweepError, match="same name"):
        Sweep.from_dict({"base": {"dataset": "cifar10"},
                         "vary": {"data_root": [str(tmp_path / "a b"), str(tmp_path / "a_b")]}}).plan()


# ---------------------------------------------------------------------------------------------- running
def test_sweep_completes_then_rerun_skips_everything(tmp_path, capsys):
    spec = write_spec(tmp_path / "s.toml", """
[base]
dataset_options = {num_samples = 400}
clients = 4
model = "logreg"
rounds = 3
eval_every = 1
local_steps = 2
batch_size = 16
progress = false
device = "cpu"
train_eval_samples = 50
[vary]
topology = ["ring", "full"]
algorithm = ["dfedavg", "dfedsam"]
""")
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(out), "--no-report"]) == 0
    printed = capsys.readouterr().out
    assert "4 runs: 4 completed, 4 started" in printed
    entries = read_entries(out)
    assert [e["name"] for e in entries] == ["topology=ring,algorithm=dfedavg", "topology=ring,algorithm=dfedsam",
                                            "topology=full,algorithm=dfedavg", "topology=full,algorithm=dfedsam"]
    assert all(e["status"] == "completed" and e["error"] is None for e in entries)
    assert entries[1]["overrides"] == {"topology": "ring", "algorithm": "dfedsam"}
    for e in entries:
        run_dir = out / e["dir"]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["name"] == e["name"] and summary["rounds_completed"] == 3
        assert Config.from_toml(run_dir / "config.toml").algorithm == e["overrides"]["algorithm"]
    assert load_sweep(out / "sweep.toml").runs() == load_sweep(spec).runs()

    before = {e["name"]: snapshot(out / e["dir"]) for e in entries}
    assert main(["sweep", str(out / "sweep.toml"), "--out", str(out), "--no-report"]) == 0
    assert "4 runs: 4 completed, 4 skipped" in capsys.readouterr().out
    again = read_entries(out)
    assert [e["action"] for e in again] == ["skipped"] * 4 and [e["status"] for e in again] == ["completed"] * 4
    assert [e["test_acc"] for e in again] == [e["test_acc"] for e in entries]
    assert {e["name"]: snapshot(out / e["dir"]) for e in again} == before  # not a byte or mtime changed


def test_interrupted_run_is_resumed_and_equals_an_uninterrupted_one(tmp_path):
    sweep = tiny_sweep({"algorithm": ["dfedavgm", "dfedsam-mgs"]}, rounds=4)
    out = tmp_path / "sweep"
    (name, config), (other, _) = sweep.runs()
    run_dir = out / "runs" / name
    # what a run killed after its round-2 checkpoint leaves: config.toml of the full run, status "running"
    # with the pid of a process that is gone, a checkpoint at round 2, and a metrics line written after it
    dfl.run(config.replace(rounds=2), out=run_dir)
    (run_dir / "config.toml").write_text(config.to_toml())
    summary = json.loads((run_dir / "summary.json").read_text())
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "running", "rounds": 4,
                                                      "pid": int(gone.stdout), "host": socket.gethostname()}))
    with (run_dir / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"round": 3, "test_acc": 0.0}) + "\n")

    entries = run_sweep(sweep, out, log=None)
    assert [e["action"] for e in entries] == ["resumed", "started"]
    assert [e["status"] for e in entries] == ["completed", "completed"]
    reference = dfl.run(config)
    assert strip_timing(read_metrics(run_dir)) == strip_timing(reference.history)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_round"] == 2 and summary["status"] == "completed"


def test_more_rounds_extend_finished_runs_and_a_changed_config_is_an_error(tmp_path):
    out = tmp_path / "sweep"
    entries = run_sweep(tiny_sweep({"seed": [0, 1]}, rounds=2), out, log=None)
    assert [e["action"] for e in entries] == ["started"] * 2
    entries = run_sweep(tiny_sweep({"seed": [0, 1, 2]}, rounds=3), out, log=None)
    assert [e["action"] for e in entries] == ["resumed", "resumed", "started"]
    assert [e["rounds_completed"] for e in entries] == [3, 3, 3]
    with pytest.raises(SweepError, match=r"run seed=0: .* different config: lr \(there 0.1, now 0.05\)"):
        run_sweep(tiny_sweep({"seed": [0, 1]}, rounds=3, lr=0.05), out, log=None)


def test_failed_run_is_reported_and_the_others_complete(tmp_path, capsys):
    # cifar10 validates (its data directory exists), but the directory holds no cifar10 files: the run fails when
    # it starts
    (tmp_path / "empty").mkdir()
    sweep = tiny_sweep({"dataset": ["mnist1d", "cifar10", "digits"]}, data_root=str(tmp_path / "empty"),
                       dataset_options={})
    out = tmp_path / "sweep"
    (tmp_path / "spec.toml").write_text(sweep.to_toml())
    assert main(["sweep", str(tmp_path / "spec.toml"), "--out", str(out), "--no-report"]) == 1
    printed = capsys.readouterr().out
    assert "3 runs: 2 completed, 1 failed" in printed
    entries = read_entries(out)
    assert [e["status"] for e in entries] == ["completed", "failed", "completed"]
    assert "cifar" in entries[1]["error"].lower() and entries[1]["error"].split(":")[0].endswith("Error")
    assert "Traceback" in (out / entries[1]["dir"] / "error.log").read_text()
    # a re-run retries only the failed run
    entries = run_sweep(load_sweep(out / "sweep.toml"), out, log=None)
    assert [e["action"] for e in entries] == ["skipped", "started", "skipped"]


def test_diverged_run_is_recorded_and_kept(tmp_path):
    sweep = tiny_sweep({"lr": [0.1, 1e30]}, model="mlp", algorithm="dfedavg")
    out = tmp_path / "sweep"
    entries = run_sweep(sweep, out, log=None)
    assert [e["status"] for e in entries] == ["completed", "diverged"]
    assert "diverged in round" in entries[1]["error"]
    entries = run_sweep(sweep, out, log=None)
    assert [e["action"] for e in entries] == ["skipped", "skipped"]  # it would diverge again
    assert "--retry-diverged" in entries[1]["note"]


@pytest.mark.slow
def test_parallel_equals_sequential_and_reports_failures(tmp_path, capsys):
    # three runs, two at a time: a worker's slot is refilled after a failure; each run is a worker process, so one
    # failing run (not two: each costs an interpreter's start) is enough
    vary = {"dataset": ["mnist1d", "cifar10", "digits"]}
    (tmp_path / "empty").mkdir()  # exists (validation checks that), holds no cifar10 files: that run fails
    sweep = tiny_sweep(vary, data_root=str(tmp_path / "empty"), dataset_options={}, algorithm="dfedsam")
    seq = run_sweep(sweep, tmp_path / "seq", log=None)
    par = run_sweep(sweep, tmp_path / "par", parallel=2)
    assert "2 at a time" in capsys.readouterr().out
    assert [e["status"] for e in par] == [e["status"] for e in seq] == ["completed", "failed", "completed"]
    for s, p in zip(seq, par):
        assert (s["name"], s["action"]) == (p["name"], p["action"])
        if s["status"] == "completed":
            got, want = read_metrics(tmp_path / "par" / p["dir"]), read_metrics(tmp_path / "seq" / s["dir"])
            for g, w in zip(strip_timing(got), strip_timing(want), strict=True):
                assert g.keys() == w.keys()
                for key, value in w.items():  # approx() takes flat values or lists, not lists in dicts
                    assert g[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        else:
            assert "cifar" in p["error"].lower()
            assert (tmp_path / "par" / p["dir"] / "error.log").read_text().strip()
    assert [e["action"] for e in run_sweep(sweep, tmp_path / "par", parallel=2, log=None)] == \
        ["skipped", "started", "skipped"]


def test_worker_crash_is_captured(tmp_path, monkeypatch):
    # a worker that dies without reporting (as if killed): exit code and stderr tail land in error.log
    monkeypatch.setattr("dfl.workflows.launchers.local.WORKER", "import sys; sys.stderr.write('boom\\n'); sys.exit(7)")
    entries = run_sweep(tiny_sweep({"seed": [0, 1]}), tmp_path / "s", parallel=2, log=None)
    assert [e["status"] for e in entries] == ["failed", "failed"]
    assert entries[0]["error"] == "worker exited with code 7: boom"
    assert (tmp_path / "s" / entries[0]["dir"] / "error.log").read_text().startswith("worker exit code 7")


# ---------------------------------------------------------------------------------------------- presets
def test_compare_topologies_dry_run_lists_20_runs(tmp_path, capsys):
    assert main(["compare-topologies", "--dry-run", "--out", str(tmp_path / "ct")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("20 runs") and len(lines) == 21
    assert lines[1].split() == ["start", "algorithm=dpsgd,topology=ring,seed=0"]
    assert not (tmp_path / "ct").exists()
    # each run is validated as it is planned: its data_root must exist
    sweep = compare_topologies_sweep(full=True, seeds=2, data_root=str(tmp_path), overrides={"client_chunk": 25})
    runs = sweep.runs()
    assert len(runs) == 40 and runs[0][1].dataset == "cifar10" and runs[0][1].clients == 100
    assert runs[0][1].client_chunk == 25 and runs[0][1].data_root == str(tmp_path)
    assert main(["compare-topologies", "--full", "--out", str(tmp_path / "f")]) == 2
    assert "--data-root" in capsys.readouterr().err
    with pytest.raises(SweepError, match="--set topology"):
        compare_topologies_sweep(overrides={"topology": "ring"})


def test_compare_topologies_runs_and_writes_a_resumable_spec(tmp_path):
    out = tmp_path / "ct"
    argv = ["compare-topologies", "--out", str(out), "--topologies", "ring,full", "--algorithms", "dpsgd",
            "--rounds", "2", "--no-report", *sum((["--set", f"{k}={v!r}"] for k, v in TINY.items()
                                                  if k != "rounds"), [])]
    assert main(argv) == 0
    assert [e["status"] for e in read_entries(out)] == ["completed"] * 2
    assert main(["sweep", str(out / "sweep.toml"), "--out", str(out), "--no-report"]) == 0
    assert [e["action"] for e in read_entries(out)] == ["skipped"] * 2


def test_spectral_study_sweep_axes():
    runs = spectral_study_sweep(clients=[8, 16], gossip_steps=[1, 3], topologies=["ring"], seeds=2).runs()
    assert [n for n, _ in runs][:3] == ["topology=ring,clients=8,gossip_steps=1,seed=0",
                                        "topology=ring,clients=8,gossip_steps=1,seed=1",
                                        "topology=ring,clients=8,gossip_steps=3,seed=0"]
    assert len(runs) == 8 and {c.algorithm for _, c in runs} == {"dfedsam-mgs"}
    assert [n for n, _ in spectral_study_sweep(algorithm="dfedavg", topologies=["ring", "full"]).runs()] == \
        ["topology=ring,seed=0", "topology=full,seed=0"]
    with pytest.raises(SweepError, match="dfedavg does not take multiple gossip steps"):
        spectral_study_sweep(algorithm="dfedavg", gossip_steps=[1, 2])


@pytest.mark.slow
def test_spectral_study_end_to_end(tmp_path, capsys):
    out = tmp_path / "ss"
    sets = sum((["--set", f"{k}={v!r}"] for k, v in TINY.items() if k != "rounds"), [])
    argv = ["spectral-study", "--out", str(out), "--topologies", "ring,full", "--gossip-steps", "1,2",
            "--rounds", "2", *sets]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert [e["status"] for e in read_entries(out)] == ["completed"] * 4
    assert "report:" in printed
    files = [p for p in (out / "report").rglob("*") if p.is_file()]
    assert any(p.suffix == ".png" and p.stat().st_size > 0 for p in files)
    assert any(p.suffix in (".md", ".csv") for p in files)


def test_threads_env_is_set_for_workers(tmp_path, monkeypatch):
    # each worker gets its run's threads, or ("auto") this process's threads // parallel (at least 1): 8 cores,
    # or OMP_NUM_THREADS = 4 when set; the parent's environment is left alone
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("dfl.threads.cores", lambda: 8)
    monkeypatch.setattr("dfl.workflows.launchers.local.WORKER", "import os, sys, json; print(json.dumps({'status': "
                        "'completed', 'error': None, 'test_acc': float(os.environ['OMP_NUM_THREADS'])}))")
    entries = run_sweep(tiny_sweep({"seed": [0, 1, 2]}), tmp_path / "s", parallel=3, log=None)
    assert [e["test_acc"] for e in entries] == [2.0, 2.0, 2.0]
    assert "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    entries = run_sweep(tiny_sweep({"threads": ["auto", 3]}), tmp_path / "t", parallel=2, log=None)
    assert sorted(e["test_acc"] for e in entries) == [2.0, 3.0]
    assert os.environ["OMP_NUM_THREADS"] == "4"


def test_sweep_set_and_data_root_override_the_base(tmp_path, capsys):
    spec = write_spec(tmp_path / "s.toml", tiny_sweep().to_toml())
    out = tmp_path / "o"
    assert main(["sweep", str(spec), "--out", str(out), "--dry-run", "--set", "rounds=2", "--data-root", "/d"]) == 0
    assert main(["sweep", str(spec), "--out", str(out), "--no-report", "--set", "rounds=2"]) == 0
    entries = read_entries(out)
    assert len(entries) == 4 and all(e["rounds_completed"] == 2 for e in entries)
    assert load_sweep(out / "sweep.toml").base["rounds"] == 2
    capsys.readouterr()
    assert main(["sweep", str(spec), "--out", str(out), "--set", "topology=ring"]) == 2
    assert "--set topology" in capsys.readouterr().err
    assert main(["sweep", str(spec), "--out", str(out), "--set", "rounds=0"]) == 2
    assert "rounds" in capsys.readouterr().err
