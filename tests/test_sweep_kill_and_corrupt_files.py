"""A killed `dfl sweep --parallel` leaves no worker behind and resumes
on the next run; a corrupt or truncated checkpoint gives a one-line error (`dfl run --resume`) or a failed run
that does not stop the sweep; stale temporary files of an interrupted atomic write are removed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import dfl
from dfl.cli import main
from dfl.engine import checkpoint as ckpt
from dfl.errors import CheckpointError
from dfl.workflows.sweep import Sweep, read_entries, run_sweep

pytestmark = pytest.mark.timeout(300)  # hang guard only (subprocesses)

TINY = {
    "dataset": "mnist1d", "dataset_options": {"num_samples": 400}, "clients": 4, "model": "logreg",
    "rounds": 3, "eval_every": 1, "local_steps": 2, "batch_size": 16, "progress": False, "device": "cpu",
    "train_eval_samples": 50,
}


# ---------------------------------------------------------------------------------------------- processes
def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, process group) of a live process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    state, ppid, pgrp = text.rsplit(")", 1)[1].split()[:3]
    return state, int(ppid), int(pgrp)


def _alive(pid: int) -> bool:
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie has stopped training


def _group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    return [pid for pid in pids if (s := _proc_stat(pid)) is not None and s[2] == pgid and s[0] not in "ZX"]


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the sweep exited ({proc.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _spec(tmp_path: Path, rounds: int = 60) -> Path:
    base = {**TINY, "rounds": rounds, "eval_every": 10, "checkpoint_every": 1}
    spec = tmp_path / "spec.toml"
    spec.write_text(Sweep.from_dict({"sweep": {"name": "kill"}, "base": base,
                                     "vary": {"seed": [0, 1]}}).to_toml())
    return spec


def _start_sweep(spec: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dfl.cli", "sweep", str(spec), "--out", str(out), "--parallel", "2", "--no-report"],
        cwd=out.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )


def _wait_for_workers(sweep: subprocess.Popen, out: Path) -> list[int]:
    """Both workers training, each with a checkpoint written; returns the worker pids."""
    ckpts = [out / "runs" / f"seed={s}" / "checkpoint.pt" for s in (0, 1)]
    _wait_for(lambda: all(p.is_file() for p in ckpts), 120, "both workers' first checkpoint", sweep)
    workers = [pid for pid in _group(sweep.pid) if pid != sweep.pid]
    assert len(workers) == 2, workers
    return workers


@pytest.mark.parametrize("signame, code", [("SIGTERM", 143), ("SIGINT", 130), ("SIGHUP", 129)])
@pytest.mark.slow
def test_signal_stops_every_worker_and_the_next_sweep_resumes(tmp_path, capsys, signame, code):
    # rounds that never finish here: both workers are still training when the signal comes (with a few rounds a
    # fast worker could finish before the other one starts on a loaded machine)
    spec, out = _spec(tmp_path, rounds=100_000), tmp_path / "sweep"
    sweep = _start_sweep(spec, out)
    try:
        workers = _wait_for_workers(sweep, out)
        os.kill(sweep.pid, getattr(signal, signame))
        _, err = sweep.communicate(timeout=30)
        _wait_for(lambda: not _group(sweep.pid), 10, "every process of the sweep's group to end")
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.wait()
    assert sweep.returncode == code
    assert not any(_alive(pid) for pid in workers)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"dfl sweep: interrupted by {signame}: stopped 2 running run(s); run the same command again "
                     "to resume the sweep"], err
    assert [e["status"] for e in read_entries(out)] == ["interrupted", "interrupted"]
    # the workers stopped cleanly: their own summaries say so, with the rounds they completed
    summaries = [json.loads((out / e["dir"] / "summary.json").read_text()) for e in read_entries(out)]
    assert [s["status"] for s in summaries] == ["interrupted", "interrupted"]
    assert all(s["rounds_completed"] >= 1 for s in summaries)
    if signame != "SIGTERM":
        return
    # the runs kept their checkpoints: the next sweep (asking for a few rounds more than were done) resumes both
    # and completes them (the same command, in this process: the signal is what needed a process of its own)
    done_rounds = [ckpt.load(out / e["dir"])["round"] for e in read_entries(out)]  # summary.json lags
    rounds = max(done_rounds) + 3
    assert main(["sweep", str(spec), "--out", str(out), "--parallel", "2", "--no-report",
                 "--set", f"rounds={rounds}"]) == 0, capsys.readouterr().err
    entries = read_entries(out)
    assert [e["action"] for e in entries] == ["resumed", "resumed"]
    assert [e["status"] for e in entries] == ["completed", "completed"]
    assert [e["rounds_completed"] for e in entries] == [rounds, rounds]
    for e in entries:
        summary = json.loads((out / e["dir"] / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["resumed_from_round"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
@pytest.mark.slow
def test_workers_die_with_a_sigkilled_sweep(tmp_path):
    out = tmp_path / "sweep"
    sweep = _start_sweep(_spec(tmp_path, rounds=100_000), out)
    try:
        workers = _wait_for_workers(sweep, out)
        os.kill(sweep.pid, signal.SIGKILL)  # no handler runs: only the parent-death signal can stop the workers
        sweep.communicate(timeout=30)
        _wait_for(lambda: not any(_alive(pid) for pid in workers), 10, "the workers to die with their parent")
    finally:
        for pid in _group(sweep.pid):
            os.kill(pid, signal.SIGKILL)
    for seed in (0, 1):  # each kept a loadable checkpoint
        assert ckpt.load(out / "runs" / f"seed={seed}")["round"] >= 1


# ---------------------------------------------------------------------------------------------- checkpoints
def _interrupted_run(run_dir: Path, rounds: int = 3, **changes):
    """What a run killed after its round-2 checkpoint leaves: the full run's config.toml and a checkpoint at 2."""
    config = dfl.Config(**{**TINY, "rounds": rounds, **changes})
    dfl.run(config.replace(rounds=2), out=run_dir)
    (run_dir / "config.toml").write_text(config.to_toml())
    return config


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _missing_keys(path: Path) -> None:
    saved = torch.load(path, weights_only=True)
    del saved["shards"], saved["rng"]
    torch.save(saved, path)


def _not_a_dict(path: Path) -> None:
    torch.save([1, 2, 3], path)


CORRUPTIONS = {"truncated": (_truncate, "truncated or corrupt"), "random bytes": (_garbage, "truncated or corrupt"),
               "empty": (_empty, "truncated or corrupt"), "missing keys": (_missing_keys, "lacks shards, rng"),
               "not a dict": (_not_a_dict, "not a dfl checkpoint")}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    _interrupted_run(run_dir)
    return run_dir


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_load_names_the_file_and_what_to_do(tmp_path, finished_run, kind):
    spoil, reason = CORRUPTIONS[kind]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoint.pt").write_bytes((finished_run / "checkpoint.pt").read_bytes())
    spoil(run_dir / "checkpoint.pt")
    with pytest.raises(CheckpointError) as info:
        ckpt.load(run_dir)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "\n" not in message and len(message) < 500
    assert message.startswith(f"checkpoint {run_dir / 'checkpoint.pt'} is unreadable (")
    assert reason in message and "--overwrite" in message and "delete the run directory" in message


@pytest.mark.parametrize("kind", ["truncated", "missing keys"])
def test_cli_resume_of_a_corrupt_checkpoint_is_one_line_exit_2(tmp_path, capsys, kind):
    run_dir = tmp_path / "run"
    _interrupted_run(run_dir)
    CORRUPTIONS[kind][0](run_dir / "checkpoint.pt")
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"dfl run: error: checkpoint {run_dir / 'checkpoint.pt'} is unreadable (")
    assert "--overwrite" in err
    # with --overwrite instead, the run starts again and completes
    assert main(["run", "--out", str(run_dir), "--overwrite", *_flags(TINY)]) == 0


def _flags(values: dict) -> list[str]:
    args = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, dict):
            args += [flag, *(f"{k}={v}" for k, v in value.items())]
        else:
            args += [flag, str(value)]
    return args


@pytest.mark.parametrize("parallel", [1, 2])
@pytest.mark.slow
def test_sweep_reports_a_corrupt_checkpoint_as_failed_and_goes_on(tmp_path, parallel):
    sweep = Sweep.from_dict({"base": {k: v for k, v in TINY.items() if k != "seed"}, "vary": {"seed": [0, 1, 2]}})
    out = tmp_path / "sweep"
    (name, config), *_ = sweep.runs()
    run_dir = out / "runs" / name
    dfl.run(config.replace(rounds=2), out=run_dir)
    (run_dir / "config.toml").write_text(config.to_toml())
    _truncate(run_dir / "checkpoint.pt")
    spoiled = (run_dir / "checkpoint.pt").read_bytes()

    entries = run_sweep(sweep, out, parallel=parallel, log=None)
    assert [e["action"] for e in entries] == ["resumed", "started", "started"]
    assert [e["status"] for e in entries] == ["failed", "completed", "completed"]
    error = entries[0]["error"]
    assert error.startswith(f"CheckpointError: checkpoint {run_dir / 'checkpoint.pt'} is unreadable (truncated")
    assert f"delete {run_dir} and run the sweep again" in error and "\n" not in error
    assert "CheckpointError" in (run_dir / "error.log").read_text()
    # a rerun does not silently restart it (nor touch the file): it fails again, the others are skipped
    entries = run_sweep(sweep, out, parallel=parallel, log=None)
    assert [e["status"] for e in entries] == ["failed", "completed", "completed"]
    assert [e["action"] for e in entries] == ["resumed", "skipped", "skipped"]
    assert (run_dir / "checkpoint.pt").read_bytes() == spoiled


def test_stale_temporary_files_are_removed_on_resume_and_start(tmp_path, capsys):
    run_dir = tmp_path / "run"
    _interrupted_run(run_dir)
    stale = [run_dir / ".checkpoint.pt.k3j_x9a", run_dir / ".metrics.jsonl.abc123", run_dir / ".summary.json.q"]
    for path in stale:
        path.write_bytes(b"half a file")
    keep = run_dir / ".keep"
    keep.write_text("not ours")
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert not any(p.exists() for p in stale)
    assert keep.exists()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"

    # a directory holding only an interrupted write's leftovers is empty: a new run starts in it
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / ".checkpoint.pt.zz9").write_bytes(b"x")
    dfl.run(dfl.Config(**TINY), out=fresh)
    assert not (fresh / ".checkpoint.pt.zz9").exists() and (fresh / "checkpoint.pt").is_file()

    # the sweep directory's own leftovers too
    out = tmp_path / "sweep"
    out.mkdir()
    (out / ".sweep.json.tmp1").write_text("{")
    run_sweep(Sweep.from_dict({"base": TINY, "vary": {"lr": [0.1]}}), out, log=None)
    assert not (out / ".sweep.json.tmp1").exists()
