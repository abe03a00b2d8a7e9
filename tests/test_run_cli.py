"""`dfl run`: flags and TOML, the run directory, errors, and an end-to-end run on MNIST-1D."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dfl.cli import build_parser, main
from dfl.cli.run import config_from_args
from dfl.config import Config, ConfigError

SMALL = [
    "--dataset-options", "num_samples=1200", "--clients", "8", "--model", "mlp", "--rounds", "2",
    "--eval-every", "1", "--no-progress",
]


def parse(argv):
    return config_from_args(build_parser().parse_args(["run", *argv]))


def test_flags_override_toml_and_defaults(tmp_path):
    path = tmp_path / "cfg.toml"
    path.write_text('algorithm = "dfedavgm"\nrounds = 7\nclients = 12\n[topology_options]\ndegree = 4\n')
    config = parse([str(path), "--rounds", "100", "--topology", "random-regular", "--rho", "0.05",
                    "--model-options", "hidden=[32, 16]", "--no-progress"])
    assert config.algorithm == "dfedavgm" and config.clients == 12 and config.rounds == 100
    assert config.topology == "random-regular" and config.topology_options == {"degree": 4}
    assert config.rho == 0.05 and config.model_options == {"hidden": [32, 16]} and config.progress is False


def test_toml_round_trip(tmp_path):
    config = Config(algorithm="dfedsam", rho=0.02, topology_options={"k": 3}, local_steps=4)
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml())
    assert Config.from_toml(path) == config


def test_unknown_toml_field_is_an_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("learning_rate = 0.1\n")
    with pytest.raises(ConfigError, match="unknown config field.*learning_rate"):
        Config.from_toml(path)


def test_cli_run_writes_run_directory_and_refuses_overwrite(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", *SMALL, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "test accuracy" in printed and str(out) in printed
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert main(["run", *SMALL, "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["run", *SMALL, "--out", str(out), "--overwrite"]) == 0


def test_without_out_every_run_gets_a_new_directory_under_runs(tmp_path, capsys):
    # the current directory is tmp_path (tests/cwd_guard.py); the README's `dfl run` twice in a row
    assert main(["run", *SMALL]) == 0
    assert main(["run", *SMALL, "--algorithm", "dfedavg"]) == 0
    assert main(["run", *SMALL, "--name", "mine"]) == 0
    printed = capsys.readouterr().out
    runs = sorted(Path("runs").iterdir())
    assert [re.sub(r"\d{8}-\d{6}", "T", run.name) for run in runs] == ["dfedavg-T", "dfedsam-mgs-T", "mine-T"]
    for run in runs:
        assert f"run directory: {run}" in printed
        assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert main(["run", *SMALL, "--topology", "Ring"]) == 2  # refused: no directory is left behind
    assert "did you mean 'ring'" in capsys.readouterr().err and len(list(Path("runs").iterdir())) == 3


def test_a_mistake_in_the_config_is_named_before_the_directory(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", *SMALL, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", *SMALL, "--out", str(out), "--topology", "Ring"]) == 2  # the typo, not "already exists"
    err = capsys.readouterr().err
    assert err.startswith("dfl run: error: topology must be one of") and "already exists" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--algorithm", "dsgd"], "algorithm must be one of"),
        (["--dataset", "cifar10", "--data-root", "/nonexistent/dir"], "cifar"),
        (["--partition", "iid", "--alpha", "0.5"], "alpha applies only to the dirichlet"),
    ],
)
def test_cli_errors_are_one_line_messages(tmp_path, capsys, argv, message):
    assert main(["run", *SMALL, "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_end_to_end_mnist1d_beats_chance(tmp_path):
    """The console script, as a user runs it: DFedSAM-MGS on a ring learns MNIST-1D (10 classes)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "dfl.cli", "run", "--rounds", "25", "--eval-every", "25", "--no-progress",
           "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["algorithm"] == "dfedsam-mgs" and summary["clients"] == 16
    assert summary["test_acc"] > 0.3  # chance is 0.1
