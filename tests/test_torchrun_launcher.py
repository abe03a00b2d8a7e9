"""`dfl torchrun N ARGS`: a refusal under torchrun is dfl's one line and the rank's exit status, not torchrun's
traceback and failure table (dfl.workflows.torchrun); a run without --out gets one new directory that rank 0 makes
and names to the others (dfl.engine.runner); the filter keeps torchrun's report when a rank crashed."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dfl.workflows.torchrun import RefusalFilter, torchrun_command

REFUSED = "dfl run: error: byzantine = 4, aggregator = mean: this process hosts 8 of the 16 clients\n"
# what torchrun (2.13) printed after two ranks refused a Byzantine run (abridged: the traceback's middle frames)
AGENT = """W1128 06:37:30.900000 18065 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 18137 closing signal SIGTERM
E1128 06:37:30.964000 18065 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: 18136) of binary: /x/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
dfl.cli FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : 2 (pid: 18137)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 2 (pid: 18136)
============================================================
"""  # noqa: E501


def filtered(chunks: list[str], returncode: int = 1) -> tuple[str, int]:
    f = RefusalFilter()
    shown = b"".join(f.feed(chunk.encode()) for chunk in chunks)
    return shown.decode(), f.exit_code(returncode)


def test_after_a_refusal_only_dfls_line_is_shown_and_the_ranks_status_returned():
    text = REFUSED + REFUSED + AGENT
    for size in (len(text), 7, 1):  # however the pipe splits it
        shown, code = filtered([text[i:i + size] for i in range(0, len(text), size)])
        assert (shown, code) == (REFUSED, 2), (size, shown)


def test_progress_before_a_refusal_passes_as_it_comes_and_a_crash_keeps_torchruns_report():
    shown, code = filtered(["round 1/2 \r", "round 2/2\n", REFUSED, AGENT])
    assert (shown, code) == ("round 1/2 \rround 2/2\n" + REFUSED, 2)
    crash = "Traceback (most recent call last):\n  File \"x.py\", line 1\nRuntimeError: boom\n"
    shown, code = filtered([crash, REFUSED, AGENT])  # a rank crashed: everything stays, torchrun's status
    assert (shown, code) == (crash + REFUSED + AGENT, 1)
    assert filtered(["all good\n"], 0) == ("all good\n", 0)


def test_the_command_is_this_interpreters_torchrun_on_one_node():
    assert torchrun_command(3, ["--clients", "6"]) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=3", "-m",
        "dfl.cli", "run", "--clients", "6"]


def dfl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-m", "dfl.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=240)


def test_a_config_mistake_is_refused_before_any_rank_starts(tmp_path):
    proc = dfl("torchrun", "2", "--clients", "4", "--topology", "Ring", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("dfl run: error: topology must be one of") and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_refusal_of_the_ranks_is_one_line_and_exit_status_2(tmp_path):
    proc = dfl("torchrun", "2", "--clients", "16", "--rounds", "2", "--device", "cpu", "--byzantine", "0.25",
               "--attack", "sign-flip", "--backend", "gloo", "--dist-timeout", "60", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    # the ranks refuse it from the table of what combines with what (dfl.engine.combinations) before any work
    assert proc.stderr.startswith("dfl run: error: byzantine = 0.25") and proc.stderr.count("\n") == 1, proc.stderr
    assert "a torchrun world of 2 processes is not supported" in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "runs").exists()  # the new run directory went with the refusal


@pytest.mark.slow
def test_without_out_the_ranks_share_one_new_run_directory(tmp_path):
    proc = dfl("torchrun", "2", "--clients", "4", "--rounds", "2", "--eval-every", "1", "--model", "logreg",
               "--dataset-options", "num_samples=600", "--local-steps", "2", "--no-progress", "--backend", "gloo",
               "--dist-timeout", "60", "--train-eval-samples", "50", "--checkpoint-every", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()  # one directory, named by rank 0, written by both ranks
    assert re.fullmatch(r"dfedsam-mgs-\d{8}-\d{6}", run.name)
    assert f"run directory: runs/{run.name}" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["processes"] == 2
    assert sorted(p.name for p in run.glob("checkpoint.shards/*/*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert io.StringIO(proc.stderr).read().count("Traceback") == 0
