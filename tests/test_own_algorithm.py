"""Your own algorithm: the public `Algorithm` interface, `dfl.algorithms.register`, the
`dfl.algorithms` entry-point group, `algorithm_options` (validation, ctx.hp, summary.json, resume, sweeps) and
the example plug-in package `examples/dfl_clipsam`, installed into a temporary directory and run by the CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

import dfl
from dfl.algorithms import ALGORITHMS, Algorithm, RoundStats, register
from dfl.config import Config, ConfigError
from dfl.engine.validation import validate
from dfl.files import tomllib
from dfl.registry import RegistryError
from dfl.workflows.sweep import Sweep, SweepError
from tests.helpers import blob_data

pytestmark = pytest.mark.timeout(300)  # hang guard only (pip and dfl subprocesses)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "dfl_clipsam"
CLIENTS = 4


class ReDFedAvg(Algorithm):
    """DFedAvg re-implemented with the public interface only (X^{t+1} = W Y^K)."""

    def round(self, t: int) -> RoundStats:
        ctx = self.ctx
        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t))
        self.X = ctx.gossip.mix(local.Y, t, 1)
        return RoundStats(train_loss=local.loss, models_sent=ctx.gossip.sends(t, 1))


class Periodic(Algorithm):
    """DFedAvg that gossips every `period` rounds (the docs' example), recording what it was given."""

    hyperparameters = {"momentum": 0.0, "period": 2, "scale": 1.0, "tag": "x", "verbose": False}
    seen: list[dict] = []

    def __init__(self, ctx, X):
        super().__init__(ctx, X)
        Periodic.seen.append(dict(ctx.hp))

    @classmethod
    def check_hyperparameters(cls, hp):
        if hp["period"] < 1:
            raise ValueError(f"algorithm_options.period must be >= 1, got {hp['period']}")

    def round(self, t: int) -> RoundStats:
        ctx = self.ctx
        local = ctx.trainer.train(self.X, t, ctx.lr(t), ctx.rule(t))
        self.X, sent = local.Y, np.zeros(ctx.comm.num_clients, dtype=np.int64)
        if (t + 1) % ctx.hp["period"] == 0:
            self.X, sent = ctx.gossip.mix(local.Y, t, 1), ctx.gossip.sends(t, 1)
        return RoundStats(train_loss=local.loss, models_sent=sent)


@pytest.fixture
def registered():
    """Register the test algorithms for one test only (the registry is global)."""
    register("re-dfedavg", ReDFedAvg)
    register("periodic", Periodic)
    Periodic.seen.clear()
    yield
    for name in ("re-dfedavg", "periodic"):
        ALGORITHMS.unregister(name)


make_data = partial(blob_data, sizes=(8,) * CLIENTS, shift=float(CLIENTS), test_size=20)  # client i: x + i


def tiny(**changes) -> Config:
    values = dict(clients=CLIENTS, rounds=4, eval_every=2, model="logreg", local_steps=2, batch_size=4,
                  progress=False, device="cpu", train_eval_samples=16)
    return Config(**{**values, **changes})


# ------------------------------------------------------------------------------------------ Python registration
def test_a_registered_reimplementation_of_dfedavg_equals_the_builtin(registered):
    data = make_data()
    mine = dfl.run(tiny(algorithm="re-dfedavg"), data=data)
    builtin = dfl.run(tiny(algorithm="dfedavg"), data=data)
    torch.testing.assert_close(mine.params, builtin.params, atol=1e-6, rtol=0)
    assert [h["test_acc"] for h in mine.history] == [h["test_acc"] for h in builtin.history]
    assert mine.summary["bytes_sent_total"] == builtin.summary["bytes_sent_total"]
    assert ReDFedAvg.name == "re-dfedavg"  # registration names the class


def test_algorithm_options_reach_ctx_hp_and_summary_and_cannot_change_on_resume(registered, tmp_path):
    data = make_data()
    config = tiny(algorithm="periodic", algorithm_options={"period": 2, "scale": 3}, checkpoint_every=2)
    result = dfl.run(config, data=data, out=tmp_path / "run")
    hp = Periodic.seen[-1]
    assert hp == {"momentum": 0.0, "period": 2, "scale": 3.0, "tag": "x", "verbose": False}
    assert isinstance(hp["scale"], float)  # an int given for a float default becomes a float
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["hyperparameters"] == hp
    every = dfl.run(tiny(algorithm="dfedavg"), data=data)
    assert 2 * result.summary["bytes_sent_total"] == every.summary["bytes_sent_total"]  # gossips half the rounds
    with pytest.raises(ConfigError, match=r"differs from the checkpoint's in algorithm_options \(checkpoint "
                                          r"\{'period': 2, 'scale': 3\}, now \{'period': 3, 'scale': 3\}\)"):
        dfl.run(config.replace(algorithm_options={"period": 3, "scale": 3}, rounds=6), data=data,
                out=tmp_path / "run", resume=True)


def test_a_registered_name_validates_and_the_choices_include_it(registered):
    validate(Config(algorithm="periodic"))
    ALGORITHMS.unregister("periodic")
    with pytest.raises(ConfigError, match=r"algorithm must be one of dpsgd, .*re-dfedavg; got 'periodic'"):
        validate(Config(algorithm="periodic"))


@pytest.mark.parametrize("options, message", [
    ({"perod": 3}, r"algorithm_options: unknown key 'perod' for algorithm 'periodic'; its options are "
                   r"period \(default 2\), scale \(default 1.0\), tag \(default 'x'\), verbose \(default False\)"),
    ({"period": "two"}, r"algorithm_options.period must be an integer \(its default is 2\), got 'two'"),
    ({"period": 2.0}, r"algorithm_options.period must be an integer"),
    ({"scale": True}, r"algorithm_options.scale must be a finite number"),
    ({"scale": float("nan")}, r"algorithm_options.scale must be a finite number"),
    ({"verbose": 1}, r"algorithm_options.verbose must be true or false"),
    ({"tag": 3}, r"algorithm_options.tag must be a string"),
    ({"momentum": 0.5}, r"algorithm_options.momentum: momentum is a Config field; set it as momentum = 0.5 "
                        r"\(--momentum\)"),
    ({"period": 0}, r"algorithm_options.period must be >= 1, got 0"),  # the class's check_hyperparameters
])
def test_bad_algorithm_options_are_config_errors(registered, options, message):
    with pytest.raises(ConfigError, match=message):
        validate(Config(algorithm="periodic", algorithm_options=options))


def test_built_in_algorithms_take_no_algorithm_options():
    with pytest.raises(ConfigError, match="unknown key 'clip' for algorithm 'dfedsam'; it takes no algorithm_options"):
        validate(Config(algorithm="dfedsam", algorithm_options={"clip": 1.0}))
    with pytest.raises(ConfigError, match="algorithm_options must be a table of key = value"):
        validate(Config(algorithm_options=[1]))


class _NoRound(Algorithm):
    pass


class _BadHp(ReDFedAvg):
    hyperparameters = [("rho", 0.1)]


class _BadKey(ReDFedAvg):
    hyperparameters = {"my-option": 1}


class _FieldKey(ReDFedAvg):
    hyperparameters = {"lr": 0.1}


class _BadState(ReDFedAvg):
    client_state = "u"


class _Named(ReDFedAvg):
    name = "something-else"


@pytest.mark.parametrize("obj, message", [
    (object, r"algorithm 'bad' \(builtins.object\) must be a subclass of dfl.algorithms.Algorithm"),
    (lambda ctx, X: None, r"must be a subclass of dfl.algorithms.Algorithm"),
    (_NoRound, r"algorithm 'bad' \(tests\.test_own_algorithm\._NoRound\) must define round\(self, t\) -> RoundStats"),
    (_BadHp, r"hyperparameters must be a dict of name -> default"),
    (_BadKey, r"hyperparameter names must be identifiers .* got 'my-option'"),
    (_FieldKey, r"hyperparameter 'lr' is a Config field that algorithms do not own \(read it from ctx.config.lr\)"),
    (_BadState, r"client_state must be a tuple of state\(\) keys, got 'u'"),
    (_Named, r"declares name = 'something-else' but is registered as 'bad'"),
])
def test_registration_refuses_what_cannot_run(obj, message):
    with pytest.raises(TypeError, match=message):
        register("bad", obj)
    assert "bad" not in ALGORITHMS


def test_a_name_registered_twice_is_an_error_naming_both(registered):
    with pytest.raises(RegistryError, match=r"algorithm 'dfedavg' is registered twice: by dfl.algorithms.dfedavg."
                                            r"DFedAvg and by tests.test_own_algorithm.ReDFedAvg"):
        register("dfedavg", ReDFedAvg)
    with pytest.raises(RegistryError, match="registered twice"):

        @dfl.algorithms.register("periodic")
        class Another(Periodic):
            pass

    assert ALGORITHMS.get("dfedavg").__name__ == "DFedAvg"


def test_dfl_exposes_the_algorithms_package():
    import dfl.algorithms as algorithms

    assert dfl.__getattr__("algorithms") is algorithms and algorithms.register == ALGORITHMS.register


def test_the_docs_example_registers_and_runs(monkeypatch, capsys):
    """The docs' "Your own algorithm" example (docs/how-to/own-algorithm.md) as written, with dfl.run shrunk to a
    tiny problem and its printed hyperparameters checked (pytest-markdown-docs runs it as written too)."""
    import re

    section = (ROOT / "docs" / "how-to" / "own-algorithm.md").read_text()
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    run = dfl.run
    shrink = dict(dataset="synthetic", model="logreg", clients=CLIENTS, rounds=4, local_steps=2, eval_every=4)
    monkeypatch.setattr(dfl, "run", lambda config, **kw: run(config.replace(**shrink), **kw))
    try:
        exec(compile(code, "own-algorithm.md", "exec"), {"__name__": "docs"})
    finally:
        ALGORITHMS.unregister("periodic-dfedavg")
    assert "{'momentum': 0.0, 'period': 4}" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ sweeps
def test_a_sweep_grids_over_an_algorithm_option(registered):
    spec = tomllib.loads(textwrap.dedent("""
        [base]
        algorithm = "periodic"
        rounds = 2
        algorithm_options = {scale = 2.0}
        [vary]
        algorithm_options.period = [1, 2]
    """))
    sweep = Sweep.from_dict(spec)
    assert sweep.vary == {"algorithm_options.period": [1, 2]}
    planned = sweep.plan()
    assert [p.name for p in planned] == ["algorithm_options.period=1", "algorithm_options.period=2"]
    assert [p.config.algorithm_options for p in planned] == [{"scale": 2.0, "period": 1}, {"scale": 2.0, "period": 2}]
    assert Sweep.from_dict(tomllib.loads(sweep.to_toml())).vary == sweep.vary  # the saved sweep.toml reloads
    quoted = Sweep.from_dict({"base": {"algorithm": "periodic", "algorithm_options.scale": 2.0},
                              "vary": {"algorithm_options.period": [1, 2]}})
    assert [p.config.algorithm_options for p in quoted.plan()] == [p.config.algorithm_options for p in planned]
    with pytest.raises(SweepError, match=r"run algorithm_options.period=0: algorithm_options.period must be >= 1"):
        Sweep.from_dict({"base": {"algorithm": "periodic"}, "vary": {"algorithm_options.period": [0]}}).plan()
    with pytest.raises(SweepError, match=r"algorithm_options.scale in both \[base\] and \[vary\]"):
        Sweep.from_dict({"base": {"algorithm_options": {"scale": 1.0}}, "vary": {"algorithm_options.scale": [2.0]}})
    with pytest.raises(SweepError, match=r"unknown Config field 'lr.x' in \[vary\] \(did you mean 'lr'\?\)"):
        Sweep.from_dict({"vary": {"lr.x": [1]}})


# ------------------------------------------------------------------------------------------ the example package
PLUGIN_SCRIPT = """
import contextlib, io, json, sys
from pathlib import Path

import torch

import dfl
from dfl.algorithms import ALGORITHMS
from dfl.cli import main

out = Path(sys.argv[1])
assert "dfl-clipsam" in ALGORITHMS.source("dfedsam-clip"), ALGORITHMS.source("dfedsam-clip")

# the CLI (`dfl run ...` is `dfl.cli.main`): the entry point makes the name valid there
argv = ["run", "--algorithm", "dfedsam-clip", "--algorithm-options", "clip=0.5", "error_feedback=true",
        "--clients", "4", "--rounds", "2", "--eval-every", "2", "--dataset", "synthetic", "--model", "logreg",
        "--local-steps", "2", "--no-progress", "--out", str(out / "cli")]
assert main(argv) == 0
summary = json.loads((out / "cli" / "summary.json").read_text())
assert summary["algorithm"] == "dfedsam-clip" and summary["status"] == "completed", summary
assert summary["hyperparameters"]["clip"] == 0.5 and summary["hyperparameters"]["error_feedback"] is True
with contextlib.redirect_stdout(io.StringIO()) as listing:
    assert main(["list", "algorithms", "--json"]) == 0
entry = {e["name"]: e for e in json.loads(listing.getvalue())["algorithms"]}["dfedsam-clip"]
assert entry["options"]["clip"] == 1.0 and entry["algorithm_options"] == ["clip", "error_feedback"], entry
assert entry["description"].startswith("DFedSAM with per-client clipping"), entry
base = dict(clients=4, rounds=4, eval_every=2, dataset="synthetic", model="logreg", local_steps=2, progress=False)

# clip = 0 (off) is DFedSAM, through the Python API
off = dfl.run(dfl.Config(algorithm="dfedsam-clip", algorithm_options={"clip": 0.0}, **base))
dfedsam = dfl.run(dfl.Config(algorithm="dfedsam", **base))
torch.testing.assert_close(off.params, dfedsam.params, atol=1e-5, rtol=0)

# clipping with error feedback changes the run; its per-client residual survives a checkpoint and resume
config = dfl.Config(algorithm="dfedsam-clip", algorithm_options={"clip": 0.01, "error_feedback": True},
                    checkpoint_every=2, **base)
full = dfl.run(config)
assert (full.params - dfedsam.params).abs().max() > 1e-3
dfl.run(config.replace(rounds=2), out=out / "part")
resumed = dfl.run(config, out=out / "part", resume=True)
torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)
from dfl.engine import checkpoint
state = checkpoint.read(out / "part")["client_state"]
assert set(state) == {"residual"} and state["residual"].shape == full.params.shape and state["residual"].abs().max() > 0

# a sweep over the option, from a TOML file
(out / "sweep.toml").write_text('''
[base]
algorithm = "dfedsam-clip"
clients = 4
rounds = 2
eval_every = 2
dataset = "synthetic"
model = "logreg"
local_steps = 2
progress = false
[vary]
algorithm_options.clip = [0.0, 0.01]
''')
assert main(["sweep", str(out / "sweep.toml"), "--out", str(out / "sweep"), "--no-report"]) == 0
runs = json.loads((out / "sweep" / "sweep.json").read_text())["runs"]
assert [(r["name"], r["status"]) for r in runs] == [("algorithm_options.clip=0.0", "completed"),
                                                     ("algorithm_options.clip=0.01", "completed")], runs
clipped = out / "sweep" / "runs" / "algorithm_options.clip=0.01"
hp = json.loads((clipped / "summary.json").read_text())["hyperparameters"]
assert hp["clip"] == 0.01 and hp["error_feedback"] is False
print("plugin ok")
"""


@pytest.mark.slow
def test_the_example_package_installs_and_runs_from_the_cli_python_and_a_sweep(tmp_path):
    """pip-installs a copy of examples/dfl_clipsam into a temporary directory (the venv and the example directory
    are untouched), then, in a process that sees it: `dfl list algorithms`, `dfl run --algorithm dfedsam-clip
    --algorithm-options ...`, the Python API (clip = 0 equals DFedSAM; resume restores the per-client residual)
    and `dfl sweep` over `algorithm_options.clip`."""
    source, site = tmp_path / "src", tmp_path / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(site), str(source)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    assert "dfl.algorithms" in next(site.glob("dfl_clipsam-*.dist-info")).joinpath("entry_points.txt").read_text()
    paths = [str(site), str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}

    done = subprocess.run([sys.executable, "-c", PLUGIN_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                          env=env)
    assert done.returncode == 0 and "plugin ok" in done.stdout, done.stderr[-3000:]
