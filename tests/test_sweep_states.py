"""What `dfl report` and `dfl sweep` make of a run directory's state.

A summary.json that says "running" is checked against its process (pid and host, written by the runner): gone
on this host -> "killed" (resumed like an interrupted run), alive or on another host -> still "running" (left
alone). A diverged run stays diverged when `rounds` grows unless `--retry-diverged`, which starts it over
from scratch; messages about runs without metrics do not claim any."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dfl.cli import main
from dfl.config import Config
from dfl.report import write_report
from dfl.report.runs import effective_status, has_metrics, load_run, pid_alive, run_process
from dfl.workflows.sweep import Sweep, plan_run, read_entries, run_sweep

pytestmark = pytest.mark.timeout(300)  # hang guard only

TINY = {
    "dataset": "mnist1d", "dataset_options": {"num_samples": 400}, "clients": 4, "model": "logreg",
    "rounds": 3, "eval_every": 1, "local_steps": 2, "batch_size": 16, "progress": False, "device": "cpu",
    "train_eval_samples": 50,
}
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)
    return proc.pid


def write_run_dir(path: Path, config: Config, summary: dict, *, checkpoint: bool = False,
                  metrics: int = 0) -> Path:
    """A run directory written by hand: config.toml, summary.json, optionally a checkpoint file (only its
    presence is looked at when planning) and `metrics` records."""
    path.mkdir(parents=True)
    (path / "config.toml").write_text(config.to_toml())
    (path / "summary.json").write_text(json.dumps({"rounds": config.rounds, "rounds_completed": 2, **summary}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"round": r + 1, "test_acc": 0.5}) + "\n"
                                                for r in range(metrics)))
    if checkpoint:
        (path / "checkpoint.pt").write_bytes(b"placeholder")
    return path


# ---------------------------------------------------------------------------------------------- status
def test_effective_status(dead_pid, monkeypatch):
    me = os.getpid()
    assert effective_status({"status": "running", "pid": dead_pid, "host": HOST}) == "killed"
    assert run_process({"status": "running", "pid": dead_pid, "host": HOST}) == "gone"
    assert effective_status({"status": "running", "pid": me, "host": HOST}) == "running"
    assert run_process({"status": "running", "pid": me, "host": HOST}) == "alive"
    other = {"status": "running", "pid": dead_pid, "host": HOST + "-elsewhere"}
    assert (effective_status(other), run_process(other)) == ("running", "elsewhere")  # cannot be checked
    assert (effective_status({"status": "running"}), run_process({"status": "running"})) == ("running", "unknown")
    # only "running" is checked: a finished run keeps its status whatever became of its process
    for status in ("completed", "diverged", "failed", "interrupted"):
        assert effective_status({"status": status, "pid": dead_pid, "host": HOST}) == status
    assert effective_status({}) == "unknown"

    def denied(pid, sig):
        raise PermissionError  # a process of another user: it exists

    monkeypatch.setattr(os, "kill", denied)
    assert effective_status({"status": "running", "pid": dead_pid, "host": HOST}) == "running"


def test_pid_alive_edge_cases():
    assert pid_alive(os.getpid())
    for bad in (0, -1, True, "123", None, 2**80):
        assert not pid_alive(bad)


def test_has_metrics(tmp_path):
    assert not has_metrics(tmp_path)  # no file
    (tmp_path / "metrics.jsonl").write_text("")
    assert not has_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"round": 1')  # truncated
    assert not has_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2')
    assert has_metrics(tmp_path)


def test_run_record_status_and_report(tmp_path, dead_pid):
    root = tmp_path / "runs"
    config = Config(rounds=10)
    write_run_dir(root / "killed", config, {"status": "running", "pid": dead_pid, "host": HOST}, checkpoint=True,
                  metrics=2)
    write_run_dir(root / "live", config.replace(seed=1), {"status": "running", "pid": os.getpid(), "host": HOST},
                  metrics=2)
    write_run_dir(root / "remote", config.replace(seed=2), {"status": "running", "pid": dead_pid,
                                                             "host": HOST + "-elsewhere"}, metrics=2)
    write_run_dir(root / "nockpt", config.replace(seed=3), {"status": "running", "pid": dead_pid, "host": HOST},
                  metrics=2)
    killed = load_run(root / "killed", root)
    assert killed.status == "killed"
    assert "gone (killed or crashed) after round 2; resumable from its checkpoint" in killed.problems[0]
    assert load_run(root / "live", root).status == "running"
    assert load_run(root / "remote", root).status == "running"
    assert "no checkpoint: start it again" in load_run(root / "nockpt", root).problems[0]

    md = write_report(root)["report.md"].read_text()
    section = md.split("## Runs not completed", 1)[1]
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| ")}
    assert "| killed |" in rows["killed"] and "killed or crashed" in rows["killed"]
    assert "killed" not in rows["live"] and "killed" not in rows["remote"]
    assert "†" in md  # the settings holding them are marked not completed


# ---------------------------------------------------------------------------------------------- planning
def plan(tmp_path: Path, summary: dict, *, checkpoint: bool = False, metrics: int = 2, rounds: int = 10,
         stored_rounds: int | None = None, retry: bool = False):
    config = Config(name="r", rounds=rounds)
    run_dir = tmp_path / "runs" / "r"
    write_run_dir(run_dir, config, {"rounds": stored_rounds or rounds, **summary}, checkpoint=checkpoint,
                  metrics=metrics)
    return plan_run(run_dir, config, retry_diverged=retry)


@pytest.mark.parametrize("checkpoint, action", [(True, "resume"), (False, "start")])
def test_killed_run_is_resumed_or_restarted(tmp_path, dead_pid, checkpoint, action):
    p = plan(tmp_path, {"status": "running", "pid": dead_pid, "host": HOST}, checkpoint=checkpoint)
    assert p.action == action
    assert f"its process {dead_pid} is gone (killed or crashed) after round 2" in p.note
    assert p.note.endswith("resumed from its checkpoint" if checkpoint else "no checkpoint: started over")


def test_interrupted_run_is_resumed(tmp_path):
    p = plan(tmp_path, {"status": "interrupted", "pid": 1, "host": HOST}, checkpoint=True)
    assert (p.action, p.note) == ("resume", "interrupted after round 2; resumed from its checkpoint")


def test_live_and_remote_running_runs_are_left_alone(tmp_path, dead_pid):
    p = plan(tmp_path / "a", {"status": "running", "pid": os.getpid(), "host": HOST}, checkpoint=True)
    assert p.action == "skip" and "still running (process" in p.note
    p = plan(tmp_path / "b", {"status": "running", "pid": dead_pid, "host": "other-host"}, checkpoint=True)
    assert p.action == "skip" and "other-host" in p.note and "cannot be checked" in p.note
    # a "running" summary without pid/host (an older version's run) is resumed, as before
    p = plan(tmp_path / "c", {"status": "running"}, checkpoint=True)
    assert p.action == "resume" and "older version" in p.note


def test_diverged_run_stays_diverged_when_rounds_grow(tmp_path):
    summary = {"status": "diverged", "rounds_completed": 4, "error": "training diverged by round 4"}
    p = plan(tmp_path / "a", summary, checkpoint=True, rounds=20, stored_rounds=10)
    assert p.action == "skip"
    assert "rounds is now 20 (was 10)" in p.note and "--retry-diverged" in p.note
    assert "no metrics" not in p.note
    p = plan(tmp_path / "b", summary, checkpoint=True, rounds=20, stored_rounds=10, retry=True)
    assert p.action == "start"  # from scratch: the checkpoint would diverge again
    assert "started over from scratch" in p.note and "would diverge again" in p.note
    # one that diverged before its first evaluation: the message says there are no metrics
    p = plan(tmp_path / "c", {**summary, "rounds_completed": 1}, metrics=0)
    assert p.action == "skip" and "no metrics recorded" in p.note


def test_sweep_logs_and_records_why(tmp_path, dead_pid):
    sweep = Sweep.from_dict({"base": {**TINY}, "vary": {"seed": [0, 1]}})
    out = tmp_path / "sweep"
    (p0, c0), (p1, c1) = sweep.runs()
    write_run_dir(out / "runs" / p0, c0, {"status": "running", "pid": os.getpid(), "host": HOST})
    write_run_dir(out / "runs" / p1, c1, {"status": "running", "pid": dead_pid, "host": HOST})
    lines: list[str] = []
    entries = run_sweep(sweep, out, log=lines.append)
    assert [(e["action"], e["status"]) for e in entries] == [("skipped", "running"), ("started", "completed")]
    assert any(line.startswith(f"skip {p0}: still running") for line in lines)
    assert any(f"start {p1} (its process {dead_pid} is gone" in line for line in lines)
    assert "no checkpoint: started over" in read_entries(out)[1]["note"]


# ---------------------------------------------------------------------------------------------- end to end
def test_diverged_run_skipped_then_retried_from_scratch(tmp_path, capsys):
    base = {**TINY, "model": "mlp", "algorithm": "dfedavg"}
    spec = tmp_path / "spec.toml"
    spec.write_text(Sweep.from_dict({"base": base, "vary": {"lr": [0.1, 1e30]}}).to_toml())
    out = tmp_path / "sweep"
    assert main(["sweep", str(spec), "--out", str(out), "--no-report"]) == 0
    first = read_entries(out)
    assert [e["status"] for e in first] == ["completed", "diverged"]
    diverged_dir = out / first[1]["dir"]
    assert not has_metrics(diverged_dir)  # NaN in round 1, before its first evaluation
    assert first[1]["note"] == "diverged before its first evaluation: no metrics recorded"
    assert "metrics so far" not in capsys.readouterr().out
    before = {p.name: p.read_bytes() for p in diverged_dir.iterdir()}

    # more rounds: the completed run is extended, the diverged one kept as it is
    assert main(["sweep", str(spec), "--out", str(out), "--no-report", "--set", "rounds=5"]) == 0
    printed = capsys.readouterr().out
    again = read_entries(out)
    assert [(e["action"], e["status"]) for e in again] == [("resumed", "completed"), ("skipped", "diverged")]
    assert "rounds is now 5 (was 3)" in again[1]["note"] and "no metrics recorded" in again[1]["note"]
    assert f"skip {again[1]['name']}: diverged with 0 of 3 rounds completed, before its first evaluation" in printed
    assert {p.name: p.read_bytes() for p in diverged_dir.iterdir()} == before

    assert main(["sweep", str(spec), "--out", str(out), "--set", "rounds=5", "--retry-diverged", "--dry-run"]) == 0
    assert f"start  {first[1]['name']}  (diverged with 0 of 3 rounds completed" in capsys.readouterr().out
    assert main(["sweep", str(spec), "--out", str(out), "--no-report", "--set", "rounds=5",
                 "--retry-diverged"]) == 0
    retried = read_entries(out)
    assert [(e["action"], e["status"]) for e in retried] == [("skipped", "completed"), ("started", "diverged")]
    summary = json.loads((diverged_dir / "summary.json").read_text())
    assert summary["rounds"] == 5 and "resumed_from_round" not in summary  # started over, not resumed


@pytest.mark.parametrize("name", ["..", ".hidden", "a/b", ""])
def test_sweep_name_cannot_escape_or_hide(tmp_path, name):
    from dfl.workflows.sweep import SweepError, load_sweep

    spec = tmp_path / "s.toml"
    spec.write_text(f'[sweep]\nname = "{name}"\n[base]\nrounds = 1\n[vary]\nseed = [0, 1]\n')
    with pytest.raises(SweepError, match="not starting with '.'"):
        load_sweep(spec)
