"""dfl run under signals and OS errors: status "interrupted", exit 128 + signal, one-line errors, resumable."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dfl.cli import main

SMALL = ["--clients", "4", "--model", "logreg", "--local-steps", "1", "--batch-size", "8", "--eval-every", "1",
         "--train-eval-samples", "0", "--device", "cpu", "--no-progress", "--dataset-options", "num_samples=400"]


def _default_sigint() -> None:
    """In the child, before exec: SIGINT back to its default. A pytest started with SIGINT ignored (a background
    job of a non-interactive shell) would hand that on, and Python then installs no KeyboardInterrupt handler,
    so Ctrl-C would mean nothing to the run under test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(out: Path, rounds: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "dfl.cli", "run", *SMALL, "--rounds", str(rounds), "--out", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)


def _wait_for_checkpoint(out: Path, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not (out / "checkpoint.pt").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.1)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
@pytest.mark.slow
def test_signal_marks_the_run_interrupted_and_it_resumes(tmp_path, sig, code):
    out = tmp_path / "run"
    proc = _start(out, rounds=100_000)
    _wait_for_checkpoint(out, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert f"interrupted by {sig.name}" in err and f"dfl run --resume {out}" in err and "Traceback" not in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["rounds_completed"] >= 1
    assert summary["pid"] == proc.pid and summary["host"] == socket.gethostname()
    if sig == signal.SIGTERM:  # metrics so far are whole lines, and the run continues from its checkpoint
        lines = (out / "metrics.jsonl").read_text().splitlines()
        assert all(json.loads(line)["round"] >= 1 for line in lines)
        resumed = subprocess.run([sys.executable, "-m", "dfl.cli", "run", "--resume", str(out), "--rounds",
                                  str(summary["rounds_completed"] + 2)], capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def test_out_naming_a_file_is_one_line(tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    assert main(["run", *SMALL, "--rounds", "1", "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dfl run: error: --out {target} is a file, not a directory: choose another --out for the run "
                   "directory"]
    assert target.read_text() == "keep me"


def test_disk_full_is_one_line_and_keeps_what_was_written(tmp_path, capsys, monkeypatch):
    from dfl.engine import results
    out = tmp_path / "run"
    write = results.RunDirectory.append_metrics
    calls = {"n": 0}

    def full_disk(self, record):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, os.strerror(28), str(self.path / "metrics.jsonl"))
        return write(self, record)

    monkeypatch.setattr(results.RunDirectory, "append_metrics", full_disk)
    assert main(["run", *SMALL, "--rounds", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dfl run: error: {out / 'metrics.jsonl'}: No space left on device"]
    assert [json.loads(line)["round"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left" in summary["error"]
