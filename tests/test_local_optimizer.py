"""Local Adam/AdamW (`local_optimizer`, `dfl.training.adam`): m independent torch optimizers, reset vs keep, the
algorithms that thread the state, checkpoint/resume, and the options' validation. (The per-round exactness of Adam/AdamW
with SAM, ASAM, clipping and weight decay is in tests/test_local.py's `RULES`.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import dfl
import topologies
from dfl.algorithms import ALGORITHMS, algorithm_class
from dfl.cli import build_parser
from dfl.cli.run import config_from_args
from dfl.config import Config, ConfigError
from dfl.engine import checkpoint as ckpt
from dfl.engine.validation import validate
from dfl.training.adam import AdamState
from dfl.training.clients import ParamLayout, initial_stack
from dfl.training.local import LocalRule, LocalTrainer
from tests.helpers import (
    LOCAL_SIZES,
    assert_same_history,
    base_config,
    blob_data,
    interrupted,
    local_data,
    reference_trainer,
    sequential_reference,
    small_data,
    small_mlp,
    tiny_config,
)

ADAPTIVE = {"dpsgd", "dfedavg", "dfedsam", "dfedsam-mgs", "fedavg", "fedsam", "fedavgsm", "fedprox", "fedadam",
            "fedyogi", "fedadagrad"}
RULES = {"adam": LocalRule(optimizer="adam", weight_decay=1e-2, rho=0.05),
         "adamw": LocalRule(optimizer="adamw", weight_decay=1e-2, adam_betas=(0.8, 0.95))}


def setup(device, **config):
    data, model = local_data().to(device), small_mlp().to(device)
    layout = ParamLayout.of(model)
    clients = list(range(len(LOCAL_SIZES)))
    trainer = LocalTrainer(model, layout, data, clients, Config(clients=4, batch_size=4, **config))
    X0 = initial_stack(model, len(LOCAL_SIZES), device)
    X0 = X0 + 0.1 * torch.randn(X0.shape, generator=torch.Generator().manual_seed(1)).to(device)
    return model, layout, data, trainer, X0


# ---------------------------------------------------------------------------------- the local trainer
@pytest.mark.parametrize("name", RULES)
def test_kept_state_continues_each_clients_torch_optimizer_across_rounds(name, device, slack):
    """keep: two rounds (different lr, epochs mode: clients take 6, 4, 8, 4 steps, so later steps update only some
    rows; chunks of 3 clients) equal one torch.optim Adam/AdamW per client that lives through both rounds; the
    state's step counts are the steps taken."""
    rule = RULES[name]
    model, layout, data, trainer, X = setup(device, local_epochs=2, client_chunk=3)
    state, kept = AdamState.zeros(X), {}
    for t, lr in ((2, 0.05), (3, 0.02)):
        reference = sequential_reference(model, layout, data, trainer.schedule(t), X, lr, rule, kept=kept)
        X = trainer.train(X, t, lr, rule, adam=state).Y
        torch.testing.assert_close(X, reference, atol=1e-6 * slack, rtol=1e-6 * slack)
    assert state.step.tolist() == [6 + 6, 4 + 4, 8 + 8, 4 + 4]
    flat = torch.stack([torch.cat([kept[i]["state"][j]["exp_avg_sq"].reshape(-1) for j in range(4)])
                        for i in range(4)])
    torch.testing.assert_close(state.exp_avg_sq, flat, atol=1e-9, rtol=1e-5)


def test_reset_starts_every_round_from_fresh_moments(device, slack):
    rule = RULES["adam"]
    model, layout, data, trainer, X0 = setup(device, local_steps=3)
    reset = trainer.train(trainer.train(X0, 0, 0.05, rule).Y, 1, 0.05, rule)
    X1 = sequential_reference(model, layout, data, trainer.schedule(0), X0, 0.05, rule)
    X2 = sequential_reference(model, layout, data, trainer.schedule(1), X1, 0.05, rule)  # a new optimizer
    torch.testing.assert_close(reset.Y, X2, atol=1e-6 * slack, rtol=1e-6 * slack)
    assert reset.adam.step.tolist() == [3] * 4  # this round's steps only
    state = AdamState.zeros(X0)
    kept = trainer.train(trainer.train(X0, 0, 0.05, rule, adam=state).Y, 1, 0.05, rule, adam=state)
    assert kept.adam is state and not torch.allclose(kept.Y, reset.Y)


def test_clients_that_do_not_train_keep_their_state(device, slack):
    rule = RULES["adamw"]
    _, _, _, trainer, X0 = setup(device, local_steps=2)
    state, everyone = AdamState.zeros(X0), AdamState.zeros(X0)
    state.exp_avg[0] = 7.0
    everyone.exp_avg[0] = 7.0
    rows = torch.tensor([1, 3])
    some = trainer.train(X0, 0, 0.05, rule, rows=rows, adam=state)
    full = trainer.train(X0, 0, 0.05, rule, adam=everyone)
    assert state.step.tolist() == [0, 2, 0, 2]
    assert (state.exp_avg[0] == 7.0).all() and (state.exp_avg[2] == 0).all() and (some.Y[[0, 2]] == X0[[0, 2]]).all()
    torch.testing.assert_close(some.Y[rows], full.Y[rows], atol=1e-6 * slack, rtol=1e-6 * slack)
    torch.testing.assert_close(state.exp_avg[rows], everyone.exp_avg[rows])


# ---------------------------------------------------------------------------------- the algorithms
@pytest.mark.parametrize("keep", [False, True])
def test_dpsgd_adam_is_w_x_minus_each_clients_torch_adam_step(keep, device):
    """X^{k+1} = W X^k − (X^k − Adam_step(X^k)), full-batch gradients at X^k; moments per client, fresh every
    round (reset) or carried over (keep); 2 rounds of 2 iterations."""
    config = base_config(algorithm="dpsgd", batch_size=0, local_steps=2, rounds=2, local_optimizer="adam",
                         local_optimizer_state="keep" if keep else "reset", device=device)
    data = small_data()
    result = dfl.run(config, data=data)
    trainer = reference_trainer(config, data.to(device))
    W = torch.tensor(topologies.build("ring", 8).W, dtype=torch.float64, device=device)
    X = result.initial_params.clone().to(device)
    params = [torch.nn.Parameter(x.clone()) for x in X]
    optimizers = [torch.optim.Adam([p], lr=0.1) for p in params]
    for t in range(2):
        if not keep:
            optimizers = [torch.optim.Adam([p], lr=0.1) for p in params]
        for k in range(2):
            G, _ = trainer.gradient(X, trainer.schedule(t).batch(k))
            for p, x, g, opt in zip(params, X, G, optimizers):
                p.data.copy_(x)
                p.grad = g.clone()
                opt.step()
            step = X - torch.stack([p.detach() for p in params])
            X = (W @ X.double()).float() - step
    torch.testing.assert_close(result.params, X.cpu(), atol=1e-5, rtol=1e-5)


def test_dfedsam_adam_keep_threads_the_state_through_rounds(device):
    config = base_config(algorithm="dfedsam-mgs", rho=0.05, gossip_steps=2, rounds=2, local_optimizer="adamw",
                         local_optimizer_state="keep", weight_decay=0.01, device=device)
    data = small_data()
    result = dfl.run(config, data=data)
    trainer = reference_trainer(config, data.to(device))
    W2 = torch.tensor(np.linalg.matrix_power(topologies.build("ring", 8).W, 2), device=device)
    rule = LocalRule(rho=0.05, optimizer="adamw", weight_decay=0.01)
    X, state = result.initial_params.to(device), AdamState.zeros(result.initial_params.to(device))
    for t in range(2):
        X = (W2 @ trainer.train(X, t, 0.1, rule, adam=state).Y.double()).float()
    torch.testing.assert_close(result.params, X.cpu(), atol=1e-5, rtol=1e-5)


def test_exactly_the_adaptive_algorithms_accept_adam_and_keep_changes_them():
    assert {name for name, cls in ALGORITHMS.items() if "adam" in cls.card.local_optimizers} == ADAPTIVE
    assert all(cls.card.local_optimizers in (("sgd",), ("sgd", "adam", "adamw")) for _, cls in ALGORITHMS.items())
    data = small_data()
    for name in sorted(ADAPTIVE):
        centralized = getattr(algorithm_class(name), "centralized", False)
        config = base_config(algorithm=name, local_optimizer="adam", lr=0.01, local_steps=1, rounds=2,
                             eval_every=2, participation=0.5 if centralized else None)
        reset, keep = (dfl.run(config.replace(local_optimizer_state=s), data=data) for s in ("reset", "keep"))
        assert not torch.allclose(keep.params, reset.params), name  # Adam runs, and the kept moments reach round 2


# ---------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("changes", [
    dict(algorithm="dfedsam", local_optimizer="adamw", weight_decay=0.01),
    dict(algorithm="fedavg", participation=0.5, local_optimizer="adam"),
    dict(algorithm="dpsgd", local_optimizer="adam"),
], ids=["dfedsam-adamw", "fedavg-half-adam", "dpsgd-adam"])
def test_keep_resumes_exactly_and_checkpoints_the_moments_per_client(tmp_path, changes):
    data = blob_data((6, 7, 8, 6, 7, 8), shift=1.0)
    config = tiny_config(rounds=4, lr=0.01, checkpoint_every=2, local_optimizer_state="keep", **changes)
    full = dfl.run(config, data=data)
    resumed = interrupted(config, 2, tmp_path / "run", data)
    torch.testing.assert_close(resumed.params, full.params, atol=0, rtol=0)
    assert_same_history(resumed.history, full.history)
    checkpoint = ckpt.read(tmp_path / "run")
    state = checkpoint["client_state"]
    assert set(AdamState.KEYS) <= set(state) and not set(AdamState.KEYS) & set(checkpoint["server_state"])
    d = full.params.shape[1]
    assert state["adam_exp_avg"].shape == state["adam_exp_avg_sq"].shape == (config.clients, d)
    assert state["adam_step"].shape == (config.clients,) and state["adam_step"].max() > 2  # accumulated over rounds
    reset = tiny_config(rounds=2, lr=0.01, checkpoint_every=2, **changes)
    dfl.run(reset, data=data, out=tmp_path / "reset")
    assert not set(AdamState.KEYS) & set(ckpt.read(tmp_path / "reset")["client_state"])
    with pytest.raises(ConfigError, match="local_optimizer_state"):
        dfl.run(config.replace(local_optimizer_state="reset"), data=data, out=tmp_path / "run", resume=True)


# ---------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("changes, message", [
    ({"local_optimizer": "rmsprop"}, "local_optimizer must be one of sgd, adam, adamw; got 'rmsprop'"),
    ({"local_optimizer": "adam", "local_optimizer_state": "carry"}, "local_optimizer_state must be one of reset, "
                                                                    "keep"),
    ({"local_optimizer": "adam", "adam_betas": [0.9, 1.0]}, r"adam_betas must be two numbers \(beta1, beta2\) in "
                                                            r"\[0, 1\), got \[0.9, 1.0\]"),
    ({"local_optimizer": "adam", "adam_betas": [-0.1, 0.9]}, "adam_betas must be two numbers"),
    ({"local_optimizer": "adam", "adam_betas": [0.9]}, "adam_betas must be two numbers"),
    ({"local_optimizer": "adam", "adam_betas": ["0.9", 0.99]}, "adam_betas must be two numbers"),
    ({"local_optimizer": "adam", "adam_eps": 0.0}, "adam_eps must be > 0.0, got 0.0"),
    ({"local_optimizer": "adam", "adam_eps": -1e-8}, "adam_eps must be > 0.0"),
    ({"adam_eps": 1e-6}, "adam_eps = 1e-06 applies only to local_optimizer = adam or adamw, but local_optimizer = sgd"),
    ({"adam_betas": [0.8, 0.9]}, "adam_betas = \\[0.8, 0.9\\] applies only to local_optimizer = adam or adamw"),
    ({"local_optimizer_state": "keep"}, "local_optimizer_state = 'keep' applies only to local_optimizer = adam"),
    ({"algorithm": "scaffold", "local_optimizer": "adam"}, "local_optimizer = adam is not defined for scaffold, "
                                                           "whose update rule is written in SGD steps"),
    ({"algorithm": "feddyn", "local_optimizer": "adamw"}, "local_optimizer = adamw is not defined for feddyn"),
    ({"algorithm": "dfedavgm", "local_optimizer": "adam"}, "not defined for dfedavgm.* dpsgd, dfedavg, dfedsam"),
    ({"algorithm": "dfedsam", "local_optimizer": "adam", "momentum": 0.5},
     r"momentum = 0.5 is SGD's heavy ball; local_optimizer = adam has its own first moment \(adam_betas\[0\]\)"),
])
def test_bad_input_is_a_config_error_naming_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate(Config(**changes))


def test_local_rule_rejects_unknown_optimizer_and_momentum_with_adam():
    with pytest.raises(ValueError, match="optimizer must be one of sgd, adam, adamw"):
        LocalRule(optimizer="lion")
    with pytest.raises(ValueError, match="momentum = 0.9 is SGD's heavy ball"):
        LocalRule(optimizer="adam", momentum=0.9)


def test_cli_flags_and_toml_round_trip(tmp_path):
    args = build_parser().parse_args(["run", "--algorithm", "dfedsam", "--local-optimizer", "adamw", "--adam-betas",
                                      "0.9", "0.99", "--adam-eps", "1e-7", "--local-optimizer-state", "keep"])
    config = validate(config_from_args(args))
    assert (config.local_optimizer, config.adam_betas, config.adam_eps, config.local_optimizer_state) == (
        "adamw", [0.9, 0.99], 1e-7, "keep")
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml())
    assert validate(Config.from_toml(path)) == config
