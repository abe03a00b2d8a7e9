"""Property-based tests (hypothesis) over Config fields, TOML files and `dfl run` arguments.

Whatever is typed, the answer is a dfl error with a one-line message or a config that runs: never another
exception, never a hang (sizes stay bounded: a value that would make a run large is refused by the size checks),
never a changed file that was there before. The CLI runs in-process (`dfl.cli.main`) with the run itself
replaced by a recorder, so an example costs milliseconds; a few accepted configs then really run, tiny.
Example counts are bounded so the module takes well under a minute on 2 cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import math
import os
import tempfile
from dataclasses import fields
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dfl
from dfl.cli import main
from dfl.config import Config
from dfl.errors import ArgumentError, ConfigError
from dfl.files import tomllib

pytestmark = pytest.mark.timeout(240)  # a hang guard only

FIELDS = [f.name for f in fields(Config)]
# What the fuzzing keeps small, so that an accepted config is a tiny run
TINY = {"rounds": 1, "clients": 2, "model": "logreg", "dataset_options": {"num_samples": 200}, "progress": False,
        "local_steps": 1, "train_eval_samples": 0, "eval_batch_size": 64, "device": "cpu", "batch_size": 8}
# DFL_FUZZ_EXAMPLES=5000 (and DFL_FUZZ_RANDOM=1 for fresh examples) fuzzes harder, by hand; the suite runs 150
EXAMPLES = int(os.environ.get("DFL_FUZZ_EXAMPLES", "150"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("DFL_FUZZ_RANDOM"),
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# values of every shape: the types a field may have, and the ones it may not, huge and tiny
scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70), st.sampled_from([0, 1, -1, 2**63 - 1, 2**63, 10**20, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1e-300, 1e300, 0.5, 1.0]),
    st.text(max_size=12).filter(lambda t: ":" not in t),  # "module:factory" would import modules by name
    st.sampled_from(["auto", "ring", "dfedsam", "mnist1d", "iid", "sgd", "", " ", "none", "cpu", "cuda:x", "../x"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)
option_tables = st.dictionaries(st.sampled_from(["num_samples", "alpha", "seed", "root", "degree", "k", "p",
                                                 "hidden", "shape", "sigma", "test_fraction", "size_log_sigma",
                                                 "num_clients", "matrix", "x"]), scalars, max_size=2)


def _one_line_dfl_error(exc: BaseException) -> None:
    assert isinstance(exc, ConfigError) or type(exc).__module__.startswith(("dfl.", "topologies.")), \
        f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text


def _validates(config: Config) -> bool:
    try:
        dfl.validate(config)
    except ValueError as exc:
        _one_line_dfl_error(exc)
        return False
    return True


def _built(values: dict) -> Config | None:
    """Config(**values), or None when it refuses a value of the wrong type (an ArgumentError: a ConfigError and a
    TypeError, one line)."""
    try:
        return Config(**values)
    except TypeError as exc:
        assert isinstance(exc, ArgumentError), f"{type(exc).__name__}: {exc}"
        _one_line_dfl_error(exc)
        return None


# ------------------------------------------------------------------------------------------------ Config
@SETTINGS
@given(st.dictionaries(st.sampled_from(FIELDS), values, min_size=1, max_size=3))
def test_any_field_values_are_a_one_line_error_or_valid(changes):
    changes = {k: v for k, v in changes.items() if not (k == "model" and isinstance(v, str) and ":" in v)}
    config = _built({**TINY, **changes})
    if config is not None and _validates(config):  # then what config.toml holds reads back and validates too
        assert _validates(Config.from_dict(tomllib.loads(config.to_toml())))


@SETTINGS
@given(st.sampled_from(["topology_options", "dataset_options", "partition_options", "model_options",
                        "algorithm_options"]), option_tables,
       st.sampled_from(["ring", "grid", "random-regular", "erdos-renyi", "random-k", "custom", "star"]),
       st.sampled_from(["dirichlet", "iid", "shards", "similarity", "dirichlet-class"]),
       st.sampled_from(["mnist1d", "synthetic", "digits"]))
def test_any_component_options_are_a_one_line_error_or_valid(table, options, topology, partition, dataset):
    config = _built({**TINY, "topology": topology, "partition": partition, "dataset": dataset, table: options})
    if config is not None:
        _validates(config)


# ------------------------------------------------------------------------------------------------ TOML files
@contextlib.contextmanager
def _directory_with_a_file_of_the_user():
    """A working directory holding a file dfl did not write, and its hash (it must never change)."""
    with tempfile.TemporaryDirectory() as tmp:
        mine = Path(tmp) / "mine.txt"
        mine.write_text("the user's own file\n")
        before = hashlib.sha256(mine.read_bytes()).hexdigest()
        yield Path(tmp)
        assert hashlib.sha256(mine.read_bytes()).hexdigest() == before


@SETTINGS
@given(st.binary(max_size=200))
def test_any_bytes_as_a_config_file(content):
    with _directory_with_a_file_of_the_user() as tmp:
        path = tmp / "c.toml"
        path.write_bytes(content)
        try:
            Config.from_toml(path)
        except ConfigError as exc:
            _one_line_dfl_error(exc)
            assert str(path) in str(exc)


toml_values = st.recursive(
    st.one_of(st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(),
              st.text(max_size=10).filter(lambda t: ":" not in t)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=5)


@SETTINGS
@given(st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(min_size=1, max_size=8)), toml_values,
                       max_size=4))
def test_any_toml_table_as_a_config_file(table):
    with _directory_with_a_file_of_the_user() as tmp:
        path = tmp / "c.toml"
        path.write_text(tomli_w.dumps({**{k: v for k, v in TINY.items() if k not in table}, **table}))
        try:
            config = Config.from_toml(path)
        except ConfigError as exc:
            _one_line_dfl_error(exc)
            return
        _validates(config)


# ------------------------------------------------------------------------------------------------ CLI
FLAGS = ["--" + name.replace("_", "-") for name in FIELDS] + ["--log", "--out", "--overwrite", "--resume"]
words = st.one_of(st.sampled_from(FLAGS), st.text(max_size=10).filter(lambda t: ":" not in t),
                  st.sampled_from(["0", "-1", "1e30", "nan", "inf", "100000000000000000000", "x=1", "root=/r",
                                   "alpha=0.1", "[1,2]", "{}", "ring", "auto", "''", "--", "-"]))


class Recorder:
    """Stands in for `dfl.engine.runner.run`: what the CLI would run is a config that validates."""

    def __init__(self):
        self.configs = []

    def __call__(self, config, **kwargs):
        self.configs.append(config)
        raise KeyboardInterrupt  # leaves the CLI the way a Ctrl-C would, before any work


@SETTINGS
@given(st.lists(words, max_size=6))
def test_any_dfl_run_arguments(argv):
    import dfl.engine.runner as runner

    recorder, saved = Recorder(), runner.run
    err = io.StringIO()
    with _directory_with_a_file_of_the_user() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        runner.run = recorder
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                status = main(["run", *argv, "--rounds", "1", "--no-progress"])
        except SystemExit as exc:  # argparse's own refusals (an unknown flag, a value of the wrong type)
            assert exc.code == 2
            return
        finally:
            runner.run = saved
            os.chdir(cwd)
    text = err.getvalue()
    if recorder.configs:  # accepted: it validates as a Config on its own too
        assert status == 130
        dfl.validate(recorder.configs[0])
    else:
        assert status == 2, text
        assert text.count("\n") == 1 and text.startswith("dfl run: error: "), text


# ------------------------------------------------------------------------------------------------ runs
@settings(max_examples=max(6, EXAMPLES // 50), deadline=None, derandomize=not os.environ.get("DFL_FUZZ_RANDOM"),
          database=None, suppress_health_check=list(HealthCheck))
@given(st.fixed_dictionaries({}, optional={
    "algorithm": st.sampled_from(["dpsgd", "dfedsam", "fedavg", "scaffold"]),
    "topology": st.sampled_from(["ring", "full", "star", "exponential"]),
    "lr": st.sampled_from([1e-9, 0.1, 10.0, 1e30]),
    "batch_size": st.sampled_from([0, 1, 10**6]),
    "partition": st.sampled_from(["iid", "shards", "dirichlet"]),
    "rho": st.sampled_from([0.0, 1e6]),
}))
def test_accepted_configs_run_tiny(changes):
    config = _built({**TINY, **changes})
    if config is None or not _validates(config):
        return
    try:
        result = dfl.run(config)
    except dfl.DivergenceError as exc:  # a diverged run is a status, with its one line
        _one_line_dfl_error(exc)
        return
    except ValueError as exc:  # what only the built data or graph can tell (e.g. shards on too few labels)
        _one_line_dfl_error(exc)
        return
    assert result.summary["status"] == "completed"
    assert all(math.isfinite(h["test_loss"]) for h in result.history)
