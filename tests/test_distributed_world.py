"""The table of what combines with what in a world of several processes (issue 45): `dfl torchrun N` refuses what the
table refuses for N processes in one line before any rank starts, a resumed run included (its config is its
directory's, and a resume may use another number of processes); a run killed in one process resumes in two as the
uninterrupted run (a process whose block is smaller than client_chunk not warned about memory)."""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import dfl
from dfl import cli
from dfl.engine import combinations
from dfl.engine.results import read_metrics
from dfl.workflows import torchrun
from tests.helpers import START_METHOD, assert_histories_close, blob_data, init_gloo, spawn, tiny_config

pytestmark = pytest.mark.timeout(300)  # a hang guard only


def _no_launch(nproc, run_args, stderr=None):
    raise AssertionError(f"torchrun launched {nproc} ranks of dfl run {run_args}: the refusal came after they started")


@pytest.mark.parametrize("world, changes", [
    (2, dict(byzantine=1, attack="gaussian")),  # the attacker reads every client's row: one process
    (4, dict(clients=3)),  # fewer clients than processes
])
def test_a_resume_under_torchrun_is_refused_before_any_rank_starts(tmp_path, monkeypatch, capsys, world, changes):
    """A run allowed in one process, resumed by `dfl torchrun N --resume DIR` in a world the table refuses: one line
    (the table's, for N processes) and exit status 2, and torchrun never starts."""
    config = tiny_config(**{**dict(rounds=1, clients=6, model="logreg", model_options={}, dataset="mnist1d",
                                   local_steps=1,
                                   dataset_options={"num_samples": 200}, train_eval_samples=0), **changes})
    run = tmp_path / "run"
    dfl.run(config, out=run)
    message = combinations.refusal(config, world)
    assert message is not None and combinations.refusal(config) is None
    monkeypatch.setattr(torchrun, "launch", _no_launch)
    capsys.readouterr()
    assert cli.main(["torchrun", str(world), "--resume", str(run), "--rounds", "2"]) == 2
    err = capsys.readouterr().err
    assert err == f"dfl run: error: {message}\n"


def test_a_resume_of_no_run_is_refused_before_any_rank_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torchrun, "launch", _no_launch)
    assert cli.main(["torchrun", "2", "--resume", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dfl run: error: cannot resume: ") and err.count("\n") == 1, err


# ------------------------------- killed in one process, resumed in two (a block smaller than client_chunk included)
CROSS_WORLD = dict(clients=7, client_chunk=4, rounds=3, eval_every=1, local_optimizer="adam",
                   local_optimizer_state="keep", link_failure=0.3, dp_clip=0.5, train_eval_samples=0)


def _cross_world_data():
    return blob_data([6 + i % 3 for i in range(7)], cyclic_test_labels=True, seed=2)


class _KillAfterRoundTwo:
    def on_round_end(self, round, metrics):
        if round == 2:  # round 2 is in metrics.jsonl, not yet checkpointed: the last checkpoint is round 1's
            os.kill(os.getpid(), signal.SIGKILL)


def _killed_run(out):
    torch.set_num_threads(1)
    dfl.run(tiny_config(**CROSS_WORLD), data=_cross_world_data(), out=out, callbacks=[_KillAfterRoundTwo()])


def _resume_worker(rank, world, rdzv, out):
    init_gloo(rank, world, rdzv)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = dfl.run(tiny_config(**CROSS_WORLD), data=_cross_world_data(), out=out, resume=True)
        torch.save({"params": result.params, "ids": result.client_ids, "history": result.history,
                    "resumed_from": result.summary["resumed_from_round"],
                    "warnings": [str(w.message) for w in caught if "client_chunk" in str(w.message)]},
                   Path(out).parent / f"resumed-r{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_a_run_killed_in_one_process_resumes_in_two_as_the_uninterrupted_run(tmp_path):
    """Kept optimizer state, link failures and DP noise, SIGKILLed after round 2 (checkpoint of round 1) in one
    process and resumed by two (blocks of 4 and 3 clients): equal to the uninterrupted one-process run, metrics
    included. The rank of 3 clients calls them all at once (client_chunk = 4), which memory allows: no warning (it
    used to warn "client_chunk = 4 may not fit in memory: the estimate allows 3")."""
    # the reference first: the forked processes inherit what its first run imported and set up (~3 s each otherwise)
    reference = dfl.run(tiny_config(**CROSS_WORLD), data=_cross_world_data())
    run = tmp_path / "run"
    killed = mp.get_context(START_METHOD).Process(target=_killed_run, args=(str(run),))
    killed.start()
    killed.join(240)
    if killed.is_alive():  # hung: it must not outlive the test
        killed.kill()
    assert killed.exitcode == -signal.SIGKILL, killed.exitcode
    assert len(read_metrics(run)) == 2
    spawn(_resume_worker, 2, str(tmp_path / "rdzv"), str(run))
    for rank in range(2):
        got = torch.load(tmp_path / f"resumed-r{rank}.pt")
        assert got["resumed_from"] == 1 and got["warnings"] == [], (rank, got["warnings"])
        torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=1e-5, rtol=0, msg=f"rank {rank}")
        history = got["history"] if rank == 0 else [
            {**h, "client_acc": r["client_acc"]} for h, r in zip(got["history"], reference.history)]
        assert_histories_close(history, reference.history, f"resumed in two, rank {rank}")
    assert_histories_close(read_metrics(run), reference.history, "metrics.jsonl")
