"""SAM radius schedules (`rho_schedule`, `rho_ramp_rounds`): one ramp for every SAM algorithm (FedGLoSS's included),
validation, CLI flags, resume, and the `rho` recorded per evaluation."""

from __future__ import annotations

import warnings

import pytest
import torch

import dfl
from dfl.algorithms import Context, resolve_hyperparameters
from dfl.cli import build_parser
from dfl.cli.run import config_from_args
from dfl.config import Config, ConfigError
from dfl.engine.checkpoint import check_config
from dfl.engine.validation import validate
from tests.helpers import base_config, small_data

SAM_ALGORITHMS = ("dfedsam", "dfedsam-mgs", "fedsam", "mofedsam", "fedgloss")


def context(config: Config) -> Context:
    hp = resolve_hyperparameters(validate(config))
    return Context(config=config, hp=hp, trainer=None, gossip=None, comm=None)


@pytest.mark.parametrize("algorithm", SAM_ALGORITHMS)
def test_linear_ramp_closed_form_and_the_rule_uses_it(algorithm):
    ctx = context(Config(algorithm=algorithm, rho=0.101, rho_schedule="linear", rho_ramp_rounds=10))
    want = [0.001 + 0.1 * min(t / 10, 1.0) for t in range(15)]
    assert [ctx.rho(t) for t in range(15)] == pytest.approx(want, rel=1e-15)
    assert ctx.rho(0) == pytest.approx(0.001) and ctx.rho(10) == ctx.rho(14) == 0.101
    assert [ctx.rule(t).rho for t in range(15)] == [ctx.rho(t) for t in range(15)]
    assert context(Config(algorithm=algorithm, rho=0.0005, rho_schedule="linear", rho_ramp_rounds=4)).rho(0) == 0.0005


@pytest.mark.parametrize("algorithm", ["dfedsam", "fedsam", "mofedsam", "dfedsam-mgs"])
def test_constant_is_the_default_and_exactly_rho(algorithm):
    ctx = context(Config(algorithm=algorithm, rho=0.07))
    assert ctx.hp["rho_schedule"] == "constant"
    assert [ctx.rule(t).rho for t in (0, 5, 500)] == [0.07] * 3


def test_fedgloss_keeps_its_linear_default_and_plain_rho_ramp_rounds():
    """FedGLoSS's presets set only rho_ramp_rounds: its default schedule is linear, so they ramp as before;
    T_s <= 1 (the default 0) is constant; both the client and the server radius ramp."""
    ctx = context(Config(algorithm="fedgloss", rho=0.15, server_rho=0.05, rho_ramp_rounds=2000))
    assert ctx.hp["rho_schedule"] == "linear"
    assert ctx.rho(1000) == pytest.approx(0.001 + 0.149 / 2) and ctx.rule(1000).rho == ctx.rho(1000)
    assert ctx.rho(1000, 0.05) == pytest.approx(0.001 + 0.049 / 2)
    for changes in ({}, {"rho_ramp_rounds": 1}, {"rho_schedule": "constant"}):
        ctx = context(Config(algorithm="fedgloss", rho=0.15, **changes))
        assert ctx.rho(0) == ctx.rho(7) == 0.15


def test_non_sam_algorithms_have_rho_zero_and_refuse_the_schedule_options():
    assert context(Config(algorithm="dfedavg")).rule(3).rho == 0.0
    with pytest.raises(ConfigError, match="rho_schedule = 'linear' is not read by dfedavg.*; rho_ramp_rounds = 5 is"):
        validate(Config(algorithm="dfedavg", rho_schedule="linear", rho_ramp_rounds=5))


def test_a_ramping_run_trains_round_t_with_rho_t_and_logs_it():
    """Round 0 of a ramp is a constant-ρ_0 run; every evaluation records the round's ρ_t; non-SAM runs log no rho."""
    data = small_data()
    ramp = dfl.run(base_config(algorithm="dfedsam", rho=0.05, rho_schedule="linear", rho_ramp_rounds=4, rounds=5),
                   data=data)
    assert [h["rho"] for h in ramp.history] == pytest.approx([0.001 + 0.049 * min(t / 4, 1) for t in range(5)])
    first = dfl.run(base_config(algorithm="dfedsam", rho=0.001, rounds=1), data=data)
    head = dfl.run(base_config(algorithm="dfedsam", rho=0.05, rho_schedule="linear", rho_ramp_rounds=4, rounds=1),
                   data=data)
    torch.testing.assert_close(head.params, first.params, atol=0, rtol=0)
    assert not torch.allclose(ramp.params, dfl.run(base_config(algorithm="dfedsam", rho=0.05, rounds=5),
                                                   data=data).params)
    assert "rho" not in dfl.run(base_config(algorithm="dfedavg", rounds=1), data=data).history[-1]


@pytest.mark.parametrize("changes, message", [
    ({"rho_schedule": "cosine"}, "rho_schedule must be one of constant, linear; got 'cosine'"),
    ({"rho_schedule": "linear"}, "rho_schedule = linear needs rho_ramp_rounds >= 2 .*got 0"),
    ({"rho_schedule": "linear", "rho_ramp_rounds": 1}, "rho_schedule = linear needs rho_ramp_rounds >= 2"),
    ({"rho_ramp_rounds": 10}, "rho_ramp_rounds = 10 applies only to rho_schedule = linear, but dfedsam-mgs's "
                              "rho_schedule is constant"),
    ({"algorithm": "fedgloss", "rho_schedule": "constant", "rho_ramp_rounds": 10}, "rho_ramp_rounds = 10 applies"),
    ({"rho_ramp_rounds": -1}, "rho_ramp_rounds must be >= 0"),
    ({"rho_ramp_rounds": 2.5}, "rho_ramp_rounds must be an integer"),
])
def test_validation_errors_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(Config(**changes))


def test_cli_flags_and_toml_round_trip(tmp_path):
    args = build_parser().parse_args(["run", "--algorithm", "fedsam", "--rho-schedule", "linear",
                                      "--rho-ramp-rounds", "20"])
    config = validate(config_from_args(args))
    assert config.rho_schedule == "linear" and config.rho_ramp_rounds == 20
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml())
    assert validate(Config.from_toml(path)) == config


def test_resume_may_extend_a_ramp_but_not_change_it(tmp_path):
    """The ramp depends on t alone (not on `rounds`): a run may be extended; the schedule fields may not change."""
    base = dict(algorithm="dfedsam", rho_schedule="linear", rho_ramp_rounds=10)
    checkpoint = {"round": 5, "config": Config(rounds=10, **base).to_dict()}
    check_config(checkpoint, Config(rounds=20, **base), "run")
    with pytest.raises(ConfigError, match="rho_ramp_rounds"):
        check_config(checkpoint, Config(rounds=10, **{**base, "rho_ramp_rounds": 20}), "run")
    data = small_data()
    config = base_config(algorithm="dfedsam", rho=0.05, rho_schedule="linear", rho_ramp_rounds=3, rounds=4)
    full = dfl.run(config, data=data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dfl.run(config.replace(rounds=2), data=data, out=tmp_path / "run")
        resumed = dfl.run(config, data=data, out=tmp_path / "run", resume=True)
    torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)
    assert [h["rho"] for h in resumed.history] == [h["rho"] for h in full.history]
