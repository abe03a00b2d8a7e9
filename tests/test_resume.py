"""Checkpoint and resume: an interrupted and resumed run equals an uninterrupted one (metrics and parameters),
for every algorithm, after a SIGKILL mid-round, and in the multi-process engine; resume errors are clear."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import dfl
from dfl import algorithms
from dfl.algorithms import ALGORITHMS, algorithm_class
from dfl.cli import build_parser, main
from dfl.cli.run import config_from_args
from dfl.config import Config, ConfigError
from dfl.engine import checkpoint as ckpt
from dfl.engine.results import read_metrics
from dfl.errors import NoCheckpoint
from dfl.network.comm import even_blocks
from tests.helpers import TIMING, assert_same_history, blob_data, init_gloo, interrupted, tiny_config

pytestmark = pytest.mark.timeout(300)  # hang guard only (spawned process groups, a subprocess)

CLIENTS = 6
make_data = partial(blob_data, sizes=(6, 7, 8, 6, 7, 8), shift=1.0)


def make_config(rounds: int, **changes) -> Config:
    """`tiny_config` (6 clients, a 6-unit MLP) for `rounds` rounds."""
    return tiny_config(rounds=rounds, **changes)


CASES = {
    "dfedsam-mgs": dict(algorithm="dfedsam-mgs", topology="ring", gossip_steps=2),
    "scaffold-half": dict(algorithm="scaffold", participation=0.5),
    "dpsgd-one-peer": dict(algorithm="dpsgd", topology="one-peer-exponential"),
    # per-client Adam moments and [m] step counts, gathered and sliced like c_i
    "fedavg-half-adam-keep": dict(algorithm="fedavg", participation=0.5, local_optimizer="adam",
                                  local_optimizer_state="keep", lr=0.01),
}


# ---------------------------------------------------------------------------------- single process
@pytest.mark.parametrize("case", CASES)
def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, case):
    data = make_data()
    config = make_config(6, **CASES[case])
    full = dfl.run(config, data=data, out=tmp_path / "full")
    resumed = interrupted(config, 3, tmp_path / "part", data)
    assert resumed.summary["resumed_from_round"] == 3 and resumed.summary["status"] == "completed"
    torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)
    assert_same_history(resumed.history, full.history, case)
    assert_same_history(read_metrics(tmp_path / "part"), read_metrics(tmp_path / "full"), case)
    saved = torch.load(tmp_path / "part" / "params.pt")["params"]
    torch.testing.assert_close(saved, full.params, atol=0, rtol=0)
    summary = json.loads((tmp_path / "part" / "summary.json").read_text())
    assert summary["rounds_completed"] == 6 and summary["bytes_sent_total"] == full.summary["bytes_sent_total"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_resumes_exactly_and_declares_its_per_client_state(tmp_path, algorithm):
    """Checkpoint every 2 rounds of 5 with evaluations every round; resume from round 2 (the checkpoint is
    not at an evaluation boundary of the stop). Per-client state ([m, d]) must be in `client_state`."""
    data = make_data()
    centralized = getattr(algorithm_class(algorithm), "centralized", False)
    changes = dict(algorithm=algorithm, checkpoint_every=2)
    if "anneal_rounds" in algorithms.option_defaults(algorithms.card(algorithm)):  # dispfl: a schedule over rounds
        changes.update(algorithm_options={"anneal_rounds": 5})  # that is fixed, so the run may grow from 2 to 5
    if centralized:
        changes.update(participation=0.5)  # non-participants keep their state: the sliced rows must be right
    config = make_config(5, **changes)
    full = dfl.run(config, data=data)
    resumed = interrupted(config, 2, tmp_path / "run", data)
    torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)
    assert_same_history(resumed.history, full.history, algorithm)
    checkpoint = ckpt.read(tmp_path / "run")
    assert checkpoint["round"] == 5
    d = full.params.shape[1]
    for key, value in checkpoint["server_state"].items():  # replicated state: never one row per client
        assert not (torch.is_tensor(value) and value.dim() == 2), f"{algorithm}: {key} looks per-client"
    assert set(checkpoint["client_state"]) == set(algorithm_class(algorithm).client_state)
    for key, value in checkpoint["client_state"].items():  # a row per client: a vector, or a scalar (DisPFL's flag)
        assert value.shape in ((CLIENTS, d), (CLIENTS,)), key


def test_extending_a_finished_run_and_resuming_a_completed_one(tmp_path):
    data = make_data()
    config = make_config(6, algorithm="dfedsam", eval_every=3)
    full = dfl.run(config, data=data)
    out = tmp_path / "run"
    dfl.run(config.replace(rounds=3), data=data, out=out)
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    extended = dfl.run(config, data=data, out=out, resume=True)  # 3 -> 6 rounds
    torch.testing.assert_close(extended.params, full.params, atol=0, rtol=0)
    assert_same_history(extended.history, full.history)
    # a completed run resumed with the same rounds trains nothing and gives the same result again
    before = (out / "checkpoint.pt").read_bytes()
    again = dfl.run(config, data=data, out=out, resume=True)
    assert (out / "checkpoint.pt").read_bytes() == before  # no round ran, so no new checkpoint
    assert again.summary["resumed_from_round"] == 6 and again.summary["status"] == "completed"
    torch.testing.assert_close(again.params, full.params, atol=0, rtol=0)
    assert_same_history(again.history, full.history)
    assert [h["round"] for h in read_metrics(out)] == [3, 6]


def test_global_rng_states_are_restored(tmp_path):
    """Code that draws from the global generators during the run continues the same stream on resume."""
    import random

    import numpy as np

    data = make_data()
    config = make_config(4, algorithm="dfedavg")
    draws = {}

    def record(label):
        def hook(self, t):
            draws.setdefault(label, []).append((torch.rand(1).item(), float(np.random.rand()), random.random()))
            return original(self, t)
        return hook

    cls = algorithm_class("dfedavg")
    original = cls.round
    try:
        np.random.seed(0), random.seed(0)  # the runner seeds torch's generator only
        cls.round = record("full")
        dfl.run(config, data=data)
        np.random.seed(0), random.seed(0)
        cls.round = record("resumed")
        dfl.run(config.replace(rounds=2), data=data, out=tmp_path / "r")
        torch.manual_seed(123), np.random.seed(5), random.seed(7)  # disturb them between the two processes
        dfl.run(config, data=data, out=tmp_path / "r", resume=True)
    finally:
        cls.round = original
    assert draws["resumed"] == draws["full"]


# ---------------------------------------------------------------------------------- SIGKILL mid-round
# `python -m dfl.cli` with every round slowed by a sleep, so that the kill lands inside a round; the sleep
# changes nothing in the arithmetic.
SLOW_CLI = """
import sys, time
from dfl.algorithms import algorithm_class
cls = algorithm_class(sys.argv[1])
original = cls.round
def slow_round(self, t):
    time.sleep(0.25)
    return original(self, t)
cls.round = slow_round
from dfl.cli import build_parser, main
from dfl.cli.run import config_from_args
sys.exit(main(sys.argv[2:]))
"""
CLI_ARGS = [
    "--algorithm", "dfedsam-mgs", "--gossip-steps", "2", "--dataset", "mnist1d", "--dataset-options",
    "num_samples=600", "--clients", "4", "--model", "logreg", "--local-steps", "2", "--batch-size", "8",
    "--train-eval-samples", "50", "--eval-every", "1", "--checkpoint-every", "2", "--device", "cpu",
    "--no-progress",
]


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_sigkill_mid_round_then_resume_equals_an_uninterrupted_run(tmp_path, capsys):
    rounds = ["--rounds", "12"]
    killed = tmp_path / "killed"
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", SLOW_CLI, "dfedsam-mgs", "run", *CLI_ARGS, *rounds, "--out", str(killed)],
            stdout=subprocess.DEVNULL, stderr=stderr,
        )
    try:
        # wait for a checkpoint and an evaluation after it (round 3 > checkpoint round 2), then kill
        while proc.poll() is None:
            metrics = killed / "metrics.jsonl"
            if (killed / "checkpoint.pt").is_file() and metrics.is_file() and len(read_metrics(metrics)) >= 3:
                break
            time.sleep(0.01)
        still_running = proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert still_running, f"the run ended before it could be killed: {log.read_text()[-2000:]}"
    assert proc.returncode == -signal.SIGKILL
    assert json.loads((killed / "summary.json").read_text())["status"] == "running"
    assert not (killed / "params.pt").exists()
    at = torch.load(killed / "checkpoint.pt")["round"]
    assert at < 12 and at % 2 == 0
    assert len(read_metrics(killed)) >= at  # may be ahead of the checkpoint: those rounds are recomputed

    assert main(["run", "--resume", str(killed)]) == 0
    assert main(["run", *CLI_ARGS, *rounds, "--out", str(tmp_path / "full")]) == 0
    capsys.readouterr()
    assert_same_history(read_metrics(killed), read_metrics(tmp_path / "full"), "sigkill", exact=False)
    got = torch.load(killed / "params.pt")["params"]
    want = torch.load(tmp_path / "full" / "params.pt")["params"]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["resumed_from_round"] == at


# ---------------------------------------------------------------------------------- CLI and errors
def test_cli_resume_with_more_rounds_and_errors(tmp_path, capsys):
    out = tmp_path / "run"
    small = [  # checkpoint at every evaluation
        *CLI_ARGS[:CLI_ARGS.index("--checkpoint-every")], *CLI_ARGS[CLI_ARGS.index("--device"):]
    ]
    assert main(["run", *small, "--rounds", "2", "--out", str(out)]) == 0
    assert main(["run", "--resume", str(out), "--rounds", "3"]) == 0
    assert "3/3 rounds — completed" in capsys.readouterr().out
    assert Config.from_toml(out / "config.toml").rounds == 3  # the config of the last session
    assert [h["round"] for h in read_metrics(out)] == [1, 2, 3]

    cases = [
        (["--resume", str(tmp_path / "missing")], "does not exist"),
        (["--resume", str(tmp_path)], "is not a run directory dfl made (no config.toml); start the run without "
                                      "--resume, with another --out"),
        (["--resume", str(out / "metrics.jsonl")], "is a file, not a run directory"),
        (["--resume", str(out), "--lr", "0.5"], "differs from the checkpoint's in lr (checkpoint 0.1, now 0.5)"),
        (["--resume", str(out), "--rounds", "2"], "rounds must be >= 3"),
        (["--resume", str(out), "--overwrite"], "--resume and --overwrite exclude each other"),
        (["--resume", str(out), "--out", str(tmp_path / "other")], "a run resumes in its own directory"),
        ([str(out / "config.toml"), "--resume", str(out)], "not both"),
    ]
    for argv, message in cases:
        assert main(["run", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (argv, err)
    (out / "checkpoint.pt").unlink()
    assert main(["run", "--resume", str(out)]) == 2
    assert "no checkpoint.pt); start the run again without --resume (with --overwrite" in capsys.readouterr().err


class _InterruptAt:
    """A callback that interrupts the run (as Ctrl-C does) after round `at` was recorded."""

    def __init__(self, at: int):
        self.at = at

    def on_round_end(self, round: int, metrics: dict) -> bool:
        if round >= self.at:
            raise KeyboardInterrupt
        return False


def test_resume_without_a_directory_continues_the_latest_interrupted_run(tmp_path, capsys):
    # the current directory is tmp_path (tests/cwd_guard.py): runs/ is made there
    assert main(["run", "--resume"]) == 2
    assert "no run directory under runs/ to resume" in capsys.readouterr().err
    small = [*CLI_ARGS[:CLI_ARGS.index("--checkpoint-every")], *CLI_ARGS[CLI_ARGS.index("--device"):]]
    assert main(["run", *small, "--rounds", "2"]) == 0  # a finished run in a new runs/dfedsam-mgs-<time>
    (finished,) = Path("runs").iterdir()
    config = config_from_args(build_parser().parse_args(["run", *small, "--rounds", "4"]))
    for name in ("older", "latest"):  # interrupted in round 2 (checkpointed at every evaluation: round 1 kept)
        with pytest.raises(KeyboardInterrupt):
            dfl.run(config, out=Path("runs") / name, callbacks=[_InterruptAt(2)])
        assert json.loads(Path("runs", name, "summary.json").read_text())["status"] == "interrupted"
        time.sleep(0.02)  # the latest is the one that wrote last
    capsys.readouterr()
    for name in ("latest", "older"):
        assert main(["run", "--resume"]) == 0
        assert f"run directory: {Path('runs', name)}" in capsys.readouterr().out
        summary = json.loads(Path("runs", name, "summary.json").read_text())
        assert summary["status"] == "completed" and summary["resumed_from_round"] == 1  # round 2 was not saved
    assert main(["run", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no interrupted run under runs/ (the latest: runs/older (completed), " \
        f"runs/latest (completed), {finished} (completed))" in err


def test_python_api_errors(tmp_path):
    data = make_data()
    config = make_config(2, algorithm="dfedavg")
    with pytest.raises(NoCheckpoint, match="has no checkpoint.pt"):
        (tmp_path / "empty").mkdir()
        dfl.run(config, data=data, out=tmp_path / "empty", resume=True)
    with pytest.raises(ValueError, match="resume=True needs out="):
        dfl.run(config, data=data, resume=True)
    out = tmp_path / "run"
    dfl.run(config, data=data, out=out)
    with pytest.raises(ValueError, match="exclude each other"):
        dfl.run(config, data=data, out=out, resume=True, overwrite=True)
    with pytest.raises(ConfigError, match=r"differs from the checkpoint.s in seed \(checkpoint 1, now 4\), algorithm "):
        dfl.run(config.replace(algorithm="dfedavgm", seed=4), data=data, out=out, resume=True)
    # the execution fields may change; the result is the same
    again = dfl.run(config.replace(client_chunk=2, eval_batch_size=7, rounds=3), data=data, out=out, resume=True)
    assert again.summary["rounds_completed"] == 3


# ---------------------------------------------------------------------------------- multi-process (gloo)
def _resume_worker(rank, world, rdzv, root):

    init_gloo(rank, world, rdzv)
    try:
        data = make_data()
        for case in ("scaffold-half", "dpsgd-one-peer", "fedavg-half-adam-keep"):
            config = make_config(6, **CASES[case])
            out = Path(root) / f"{case}-two"  # interrupted and resumed with two processes
            dfl.run(config.replace(rounds=3), data=data, out=out)
            result = dfl.run(config, data=data, out=out, resume=True)
            torch.save({"params": result.params, "ids": result.client_ids, "history": result.history},
                       Path(root) / f"{case}-two-r{rank}.pt")
            # started by one process (in the test), resumed by two
            result = dfl.run(config, data=data, out=Path(root) / f"{case}-one", resume=True)
            torch.save({"params": result.params, "ids": result.client_ids, "history": result.history},
                       Path(root) / f"{case}-one-r{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_multi_process_resume_equals_a_single_process_uninterrupted_run(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    data = make_data()
    references = {}
    for case in ("scaffold-half", "dpsgd-one-peer", "fedavg-half-adam-keep"):
        config = make_config(6, **CASES[case])
        references[case] = dfl.run(config, data=data, out=tmp_path / f"{case}-ref")
        dfl.run(config.replace(rounds=3), data=data, out=tmp_path / f"{case}-one")
    start = "fork" if sys.platform == "linux" else "spawn"
    mp.start_processes(_resume_worker, args=(world, str(tmp_path / "rdzv"), str(tmp_path)), nprocs=world,
                       join=True, start_method=start)
    volatile = TIMING | {"bytes_moved", "bytes_moved_round"}  # traffic between processes: 0 in a world of one
    for case, reference in references.items():
        for how in ("two", "one"):
            for rank in range(world):
                got = torch.load(tmp_path / f"{case}-{how}-r{rank}.pt")
                label = f"{case} {how} rank {rank}"
                # the main process holds every client's rows, the others their own block
                assert got["ids"] == (list(range(CLIENTS)) if rank == 0 else list(even_blocks(CLIENTS, world)[rank]))
                torch.testing.assert_close(got["params"], reference.params[got["ids"]], atol=1e-5, rtol=0, msg=label)
                history = got["history"]
                if rank != 0:  # per-client accuracies are reported on the main process only
                    assert all("client_acc" not in h for h in history), label
                    history = [{**h, "client_acc": r["client_acc"]} for h, r in zip(history, reference.history)]
                assert_same_history(history, reference.history, label, exact=False, skip=volatile)
            summary = json.loads((tmp_path / f"{case}-{how}" / "summary.json").read_text())
            assert summary["processes"] == world and summary["status"] == "completed"
            assert [h["round"] for h in read_metrics(tmp_path / f"{case}-{how}")] == list(range(1, 7))
    # the checkpoint of the two-process run holds every client's per-client state, written by both ranks
    got = ckpt.read(tmp_path / "scaffold-half-two")
    want = ckpt.read(tmp_path / "scaffold-half-ref")
    assert got["client_state"]["ci"].shape[0] == CLIENTS and got["params"].shape[0] == CLIENTS
    torch.testing.assert_close(got["client_state"]["ci"], want["client_state"]["ci"], atol=1e-4, rtol=0)
    assert int((want["client_state"]["ci"].abs().sum(dim=1) > 0).sum()) >= CLIENTS // 2  # sampled clients' c_i
    got = ckpt.read(tmp_path / "fedavg-half-adam-keep-two")["client_state"]
    want = ckpt.read(tmp_path / "fedavg-half-adam-keep-ref")["client_state"]
    assert torch.equal(got["adam_step"], want["adam_step"]) and int(want["adam_step"].max()) > 2  # kept over rounds
    torch.testing.assert_close(got["adam_exp_avg_sq"], want["adam_exp_avg_sq"], atol=1e-6, rtol=1e-4)
