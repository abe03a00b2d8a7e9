"""Contract 1: vectorized local training equals a sequential per-client loop with torch.optim."""

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

SIZES = (10, 7, 13, 5)


def make_data(seed=0, sizes=SIZES):
    g = torch.Generator().manual_seed(seed)
    train = []
    for n in sizes:
        x = torch.randn(n, 6, generator=g)
        y = torch.randint(0, 3, (n,), generator=g)
        train.append((x, y))
    test = (torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
    return FederatedData.from_arrays(train=train, test=test, num_classes=3)


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def torch_optimizer(params, lr, rule):
    """torch.optim.SGD, Adam or AdamW with the rule's hyperparameters (`weight_decay` passed explicitly: AdamW's
    own default is 0.01)."""
    if rule.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=rule.momentum, weight_decay=rule.weight_decay)
    cls = torch.optim.Adam if rule.optimizer == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=rule.adam_betas, eps=rule.adam_eps, weight_decay=rule.weight_decay)


def sequential_reference(model, layout, data, schedule, X0, lr, rule, kept=None):
    """A plain loop: per-client nn.Module, torch.optim.SGD/Adam/AdamW, SAM as in davda54/sam (perturb, restore,
    step). `kept` (client -> optimizer state_dict) carries each client's optimizer state across calls (rounds)."""
    rows = []
    for i in range(X0.shape[0]):
        net = copy.deepcopy(model)
        layout.load_into(net, X0[i])
        opt = torch_optimizer(net.parameters(), lr, rule)
        if kept is not None and i in kept:
            opt.load_state_dict(kept[i])
            for group in opt.param_groups:
                group["lr"] = lr  # the state dict also restores the previous round's lr
        B = schedule.batch_size
        for k in range(int(schedule.steps_per_client[i])):
            idx = schedule.index[i, k * B : (k + 1) * B]
            keep = schedule.weight[i, k * B : (k + 1) * B] > 0
            x, y = data.train_x[idx[keep]], data.train_y[idx[keep]]
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            if rule.rho > 0:
                params = list(net.parameters())
                with torch.no_grad():
                    if rule.sam == "asam":
                        scales = [
                            p.abs() if rule.asam_form == "dp-fedsam"  # the DP-FedSAM code: |w| everywhere
                            else (p.abs() + rule.asam_eta) if "weight" in n else torch.ones_like(p)
                            for n, p in net.named_parameters()
                        ]
                        norm = torch.norm(torch.stack([(s * p.grad).norm() for s, p in zip(scales, params)]))
                        eps = [rule.rho * s * s * p.grad / (norm + 1e-12) for s, p in zip(scales, params)]
                    else:
                        norm = torch.norm(torch.stack([p.grad.norm() for p in params]))
                        eps = [rule.rho * p.grad / (norm + 1e-12) for p in params]
                    for p, e in zip(params, eps):
                        p.add_(e)
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                with torch.no_grad():
                    for p, e in zip(params, eps):
                        p.sub_(e)
            if rule.clip_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), rule.clip_grad_norm)
            opt.step()
        if kept is not None:
            kept[i] = copy.deepcopy(opt.state_dict())
        rows.append(layout.flatten(net))
    return torch.stack(rows)


RULES = {
    "sgd": LocalRule(),
    "momentum": LocalRule(momentum=0.9),
    "sam": LocalRule(rho=0.05),
    "asam": LocalRule(rho=0.5, sam="asam", asam_eta=0.2),
    "asam-dp-fedsam": LocalRule(rho=0.5, sam="asam", asam_form="dp-fedsam"),
    "sam+momentum+wd+clip": LocalRule(rho=0.05, momentum=0.9, weight_decay=1e-3, clip_grad_norm=0.5),
    "adam": LocalRule(optimizer="adam"),
    "adam+wd+sam+clip": LocalRule(optimizer="adam", adam_betas=(0.8, 0.99), adam_eps=1e-6, weight_decay=1e-2,
                                  rho=0.05, clip_grad_norm=0.5),
    "adamw+wd": LocalRule(optimizer="adamw", weight_decay=0.05),
    "adamw+asam": LocalRule(optimizer="adamw", weight_decay=1e-2, rho=0.5, sam="asam"),
}


@pytest.mark.parametrize("rule_name", list(RULES))
@pytest.mark.parametrize("work", [{"local_epochs": 2}, {"local_steps": 5}])
def test_vectorized_equals_sequential(rule_name, work, device, slack):
    rule = RULES[rule_name]
    data = make_data().to(device)
    model = make_model().to(device)
    layout = ParamLayout.of(model)
    config = Config(clients=len(SIZES), batch_size=4, seed=3, **work)
    trainer = LocalTrainer(model, layout, data, list(range(len(SIZES))), config)
    X0 = initial_stack(model, len(SIZES), device)
    X0 = X0 + 0.1 * torch.randn(X0.shape, generator=torch.Generator().manual_seed(1)).to(device)  # distinct clients
    result = trainer.train(X0, round_index=2, lr=0.1, rule=rule)
    reference = sequential_reference(model, layout, data, trainer.schedule(2), X0, 0.1, rule)
    torch.testing.assert_close(result.Y, reference, atol=1e-5 * slack, rtol=1e-5 * slack)
    assert not torch.allclose(result.Y, X0)


def test_epochs_mode_masks_finished_clients(device):
    data = make_data().to(device)
    model = make_model().to(device)
    config = Config(clients=4, batch_size=4, local_epochs=3)
    trainer = LocalTrainer(model, ParamLayout.of(model), data, [0, 1, 2, 3], config)
    schedule = trainer.schedule(0)
    # ceil(n_i / B) steps per epoch: (3, 2, 4, 2) × 3 epochs, no padded fake steps
    assert schedule.steps_per_client.tolist() == [9, 6, 12, 6]
    # every epoch visits each of the client's samples exactly once
    B = schedule.batch_size
    for i in range(len(SIZES)):
        epoch = schedule.index[i, : schedule.steps_per_client[i] // 3 * B]
        weight = schedule.weight[i, : schedule.steps_per_client[i] // 3 * B]
        assert sorted(epoch[weight > 0].tolist()) == sorted(data.client_indices[i].tolist())


def test_full_batch_is_deterministic_gradient_descent(device):
    data = make_data().to(device)
    model = make_model().to(device)
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
    data = make_data().to(device)
    model = make_model().to(device)
    layout = ParamLayout.of(model)
    X0 = initial_stack(model, 4, device)
    rule = LocalRule(rho=0.05, momentum=0.5)
    full = LocalTrainer(model, layout, data, [0, 1, 2, 3], Config(clients=4, batch_size=4)).train(X0, 1, 0.1, rule)
    chunked = LocalTrainer(model, layout, data, [0, 1, 2, 3], Config(clients=4, batch_size=4, client_chunk=3))
    torch.testing.assert_close(chunked.train(X0, 1, 0.1, rule).Y, full.Y, atol=1e-6 * slack, rtol=1e-6 * slack)
    # a process hosting only clients 2 and 3 computes the same rows (world-size invariance)
    part = LocalTrainer(model, layout, data, [2, 3], Config(clients=4, batch_size=4)).train(X0[2:], 1, 0.1, rule)
    torch.testing.assert_close(part.Y, full.Y[2:], atol=1e-6 * slack, rtol=1e-6 * slack)


@pytest.mark.parametrize("sam", ["sam", "asam"])
def test_sam_with_rho_zero_is_sgd(device, sam, slack):
    data = make_data().to(device)
    model = make_model().to(device)
    layout = ParamLayout.of(model)
    X0 = initial_stack(model, 4, device)
    trainer = LocalTrainer(model, layout, data, [0, 1, 2, 3], Config(clients=4, batch_size=4))
    result = trainer.train(X0, 0, 0.1, LocalRule(rho=0.0, sam=sam, asam_eta=0.5))
    reference = sequential_reference(model, layout, data, trainer.schedule(0), X0, 0.1, LocalRule())  # plain SGD
    torch.testing.assert_close(result.Y, reference, atol=1e-5 * slack, rtol=1e-5 * slack)


def test_sam_perturbation_uses_joint_norm(device):
    """ε = ρ g/‖g‖ with one norm over all parameters, per client row (docs/reference/update-rules.md#sam-and-asam)."""
    layout = ParamLayout.of(make_model())
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
    layout = ParamLayout.of(make_model())
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
