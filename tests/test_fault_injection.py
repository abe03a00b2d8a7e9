"""Fault injection: SIGKILL a run at chosen points of its file writes and between rounds; every file left in
the run directory is complete, and resuming gives exactly the final parameters and metrics of an
uninterrupted run. (`tests/test_resume.py` covers a SIGKILL at a random moment inside a round.)

The kills are deterministic and need nothing in the library: a launcher process imports dfl once, then for
each step forks a child that patches `os.replace` (the last step of every atomic write in `dfl.engine.results`) or
the algorithm's `round` from the outside, and SIGKILLs itself at the N-th write of a given file or at the
start of round k. A kill "mid-write" first cuts the temporary file to half its size, which is what a kill
while the bytes are being written leaves on disk; a kill "before rename" leaves the complete temporary file.
N and k are drawn from seeded generators, so every run of this module injects the same faults.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dfl
from dfl.config import Config
from dfl.engine import checkpoint as ckpt
from dfl.engine.results import RUN_FILES, read_metrics
from dfl.engine.validation import resolved

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.timeout(300)  # hang guard only; the launcher has its own timeouts

ROUNDS, CHECKPOINT_EVERY = 6, 2
TIMING = {"seconds_per_round"}  # the only field allowed to differ between a resumed and an uninterrupted run


def make_config() -> Config:
    # eval every round, checkpoint every 2: a kill can leave metrics.jsonl ahead of checkpoint.pt
    return Config(
        seed=3, rounds=ROUNDS, algorithm="dfedsam-mgs", gossip_steps=2, clients=4, dataset="mnist1d",
        dataset_options={"num_samples": 600}, model="logreg", local_steps=2, batch_size=8, train_eval_samples=50,
        eval_every=1, checkpoint_every=CHECKPOINT_EVERY, client_chunk=0, device="cpu", progress=False,
    )


# One process imports dfl once; each step runs in a forked child, which installs its kill point and runs
# (or resumes) the run. The launcher prints one JSON line per step: how the child ended.
LAUNCHER = r"""
import json, os, signal, sys, traceback
import torch
import dfl, dfl.engine.runner  # dfl.run imports the engine lazily: once here, not in every child
from dfl.algorithms import algorithm_class
from dfl.config import Config
from dfl.data.mnist1d import load_mnist1d

plan = json.loads(open(sys.argv[1]).read())
torch.set_num_threads(plan["threads"])  # as in the test process, which computes the uninterrupted run
load_mnist1d(num_samples=600)  # generated (numpy only) and cached before forking

def install(kill):
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    if kill["at"] == "round":
        cls = algorithm_class(kill["algorithm"])
        original_round = cls.round
        def round_(self, t):
            if t + 1 == kill["n"]:  # at the start of round n: rounds < n are done (and written)
                die()
            return original_round(self, t)
        cls.round = round_
        return
    target, calls = kill["file"], [0]
    original_replace = os.replace
    def replace(src, dst, *args, **kwargs):
        if os.path.basename(dst) == target and os.path.basename(src).startswith("." + target + ".") and (
                "contains" not in kill or kill["contains"].encode() in open(src, "rb").read()):
            calls[0] += 1
            if calls[0] == kill["n"]:
                if kill["at"] == "mid-write":
                    os.truncate(src, os.path.getsize(src) // 2)
                die()
        return original_replace(src, dst, *args, **kwargs)
    os.replace = replace

for step in plan["steps"]:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(120)  # a hung child dies (SIGALRM) instead of outliving the test
            install(step["kill"])
            if step["resume"]:
                dfl.run(Config.from_toml(os.path.join(step["out"], "config.toml")), out=step["out"], resume=True)
            else:
                dfl.run(Config.from_toml(plan["config"]), out=step["out"])
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    print(json.dumps({"out": step["out"], "signal": signum, "exit": exit_code}), flush=True)
"""


def _pick(case: str, choices) -> int:
    return random.Random(f"fault-injection:{case}").choice(list(choices))  # str seeds are stable across runs


def _ckpt_before(round_: int) -> int:
    """The round of the last checkpoint written before round `round_` (1-based) started."""
    return (round_ - 1) // CHECKPOINT_EVERY * CHECKPOINT_EVERY


def _cases():
    """name -> (kills of successive steps, the round of the checkpoint the resume starts from).

    With one evaluation per round, the n-th metrics write of a fresh run is round n's record; the n-th
    checkpoint write is after round CHECKPOINT_EVERY·n. `contains`: count only the writes holding that text."""
    checkpoints = ROUNDS // CHECKPOINT_EVERY
    cases = {}
    for at in ("mid-write", "before-rename"):
        n = _pick(f"checkpoint {at}", range(2, checkpoints + 1))  # the first one: nothing to resume from
        cases[f"checkpoint.pt {at}"] = ([dict(at=at, file="checkpoint.pt", n=n)], CHECKPOINT_EVERY * (n - 1))
        n = _pick(f"metrics {at}", range(CHECKPOINT_EVERY + 1, ROUNDS + 1))
        cases[f"metrics.jsonl {at}"] = ([dict(at=at, file="metrics.jsonl", n=n)], _ckpt_before(n))
    n = _pick("between rounds", range(CHECKPOINT_EVERY + 1, ROUNDS + 1))
    cases["between rounds"] = ([dict(at="round", algorithm="dfedsam-mgs", n=n)], _ckpt_before(n))
    # the final summary.json (all rounds done and checkpointed), then params.pt after the summary says so
    final = dict(at="mid-write", file="summary.json", n=1, contains='"status": "completed"')
    cases["summary.json mid-write"] = ([final], ROUNDS)
    cases["params.pt before-rename"] = ([dict(at="before-rename", file="params.pt", n=1)], ROUNDS)
    # killed between rounds, then the resume killed while it rewrites metrics.jsonl from the checkpoint
    n = _pick("resume killed", range(CHECKPOINT_EVERY + 2, ROUNDS + 1, CHECKPOINT_EVERY))  # metrics ahead
    cases["resume killed mid-write"] = (
        [dict(at="round", algorithm="dfedsam-mgs", n=n), dict(at="mid-write", file="metrics.jsonl", n=1)],
        _ckpt_before(n),
    )
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    result = dfl.run(make_config(), out=out)
    return result, read_metrics(out)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """Run every case's steps in the launcher; returns {case: (run directory, [how each step ended])}."""
    root = tmp_path_factory.mktemp("killed")
    (root / "config.toml").write_text(make_config().to_toml())
    dirs = {case: root / f"case{i}" for i, case in enumerate(CASES)}
    steps = [
        {"out": str(dirs[case]), "resume": i > 0, "kill": kill}
        for case, (kills, _) in CASES.items() for i, kill in enumerate(kills)
    ]
    plan = {"threads": torch.get_num_threads(), "config": str(root / "config.toml"), "steps": steps}
    (root / "plan.json").write_text(json.dumps(plan))
    script = root / "launcher.py"
    script.write_text(LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(script), str(root / "plan.json")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its forked children
        stdout, stderr = proc.communicate()
        pytest.fail(f"the fault-injection launcher timed out: {stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    ended: dict[str, list[dict]] = {case: [] for case in CASES}
    by_dir = {str(d): case for case, d in dirs.items()}
    for line in stdout.splitlines():
        record = json.loads(line)
        ended[by_dir[record["out"]]].append(record)
    return {case: (dirs[case], ended[case], stderr) for case in CASES}


def assert_complete_files(run: Path, reference_metrics, expected_round: int) -> None:
    """Every run file that exists parses completely, and what it holds is the uninterrupted run's so far."""
    assert (run / "config.toml").is_file() and (run / "checkpoint.pt").is_file()
    config = Config.from_toml(run / "config.toml")
    assert tomllib.loads((run / "config.toml").read_text()) and config == resolved(make_config())
    text = (run / "metrics.jsonl").read_text()
    assert text.endswith("\n"), "metrics.jsonl ends inside a line"
    lines = [json.loads(line) for line in text.splitlines()]  # every line is complete JSON
    assert len(lines) >= expected_round  # the records after the checkpoint are recomputed on resume
    assert_same_metrics(lines, reference_metrics[:len(lines)])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rounds"] == ROUNDS and summary["status"] in ("running", "completed")
    json.loads((run / "partition.json").read_text())
    checkpoint = ckpt.load(run)
    assert checkpoint["round"] == expected_round
    assert_same_metrics(checkpoint["history"], reference_metrics[:expected_round])
    if (run / "params.pt").exists():
        torch.load(run / "params.pt", weights_only=True)


def assert_same_metrics(got, want) -> None:
    assert [h["round"] for h in got] == [h["round"] for h in want]
    for g, w in zip(got, want):
        assert set(g) == set(w)
        for key in w.keys() - TIMING:
            assert g[key] == w[key], f"round {w['round']} {key}: {g[key]} != {w[key]}"


def temporaries(run: Path) -> list[str]:
    """The temporary files of atomic writes of run files (`.<name>.<random>`) in `run`."""
    return sorted(p.name for p in run.iterdir() if any(p.name.startswith(f".{name}.") for name in RUN_FILES))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_sigkill_at_a_write_or_between_rounds_then_resume_equals_an_uninterrupted_run(case, killed, uninterrupted):
    run, ended, stderr = killed[case]
    kills, expected_round = CASES[case]
    assert [e["signal"] for e in ended] == [signal.SIGKILL] * len(kills), (
        f"{case}: a step was not killed at its kill point ({ended}); launcher stderr:\n{stderr[-3000:]}"
    )
    reference, reference_metrics = uninterrupted

    assert_complete_files(run, reference_metrics, expected_round)
    last = kills[-1]
    if last["at"] in ("mid-write", "before-rename"):  # the kill landed between writing the temporary and renaming
        left = temporaries(run)
        assert any(name.startswith(f".{last['file']}.") for name in left), left
        if last["file"] == "params.pt":
            assert not (run / "params.pt").exists()
            # params.pt is written before the summary says "completed": the run is not marked done
            assert json.loads((run / "summary.json").read_text())["status"] == "running"
        if last["file"] == "summary.json":  # the final summary's temporary, cut in half; the first one is whole
            assert json.loads((run / "summary.json").read_text())["status"] == "running"

    result = dfl.run(Config.from_toml(run / "config.toml"), out=run, resume=True)
    assert torch.equal(result.params, reference.params)
    assert torch.equal(torch.load(run / "params.pt", weights_only=True)["params"], reference.params)
    assert_same_metrics(read_metrics(run), reference_metrics)
    assert_same_metrics(result.history, reference.history)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == ROUNDS
    assert summary["resumed_from_round"] == expected_round
    assert summary["bytes_sent_total"] == reference.summary["bytes_sent_total"]
    assert temporaries(run) == [], "the temporaries of the killed writes are removed on resume"
