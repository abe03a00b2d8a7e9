"""Sweep launchers (dfl.workflows.launchers): Slurm options checked before anything is submitted, submitit
missing named in one line, the jobs of a sweep directory (never a run submitted twice, a dead job's run resumed),
`dfl sweep status`, requeue resuming from the checkpoint, a half-failed submission recorded, and one real
submission through submitit's LocalExecutor: a run of world size 2 (gloo) as one job of two tasks, then a rerun
that submits nothing."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from dfl.cli import main
from dfl.directories import write_marker
from dfl.errors import LauncherError, SweepError
from dfl.workflows import launchers
from dfl.workflows.launchers import LocalPool, RunJob, SlurmOptions, SubmititLauncher, parse_slurm_time
from dfl.workflows.sweep import Sweep, plan_runs, read_entries, sweep_status

pytestmark = pytest.mark.timeout(240)  # hang guard only

TINY = {
    "dataset": "mnist1d", "dataset_options": {"num_samples": 400}, "clients": 4, "model": "logreg",
    "rounds": 2, "eval_every": 1, "local_steps": 1, "batch_size": 16, "progress": False, "device": "cpu",
    "train_eval_samples": 50, "backend": "gloo", "dist_timeout": 60.0,
}
SPEC = """\
[sweep]
name = "tiny"
[base]
dataset = "mnist1d"
dataset_options = { num_samples = 400 }
clients = 4
model = "logreg"
rounds = 2
eval_every = 1
local_steps = 1
batch_size = 16
device = "cpu"
backend = "gloo"
dist_timeout = 60.0
train_eval_samples = 50
[vary]
seed = [0, 1]
"""


def sweep_of(seeds=(0, 1)) -> Sweep:
    return Sweep.from_dict({"base": dict(TINY), "vary": {"seed": list(seeds)}})


def write_summary(run_dir: Path, **summary) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "summary.json").write_text(json.dumps(summary))


def record_jobs(sweep_dir: Path, *records) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    write_marker(sweep_dir, "sweep")  # as run_sweep does before it submits anything (dfl-directory.json)
    path = sweep_dir / "submitit" / "jobs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": [{"host": socket.gethostname(), "launcher": "submitit-local",
                                          "submitted": 0.0, **r} for r in records]}))


def dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------------------------------------- options
@pytest.mark.parametrize("text, minutes", [
    ("90", 90), ("10:30", 11), ("04:00:00", 240), ("1-12", 2160), ("1-00:30", 1470), ("0-00:00:30", 1), (15, 15),
])
def test_slurm_time_formats(text, minutes):
    assert parse_slurm_time(text) == minutes


@pytest.mark.parametrize("text", ["1:2:3:4", "4h", "", "-1", "0", "00:00:00", "1-", 2.5, True])
def test_bad_slurm_time_is_one_line(text):
    with pytest.raises(LauncherError, match="--time: ") as info:
        parse_slurm_time(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("options, message", [
    ({"gpus_per_run": -1}, r"--gpus-per-run must be an integer >= 0, got -1"),
    ({"cpus_per_run": 0}, r"--cpus-per-run must be an integer >= 1"),
    ({"max_parallel": -3}, r"--max-parallel must be an integer >= 1"),
    ({"tasks_per_run": 0}, r"--tasks-per-run must be an integer >= 1"),
    ({"tasks_per_run": 3, "nodes_per_run": 2}, "must be a multiple of --nodes-per-run"),
    ({"tasks_per_run": 2, "cpus_per_run": 3}, "--cpus-per-run \\(3\\) must be a multiple of --tasks-per-run"),
    ({"tasks_per_run": 2, "gpus_per_run": 1}, "one process per GPU"),
    ({"partition": "gpu long"}, "--partition must be a partition name"),
    ({"extra": {"acount": "x"}}, r"--slurm acount: unknown key; allowed: account, qos"),
    ({"extra": {"time": "1:00"}}, "--slurm time: set it with --time"),
    ({"extra": {"mem": ""}}, "--slurm mem must be a non-empty string"),
    ({"extra": {"signal_delay_s": -1}}, "--slurm signal_delay_s must be an integer >= 0"),
])
def test_bad_slurm_options_are_one_line(options, message):
    with pytest.raises(LauncherError, match=message) as info:
        SlurmOptions(**options).checked()
    assert "\n" not in str(info.value)


def test_slurm_table_flags_override_and_executor_parameters(tmp_path):
    spec = SPEC + '[slurm]\npartition = "cpu"\ntime = "01:00:00"\nmax_parallel = 4\naccount = "proj"\n'
    path = tmp_path / "study.toml"
    path.write_text(spec)
    from dfl.workflows.sweep import load_sweep

    sweep = load_sweep(path)
    assert sweep.slurm == {"partition": "cpu", "time": "01:00:00", "max_parallel": 4, "account": "proj"}
    assert "[slurm]" in sweep.to_toml()  # kept in SWEEP/sweep.toml, so the rerun from there keeps it
    options = SlurmOptions.from_table(sweep.slurm).merged(
        {"partition": "gpu", "time": None, "gpus_per_run": 2, "tasks_per_run": 2, "cpus_per_run": 8,
         "extra": {"qos": "high"}}).checked()
    params = options.executor_parameters("slurm", name="dfl-x")
    assert params == {"tasks_per_node": 2, "nodes": 1, "timeout_min": 60, "gpus_per_node": 2, "cpus_per_task": 4,
                      "name": "dfl-x", "slurm_partition": "gpu", "slurm_array_parallelism": 4,
                      "slurm_account": "proj", "slurm_qos": "high"}
    assert options.executor_parameters("local", name="x") == {"tasks_per_node": 2, "nodes": 1, "timeout_min": 60,
                                                               "gpus_per_node": 2}
    path.write_text(SPEC + "[slurm]\nbogus = 1\n")
    with pytest.raises(SweepError, match=r"\[slurm\]: --slurm bogus: unknown key"):
        load_sweep(path)


@pytest.mark.parametrize("flags, message", [
    (["--time", "4h"], "--time: expected MINUTES"),
    (["--gpus-per-run", "-1"], "--gpus-per-run must be an integer >= 0"),
    (["--slurm", "colour=blue"], "--slurm colour: unknown key"),
    (["--max-parallel", "0"], "--max-parallel must be an integer >= 1"),
])
def test_cli_bad_option_fails_before_submitting(tmp_path, capsys, flags, message):
    spec = tmp_path / "study.toml"
    spec.write_text(SPEC)
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out), "--launcher", "slurm", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()  # nothing planned, nothing submitted


def test_missing_submitit_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    with pytest.raises(LauncherError, match=r'pip install -e "\.\[cluster\]"'):
        SubmititLauncher("slurm")
    spec = tmp_path / "study.toml"
    spec.write_text(SPEC)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "out"), "--launcher", "slurm"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs submitit" in err and '".[cluster]"' in err
    # the default launcher does not need it
    assert isinstance(launchers.make_launcher("local", parallel=2), LocalPool)


# ---------------------------------------------------------------------------------------------- jobs and status
def test_live_job_is_not_resubmitted_and_dead_job_is_resumed(tmp_path):
    pytest.importorskip("submitit")
    out = tmp_path / "sweep"
    planned = sweep_of((0, 1, 2)).plan()
    # seed=0: its job (this very process) is alive; seed=1: its job is gone while its summary says running on a
    # compute node; seed=2: nothing submitted
    record_jobs(out, {"run": "seed=0", "job_id": str(os.getpid())}, {"run": "seed=1", "job_id": str(dead_pid())})
    write_summary(out / "runs" / "seed=1", status="running", host="node-17", pid=4242, rounds=2,
                  rounds_completed=1)
    (out / "runs" / "seed=1" / "config.toml").write_text(planned[1].config.to_toml())
    launcher = SubmititLauncher("local")
    plans = plan_runs(out, planned, launcher=launcher)
    assert plans[0].action == "skip" and f"running in submitit job {os.getpid()}" in plans[0].note
    assert plans[1].action == "start" and "ended while the run was running" in plans[1].note
    assert plans[2].action == "start"
    # without knowing its job, a run on another host is left alone (cannot be checked): the local pool's rule
    assert plan_runs(out, planned, launcher=LocalPool())[1].action == "skip"


def test_sweep_status_reads_run_directories_and_jobs(tmp_path, capsys):
    out = tmp_path / "sweep"
    names = ["a", "b", "c", "d", "e", "f"]
    (out / "runs").mkdir(parents=True)
    (out / "sweep.json").write_text(json.dumps({"runs": [{"name": n, "dir": f"runs/{n}"} for n in names]}))
    write_summary(out / "runs" / "a", status="completed", rounds=2, rounds_completed=2, test_acc=0.5)
    write_summary(out / "runs" / "b", status="failed", rounds=2, rounds_completed=1,
                  error="Traceback ...\nValueError: lr must be > 0")
    write_summary(out / "runs" / "c", status="running", host="node-3", pid=12, rounds=2, rounds_completed=1)
    gone = str(dead_pid())
    (out / "submitit" / gone).mkdir(parents=True)
    (out / "submitit" / gone / f"{gone}_0_log.err").write_text("srun: error\nOSError: no space left on device\n")
    record_jobs(out, {"run": "c", "job_id": gone}, {"run": "d", "job_id": str(os.getpid())},
                {"run": "e", "job_id": gone})
    rows = {r["name"]: r for r in sweep_status(out)}
    assert {n: r["state"] for n, r in rows.items()} == {"a": "done", "b": "failed", "c": "failed",
                                                       "d": "running", "e": "failed", "f": "pending"}
    assert rows["b"]["error"].endswith("ValueError: lr must be > 0")
    assert "ended while the run was running" in rows["c"]["error"]
    assert "OSError: no space left on device" in rows["e"]["error"]
    assert main(["sweep", "status", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ValueError: lr must be > 0" in text and "Traceback" not in text
    assert text.strip().splitlines()[-1] == "6 runs: 1 running, 1 done, 3 failed, 1 pending"
    assert main(["sweep", "status"]) == 2


# ---------------------------------------------------------------------------------------------- requeue
def test_requeued_job_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = RunJob({"name": "x"}, str(run_dir), "start", submitted=time.time() - 60)
    assert job.checkpoint().function.action == "start"  # preempted before any checkpoint: start again
    (run_dir / "checkpoint.pt").write_bytes(b"x")
    delayed = job.checkpoint()
    assert isinstance(delayed, submitit.helpers.DelayedSubmission) and delayed.function.action == "resume"

    # Slurm requeued the job on its own (node failure): a checkpoint newer than the submission is this job's
    seen = []
    monkeypatch.setattr(launchers.submission, "execute_run", lambda config, out, action: seen.append(action) or {})
    monkeypatch.setattr(launchers.submission.Config, "from_dict", staticmethod(lambda values: values))

    class Env:
        num_tasks, job_id = 1, "7_1"

    monkeypatch.setattr(submitit, "JobEnvironment", Env)
    assert job() == {"job_id": "7_1"} and seen == ["resume"]
    old = RunJob({"name": "x"}, str(run_dir), "start", submitted=time.time() + 60)  # an older checkpoint
    old()
    assert seen == ["resume", "start"]


def test_half_failed_submission_is_recorded(tmp_path, monkeypatch):
    submitit = pytest.importorskip("submitit")

    class Job:
        def __init__(self, job_id):
            self.job_id = job_id

    class Executor:
        calls = 0

        def __init__(self, folder):
            pass

        def update_parameters(self, **params):
            pass

        def submit(self, fn):
            Executor.calls += 1
            if Executor.calls == 2:
                raise RuntimeError("fork failed")
            return Job(str(os.getpid()))

    monkeypatch.setattr(submitit, "LocalExecutor", Executor)
    from dfl.workflows.sweep import run_sweep

    out = tmp_path / "sweep"
    with pytest.raises(LauncherError, match="submitting run seed=1 failed after 1 of 2 runs were submitted"):
        run_sweep(sweep_of(), out, launcher=SubmititLauncher("local"), log=None)
    assert [r["run"] for r in launchers.read_jobs(out)] == ["seed=0"]
    # the rerun leaves seed=0 alone (its job is alive) and submits seed=1 only
    Executor.calls = 0
    entries = run_sweep(sweep_of(), out, launcher=SubmititLauncher("local"), log=None)
    assert [(e["name"], e["status"], e["action"]) for e in entries] == [("seed=0", "running", "skipped"),
                                                                        ("seed=1", "queued", "started")]
    assert [r["run"] for r in launchers.read_jobs(out)] == ["seed=0", "seed=1"]


# ---------------------------------------------------------------------------------------------- a real job
@pytest.mark.slow
def test_world_of_two_through_the_local_executor(tmp_path, capsys, monkeypatch):
    """One run of 2 processes (gloo) as one submitit job of 2 tasks: MASTER_ADDR/PORT, RANK, WORLD_SIZE and
    LOCAL_RANK come from submitit's TorchDistributedEnvironment. Then the rerun submits nothing."""
    pytest.importorskip("submitit")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    spec = tmp_path / "study.toml"
    spec.write_text(SPEC.replace("seed = [0, 1]", "seed = [0]") + "[slurm]\ntime = 5\n")
    out = tmp_path / "out"
    args = ["sweep", str(spec), "--out", str(out), "--launcher", "submitit-local", "--tasks-per-run", "2"]
    assert main([*args, "--wait", "--no-report"]) == 0
    text = capsys.readouterr().out
    assert "queued seed=0" in text and "1 runs: 1 done" in text
    summary = json.loads((out / "runs" / "seed=0" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["processes"] == 2 and summary["rounds_completed"] == 2
    assert read_entries(out)[0]["status"] == "completed"  # synced from the run directory after --wait
    job_id = launchers.read_jobs(out)[0]["job_id"]
    assert len(list((out / "submitit" / job_id).glob("*_result.pkl"))) == 2  # one per task (rank)
    assert main([*args, "--no-report"]) == 0  # the rerun: nothing to submit
    assert "(1 done, 0 to run)" in capsys.readouterr().out
    assert len(launchers.read_jobs(out)) == 1


@pytest.mark.slow
def test_preempted_job_is_requeued_and_resumes_its_run(tmp_path, monkeypatch):
    """SIGUSR2 to the job's task (what Slurm sends before a time limit or on preemption, with submitit's
    --signal): submitit calls RunJob.checkpoint and requeues; the requeued task resumes from the checkpoint."""
    pytest.importorskip("submitit")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    import signal

    from dfl.workflows.sweep import run_sweep

    base = {**TINY, "rounds": 150, "eval_every": 5}
    out = tmp_path / "sweep"
    launcher = SubmititLauncher("local", SlurmOptions(time=5))
    run_sweep(Sweep.from_dict({"base": base, "vary": {"seed": [0]}}), out, launcher=launcher, log=None)
    job, run_dir = launcher._jobs[0], out / "runs" / "seed=0"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # a few evaluations, hence a checkpoint, then the signal
        metrics = run_dir / "metrics.jsonl"
        if (run_dir / "checkpoint.pt").is_file() and metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    controller = int(job.job_id)
    task = int(Path(f"/proc/{controller}/task/{controller}/children").read_text().split()[0])
    os.kill(task, signal.SIGUSR2)
    launcher.wait()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 150
    if summary.get("resumed_from_round") is None:  # the run finished before the signal landed: nothing to check
        pytest.skip("the run ended before it could be preempted (a very fast machine)")
    assert 0 < summary["resumed_from_round"] < 150
    log = next((out / "submitit" / job.job_id).glob("*_0_log.out")).read_text()
    assert "Requeued job" in log
    assert [r["state"] for r in sweep_status(out)] == ["done"]


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """`srun` and `sbatch` stand-ins on PATH: sbatch keeps the script it is given and answers a job id (or fails
    when told to); no sacct, so submitit cannot tell a job's state (counted as alive)."""
    pytest.importorskip("submitit")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "sbatch").write_text('#!/bin/sh\nif [ -n "$FAKE_SBATCH_FAIL" ]; then echo "sbatch: error: invalid '
                                    'account" >&2; exit 1; fi\ncp "$1" "$FAKE_SBATCH_COPY"\n'
                                    'echo "Submitted batch job 4242"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SBATCH_COPY", str(tmp_path / "sbatch.sh"))
    return tmp_path / "sbatch.sh"


def test_slurm_job_array_submission(tmp_path, capsys, monkeypatch, fake_slurm):
    spec = tmp_path / "study.toml"
    spec.write_text(SPEC + '[slurm]\npartition = "cpu"\nmax_parallel = 1\n')
    out = tmp_path / "out"
    args = ["sweep", str(spec), "--out", str(out), "--launcher", "slurm"]
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "1")
    assert main([*args, "--partition", "gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (sbatch's own stderr passes through before it)
    assert err.startswith("dfl sweep: error: submitting the job array failed, nothing was submitted")
    assert "invalid account" in err
    assert launchers.read_jobs(out) == [] and not fake_slurm.exists()
    monkeypatch.delenv("FAKE_SBATCH_FAIL")
    assert main([*args, "--partition", "gpu", "--time", "1-02:00", "--gpus-per-run", "2", "--tasks-per-run", "2",
                 "--cpus-per-run", "16", "--slurm", "account=proj", "--slurm", "mem=64G"]) == 0
    script = fake_slurm.read_text()
    for line in ("--array=0-1%1", "--partition=gpu", "--time=1560", "--gpus-per-node=2", "--ntasks-per-node=2",
                 "--cpus-per-task=8", "--account=proj", "--mem=64G", "--signal=USR2@"):
        assert f"#SBATCH {line}" in script
    assert [(r["run"], r["job_id"]) for r in launchers.read_jobs(out)] == [("seed=0", "4242_0"), ("seed=1", "4242_1")]
    assert [e["status"] for e in read_entries(out)] == ["queued", "queued"]
    fake_slurm.unlink()
    capsys.readouterr()
    assert main(args) == 0  # the array is (as far as can be told) still queued: nothing submitted again
    assert "(2 done, 0 to run)" in capsys.readouterr().out and not fake_slurm.exists()
    assert len(launchers.read_jobs(out)) == 2
