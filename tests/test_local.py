"""Vectorized local training (`dfl.training.local`) equals a sequential per-client loop with torch.optim (the
design contract "vectorized = sequential", docs/architecture.md#design-contracts)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dfl.config import Config
from dfl.data import FederatedData
from dfl.training.clients import ParamLayout, initial_stack
from dfl.training.local import LocalRule, LocalTrainer, sam_point
from tests.helpers import LOCAL_RULES, LOCAL_SIZES, local_data, sequential_reference, small_mlp


@pytest.mark.parametrize("rule_name", list(LOCAL_RULES))
@pytest.mark.parametrize("work", [{"local_epochs": 2}, {"local_steps": 5}])
def test_vectorized_equals_sequential(rule_name, work, device, slack):
    rule = LOCAL_RULES[rule_name]
    data = local_data().to(device)
    model = small_mlp().to(device)
    layout = ParamLayout.of(model)
    config = Config(clients=len(LOCAL_SIZES), batch_size=4, seed=3, **work)
    trainer = LocalTrainer(model, layout, data, list(range(len(LOCAL_SIZES))), config)
    X0 = initial_stack(model, len(LOCAL_SIZES), device)
    X0 = X0 + 0.1 * torch.randn(X0.shape, generator=torch.Generator().manual_seed(1)).to(device)  # distinct clients
    result = trainer.train(X0, round_index=2, lr=0.1, rule=rule)
    reference = sequential_reference(model, layout, data, trainer.schedule(2), X0, 0.1, rule)
    torch.testing.assert_close(result.Y, reference, atol=1e-5 * slack, rtol=1e-5 * slack)
    assert not torch.allclose(result.Y, X0)


def test_epochs_mode_masks_finished_clients(device):
    data = local_data().to(device)
    model = small_mlp().to(device)
    config = Config(clients=4, batch_size=4, local_epochs=3)
    trainer = LocalTrainer(model, ParamLayout.of(model), data, [0, 1, 2, 3], config)
    schedule = trainer.schedule(0)
    # ceil(n_i / B) steps per epoch: (3, 2, 4, 2) × 3 epochs, no padded fake steps
    assert schedule.steps_per_client.tolist() == [9, 6, 12, 6]
    # every epoch visits each of the client's samples exactly once
    B = schedule.batch_size
    for i in range(len(LOCAL_SIZES)):
        epoch = schedule.index[i, : schedule.steps_per_client[i] // 3 * B]
        weight = schedule.weight[i, : schedule.steps_per_client[i] // 3 * B]
        assert sorted(epoch[weight > 0].tolist()) == sorted(data.client_indices[i].tolist())


def test_full_batch_is_deterministic_gradient_descent(device):
    data = local_data().to(device)
    model = small_mlp().to(device)
    layout = ParamLayout.of(model)
    config = Config(clients=4, batch_size=0, local_steps=3)
    X0 = initial_stack(model, 4, device)
    a = LocalTrainer(model, layout, data, [0, 1, 2, 3], config).train(X0, 0, 0.1, LocalRule())
    b = LocalTrainer(model, layout, data, [0, 1, 2, 3], config.replace(seed=7)).train(X0, 5, 0.1, LocalRule())
    torch.testing.assert_close(a.Y, b.Y)
    # one GD step by hand for client 1
    net = copy.deepcopy(model)
    one = LocalTrainer(model, layout, data, [0, 1, 2, 3], config.replace(local_steps=1)).train(X0, 0, 0.1, LocalRule())
    idx = data.client_indices[1]
    F.cross_entropy(net(data.train_x[idx]), data.train_y[idx]).backward()
    with torch.no_grad():
        expected = torch.cat([(p - 0.1 * p.grad).reshape(-1) for p in net.parameters()])
    torch.testing.assert_close(one.Y[1], expected)


def test_results_do_not_depend_on_chunk_or_client_subset(device, slack):
    data = local_data().to(device)
    model = small_mlp().to(device)
    layout = ParamLayout.of(model)
    X0 = initial_stack(model, 4, device)
    rule = LocalRule(rho=0.05, momentum=0.5)
    full = LocalTrainer(model, layout, data, [0, 1, 2, 3], Config(clients=4, batch_size=4)).train(X0, 1, 0.1, rule)
    chunked = LocalTrainer(model, layout, data, [0, 1, 2, 3], Config(clients=4, batch_size=4, client_chunk=3))
    torch.testing.assert_close(chunked.train(X0, 1, 0.1, rule).Y, full.Y, atol=1e-6 * slack, rtol=1e-6 * slack)
    # a process hosting only clients 2 and 3 computes the same rows (world-size invariance)
    part = LocalTrainer(model, layout, data, [2, 3], Config(clients=4, batch_size=4)).train(X0[2:], 1, 0.1, rule)
    torch.testing.assert_close(part.Y, full.Y[2:], atol=1e-6 * slack, rtol=1e-6 * slack)


def plain_sgd(model, layout, data, schedule, X0, lr):
    """x <- x - lr grad f(x; batch) for each client's scheduled batches, by autograd on a copy of the model: no
    optimizer, no LocalRule, so nothing shared with the trainer but the batches."""
    B, rows = schedule.batch_size, []
    for i in range(X0.shape[0]):
        net = copy.deepcopy(model)
        layout.load_into(net, X0[i])
        for k in range(int(schedule.steps_per_client[i])):
            idx = schedule.index[i, k * B : (k + 1) * B]
            keep = schedule.weight[i, k * B : (k + 1) * B] > 0
            loss = F.cross_entropy(net(data.train_x[idx[keep]]), data.train_y[idx[keep]])
            grads = torch.autograd.grad(loss, list(net.parameters()))
            with torch.no_grad():
                for p, g in zip(net.parameters(), grads):
                    p.sub_(lr * g)
        rows.append(layout.flatten(net))
    return torch.stack(rows)


@pytest.mark.parametrize("sam", ["sam", "asam"])
def test_sam_with_rho_zero_is_sgd(device, sam, slack):
    """rho = 0 leaves no ascent step: SAM and ASAM take the plain SGD steps x <- x - lr grad f(x), computed by hand.
    The same comparison tells rho = 0.05 apart, so it is sharp enough to see a perturbation that rho = 0 kept."""
    data = local_data().to(device)
    model = small_mlp().to(device)
    layout = ParamLayout.of(model)
    X0 = initial_stack(model, 4, device)
    trainer = LocalTrainer(model, layout, data, [0, 1, 2, 3], Config(clients=4, batch_size=4))
    sgd = plain_sgd(model, layout, data, trainer.schedule(0), X0, 0.1)
    zero = trainer.train(X0, 0, 0.1, LocalRule(rho=0.0, sam=sam, asam_eta=0.5)).Y
    torch.testing.assert_close(zero, sgd, atol=1e-5 * slack, rtol=1e-5 * slack)
    ascent = trainer.train(X0, 0, 0.1, LocalRule(rho=0.05, sam=sam, asam_eta=0.5)).Y
    assert not torch.allclose(ascent, sgd, atol=1e-5 * slack, rtol=1e-5 * slack)


def test_sam_perturbation_uses_joint_norm(device):
    """ε = ρ g/‖g‖ with one norm over all parameters, per client row (docs/reference/update-rules.md#sam-and-asam)."""
    layout = ParamLayout.of(small_mlp())
    g = torch.randn(4, layout.dim).to(device)
    zero = torch.zeros_like(g)
    mask = layout.mask(lambda name: "weight" in name).to(device)
    (eps,) = sam_point((zero,), (g,), LocalRule(rho=0.3), (mask,))
    torch.testing.assert_close(eps.norm(dim=1), torch.full((4,), 0.3, device=device))
    torch.testing.assert_close(eps / eps.norm(dim=1, keepdim=True), g / g.norm(dim=1, keepdim=True))


@pytest.mark.parametrize("rule", [LocalRule(rho=0.3), LocalRule(rho=0.3, sam="asam", asam_eta=0.5),
                                  LocalRule(rho=0.3, sam="asam", asam_form="dp-fedsam")], ids=["sam", "asam", "dp"])
def test_sam_point_per_parameter_equals_joined_rows(device, rule):
    """The SAM point of the parameter-by-parameter parts (`ParamLayout.split`) is the joined rows' SAM point."""
    layout = ParamLayout.of(small_mlp())
    gen = torch.Generator().manual_seed(0)
    y, g = (torch.randn(4, layout.dim, generator=gen).to(device) for _ in range(2))
    mask = layout.mask(lambda name: "weight" in name).to(device)
    (joined,) = sam_point((y,), (g,), rule, (mask,))
    parts = sam_point(layout.split(y), layout.split(g), rule, layout.split(mask))
    torch.testing.assert_close(layout.join(parts), joined)
    if rule.sam == "asam":  # T = 1 on biases in Kwon's form only: the two forms differ
        other = LocalRule(rho=0.3, sam="asam", asam_eta=0.5, asam_form="kwon" if rule.asam_form != "kwon"
                          else "dp-fedsam")
        assert not torch.allclose(sam_point((y,), (g,), other, (mask,))[0], joined)


def test_augmented_batches_depend_only_on_seed_client_and_round(device):
    g = torch.Generator().manual_seed(0)
    train = [(torch.randn(6, 3, 8, 8, generator=g), torch.randint(0, 2, (6,), generator=g)) for _ in range(4)]
    data = FederatedData.from_arrays(train=train, test=train[0], num_classes=2, augment="crop-flip").to(device)
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 2)).to(device)
    config = Config(clients=4, batch_size=4, local_steps=3)
    layout = ParamLayout.of(model)
    everyone = LocalTrainer(model, layout, data, [0, 1, 2, 3], config).schedule(5)
    alone = LocalTrainer(model, layout, data, [2], config).schedule(5)
    for k in range(3):
        torch.testing.assert_close(everyone.batch(k).x[2], alone.batch(k).x[0])
    assert not torch.equal(everyone.batch(0).x[2], data.train_x[everyone.index[2, :4]])  # augmented
    other_round = LocalTrainer(model, layout, data, [2], config).schedule(6)
    assert not torch.equal(other_round.batch(0).x[0], alone.batch(0).x[0])
