"""Learning-rate schedules (`lr_schedule`, `warmup_rounds`): closed forms, validation, CLI flags, resume, and the
`lr` recorded per evaluation."""

from __future__ import annotations

import math

import pytest

import dfl
from dfl.algorithms.base import Context, scheduled_lr
from dfl.cli import build_parser
from dfl.cli.run import config_from_args
from dfl.config import Config, ConfigError
from dfl.engine.checkpoint import check_config
from dfl.engine.validation import validate


def lrs(config: Config) -> list[float]:
    ctx = Context(config=validate(config), hp={}, trainer=None, gossip=None, comm=None)
    return [ctx.lr(t) for t in range(config.rounds)]


# ---------------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("lr, decay", [(0.1, 0.998), (0.05, 0.99), (0.3, 1.0), (1e-3, 0.5)])
def test_exponential_default_is_bit_identical_to_the_old_formula(lr, decay):
    config = Config(rounds=300, lr=lr, lr_decay=decay)
    assert config.lr_schedule == "exponential" and config.warmup_rounds == 0
    assert lrs(config) == [lr * decay**t for t in range(300)]  # exact equality, not approx
    assert lrs(Config(rounds=50)) == [0.1 * 0.998**t for t in range(50)]


def test_cosine_closed_form():
    config = Config(rounds=100, lr=0.2, lr_schedule="cosine", lr_min=0.02)
    got = lrs(config)
    for t in (0, 1, 25, 50, 75, 99):
        assert got[t] == pytest.approx(0.02 + 0.18 * (1 + math.cos(math.pi * t / 100)) / 2, rel=1e-15)
    assert got[0] == 0.2 and got[50] == pytest.approx(0.11)
    assert all(a > b for a, b in zip(got, got[1:]))  # strictly decreasing, never below lr_min
    assert got[-1] > 0.02 and got[-1] == pytest.approx(0.02, abs=1e-4)
    assert lrs(Config(rounds=10, lr=0.1, lr_schedule="cosine"))[5] == pytest.approx(0.05)  # lr_min = 0 by default


def test_step_closed_form():
    config = Config(rounds=20, lr=0.1, lr_schedule="step", lr_milestones=[5, 12], lr_step_factor=0.5)
    got = lrs(config)
    want = [0.1] * 5 + [0.05] * 7 + [0.025] * 8
    assert got == pytest.approx(want, rel=1e-15)
    assert got[4] == 0.1 and got[5] == 0.05 and got[11] == 0.05 and got[12] == 0.025
    # factor 1: constant
    assert lrs(config.replace(lr_step_factor=1.0)) == [0.1] * 20


@pytest.mark.parametrize("schedule, options", [
    ("exponential", {"lr_decay": 0.9}),
    ("cosine", {"lr_min": 0.01}),
    ("step", {"lr_milestones": [3], "lr_step_factor": 0.1}),
])
def test_warmup_ramps_linearly_then_runs_the_schedule_on_t_minus_w(schedule, options):
    W, T, lr = 4, 12, 0.2
    config = Config(rounds=T, lr=lr, lr_schedule=schedule, warmup_rounds=W, **options)
    got = lrs(config)
    assert got[:W] == pytest.approx([lr * (t + 1) / W for t in range(W)], rel=1e-15)
    assert got[W - 1] == lr
    # after the warmup: the same schedule, unwarmed, over T - W rounds, shifted by W
    plain = lrs(config.replace(warmup_rounds=0, rounds=T - W))
    assert got[W:] == plain
    if schedule == "step":
        assert got[W:] == pytest.approx([lr] * 3 + [lr * 0.1] * 5)  # the milestone counts rounds after warmup
    if schedule == "cosine":
        s, S = 5, T - W
        assert got[W + s] == pytest.approx(0.01 + (lr - 0.01) * (1 + math.cos(math.pi * s / S)) / 2)


def test_scheduled_lr_is_context_lr():
    config = validate(Config(rounds=8, lr_schedule="cosine", warmup_rounds=2))
    assert [scheduled_lr(config, t) for t in range(8)] == lrs(config)


# ---------------------------------------------------------------------------------- validation
@pytest.mark.parametrize("changes, message", [
    ({"lr_schedule": "linear"}, "lr_schedule must be one of exponential, cosine, step; got 'linear'"),
    ({"lr_schedule": "cosine", "lr_min": -0.1}, "lr_min must be >= 0"),
    ({"lr_schedule": "cosine", "lr_min": 0.1}, r"lr_min must be in \[0, lr\) = \[0, 0.1\)"),
    ({"lr_schedule": "cosine", "lr_min": 0.5}, r"lr_min must be in \[0, lr\)"),
    ({"lr_schedule": "cosine", "lr_min": "0.1"}, "lr_min must be a finite number"),
    ({"lr_schedule": "step"}, "lr_schedule = step needs lr_milestones"),
    ({"lr_schedule": "step", "lr_milestones": [5, 5]}, "lr_milestones must be strictly increasing positive"),
    ({"lr_schedule": "step", "lr_milestones": [6, 3]}, "lr_milestones must be strictly increasing positive"),
    ({"lr_schedule": "step", "lr_milestones": [0, 3]}, "lr_milestones must be strictly increasing positive"),
    ({"lr_schedule": "step", "lr_milestones": [-2]}, "lr_milestones must be strictly increasing positive"),
    ({"lr_schedule": "step", "lr_milestones": [3, 10]}, "lr_milestones must be < rounds - warmup_rounds = 10"),
    ({"lr_schedule": "step", "lr_milestones": [3, 8], "warmup_rounds": 2},
     "lr_milestones must be < rounds - warmup_rounds = 8 .*got 8"),
    ({"lr_schedule": "step", "lr_milestones": [2.5]}, "lr_milestones must be a list of integers"),
    ({"lr_schedule": "step", "lr_milestones": [True]}, "lr_milestones must be a list of integers"),
    ({"lr_schedule": "step", "lr_milestones": 5}, "lr_milestones must be a list of integers"),
    ({"lr_schedule": "step", "lr_milestones": [3], "lr_step_factor": 0.0}, "lr_step_factor must be > 0"),
    ({"lr_schedule": "step", "lr_milestones": [3], "lr_step_factor": 1.5}, r"lr_step_factor must be in \(0, 1\]"),
    ({"warmup_rounds": -1}, "warmup_rounds must be >= 0"),
    ({"warmup_rounds": 10}, "warmup_rounds must be < rounds = 10"),
    ({"warmup_rounds": 1.5}, "warmup_rounds must be an integer"),
    # options of another schedule: an error naming the option and the schedule it belongs to
    ({"lr_min": 0.01}, "lr_min = 0.01 applies only to lr_schedule = cosine, but lr_schedule = exponential"),
    ({"lr_milestones": [3]}, "lr_milestones = \\[3\\] applies only to lr_schedule = step, but lr_schedule = expo"),
    ({"lr_step_factor": 0.5}, "lr_step_factor = 0.5 applies only to lr_schedule = step"),
    ({"lr_schedule": "cosine", "lr_decay": 0.99}, "lr_decay = 0.99 applies only to lr_schedule = exponential, "
                                                  "but lr_schedule = cosine"),
    ({"lr_schedule": "step", "lr_milestones": [3], "lr_decay": 1.0}, "lr_decay = 1.0 applies only to lr_sched"),
    ({"lr_schedule": "cosine", "lr_milestones": [3]}, "lr_milestones = \\[3\\] applies only to lr_schedule = step"),
    ({"lr_schedule": "step", "lr_milestones": [3], "lr_min": 0.01}, "lr_min = 0.01 applies only to lr_schedule = c"),
])
def test_validation_errors_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(Config(rounds=10, lr=0.1, **changes))


def test_valid_configs_and_defaults_of_other_schedules_pass():
    validate(Config(rounds=10, lr_schedule="cosine", lr_decay=0.998, lr_step_factor=0.1, lr_milestones=[]))
    validate(Config(rounds=10, lr_schedule="step", lr_milestones=(2, 9), lr_min=0.0))  # a tuple is fine too
    validate(Config(rounds=10, warmup_rounds=9))
    validate(Config(rounds=10, lr_schedule="cosine", lr_min=0.099, warmup_rounds=3))


def test_toml_round_trip(tmp_path):
    config = Config(rounds=20, lr_schedule="step", lr_milestones=[5, 12], lr_step_factor=0.5, warmup_rounds=2)
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml())
    assert validate(Config.from_toml(path)) == config


# ---------------------------------------------------------------------------------- CLI flags
def test_cli_flags_parse_schedule_options(tmp_path):
    args = build_parser().parse_args([
        "run", "--rounds", "20", "--lr-schedule", "step", "--lr-milestones", "5", "12", "--lr-step-factor", "0.5",
        "--warmup-rounds", "3",
    ])
    config = validate(config_from_args(args))
    assert config.lr_milestones == [5, 12] and config.lr_step_factor == 0.5 and config.warmup_rounds == 3
    # an empty --lr-milestones clears a list set by the config file
    path = tmp_path / "c.toml"
    path.write_text(Config(rounds=20, lr_schedule="step", lr_milestones=[5]).to_toml())
    args = build_parser().parse_args(["run", str(path), "--lr-schedule", "cosine", "--lr-milestones",
                                      "--lr-min", "0.001"])
    config = validate(config_from_args(args))
    assert config.lr_milestones == [] and config.lr_schedule == "cosine" and config.lr_min == 0.001
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--lr-milestones", "five"])


# ---------------------------------------------------------------------------------- resume
def test_resume_rule_cosine_fixes_rounds_others_may_extend():
    checkpoint = {"round": 5, "config": Config(rounds=10, lr_schedule="cosine").to_dict()}
    check_config(checkpoint, Config(rounds=10, lr_schedule="cosine"), "run")  # same rounds: fine
    with pytest.raises(ConfigError, match="lr_schedule = cosine anneals over the run's rounds = 10.*rounds = 10"):
        check_config(checkpoint, Config(rounds=20, lr_schedule="cosine"), "run")
    with pytest.raises(ConfigError, match="lr_schedule = cosine"):
        check_config(checkpoint, Config(rounds=8, lr_schedule="cosine"), "run")
    for options in ({}, {"lr_schedule": "step", "lr_milestones": [3]}, {"warmup_rounds": 2}):
        checkpoint = {"round": 5, "config": Config(rounds=10, **options).to_dict()}
        check_config(checkpoint, Config(rounds=20, **options), "run")  # no dependence on rounds: may grow
    # a checkpoint from before the schedules (no lr_schedule key) counts as exponential, as it was
    old = Config(rounds=10).to_dict()
    for name in ("lr_schedule", "lr_min", "lr_milestones", "lr_step_factor", "warmup_rounds"):
        del old[name]
    check_config({"round": 5, "config": old}, Config(rounds=20), "run")
    with pytest.raises(ConfigError, match="differs from the checkpoint.s in lr_schedule"):
        check_config({"round": 5, "config": old}, Config(rounds=10, lr_schedule="cosine"), "run")


def test_resume_of_a_cosine_run_with_more_rounds_fails_through_dfl_run(tmp_path):
    config = small_run_config(rounds=4, lr_schedule="cosine", eval_every=2)
    out = tmp_path / "run"
    dfl.run(config.replace(), out=out)
    with pytest.raises(ConfigError, match="lr_schedule = cosine anneals"):
        dfl.run(config.replace(rounds=6), out=out, resume=True)


# ---------------------------------------------------------------------------------- a run records lr
def small_run_config(**changes) -> Config:
    values = dict(clients=4, model="logreg", local_steps=1, batch_size=8, rounds=6, eval_every=1, progress=False,
                  device="cpu", dataset_options={"num_samples": 400}, train_eval_samples=50)
    return Config(**{**values, **changes})


def test_run_records_the_cosine_lr_per_evaluation():
    config = small_run_config(lr=0.2, lr_schedule="cosine", lr_min=0.02, warmup_rounds=2, algorithm="dfedavg")
    result = dfl.run(config)
    assert [h["round"] for h in result.history] == [1, 2, 3, 4, 5, 6]
    got = [h["lr"] for h in result.history]
    want = [0.1, 0.2] + [0.02 + 0.18 * (1 + math.cos(math.pi * s / 4)) / 2 for s in range(4)]
    assert got == pytest.approx(want, rel=1e-12)
    assert all(math.isfinite(h["train_loss"]) for h in result.history)
