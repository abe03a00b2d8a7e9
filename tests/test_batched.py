"""The built-in models' batched forward (`dfl.training.batched`): the same gradients and local training as vmap."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, grad_and_value, vmap

from dfl.config import Config
from dfl.data import FederatedData
from dfl.models import build_model
from dfl.models.simple import MLP
from dfl.training.batched import batched_forward_of, batched_grad_and_value
from dfl.training.clients import ParamLayout, initial_stack
from dfl.training.local import LocalTrainer
from tests.helpers import LOCAL_RULES, sequential_reference

CASES = [("logreg", (6,), {}), ("mlp", (6,), {"hidden": (5, 4)}), ("cnn1d", (12,), {}), ("cnn1d", (2, 12), {})]


def vmapped(model, layout):
    def loss(params, x, y, w):
        logits = functional_call(model, layout.named(params), (x,))
        losses = -torch.log_softmax(logits, dim=1).gather(1, y.unsqueeze(1)).squeeze(1)
        return (losses * w).sum() / w.sum()

    return vmap(grad_and_value(loss))


@pytest.mark.parametrize("name,shape,options", CASES)
def test_batched_gradients_equal_vmapped_ones(name, shape, options):
    torch.manual_seed(0)
    model = build_model(name, shape, 3, **options)
    layout = ParamLayout.of(model)
    a, b = 5, 4
    X = layout.flatten(model) + 0.1 * torch.randn(a, layout.dim)
    x, y = torch.randn(a, b, *shape), torch.randint(0, 3, (a, b))
    w = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])
    g, loss = batched_grad_and_value(batched_forward_of(model), layout, "cpu", False)(layout.split(X), x, y, w)
    g_ref, loss_ref = vmapped(model, layout)(layout.split(X), x, y, w)
    # logreg runs the same product (bitwise); mlp's transposed products and cnn1d's channels-last convolutions
    # sum in another order
    exact = name == "logreg"
    tol = {"atol": 0.0, "rtol": 0.0} if exact else {"atol": 1e-6, "rtol": 1e-5}
    torch.testing.assert_close(loss, loss_ref, **tol)
    torch.testing.assert_close(layout.join(g), layout.join(g_ref), **tol)


def test_models_without_a_batched_forward_keep_vmap():
    class Wider(MLP):  # overrides forward only: its batched_forward would not compute it
        def forward(self, x):
            return 2 * super().forward(x)

    assert batched_forward_of(build_model("mlp", (6,), 3)) is not None
    assert batched_forward_of(Wider((6,), 3, (4,))) is None
    assert batched_forward_of(build_model("cnn1d", (12,), 3, conv_impl="unfold")) is None
    assert batched_forward_of(torch.nn.Linear(6, 3)) is None


@pytest.mark.parametrize("rule_name", ["sgd", "sam+momentum+wd+clip", "adam", "asam"])
@pytest.mark.parametrize("name,shape,options", CASES[1:3])
def test_batched_local_training_equals_sequential(rule_name, name, shape, options):
    g = torch.Generator().manual_seed(0)
    sizes = (10, 7, 13, 5)
    train = [(torch.randn(n, *shape, generator=g), torch.randint(0, 3, (n,), generator=g)) for n in sizes]
    data = FederatedData.from_arrays(train=train, test=train[0], num_classes=3)
    torch.manual_seed(0)
    model = build_model(name, shape, 3, **options)
    layout = ParamLayout.of(model)
    trainer = LocalTrainer(model, layout, data, list(range(len(sizes))), Config(clients=4, batch_size=4, seed=3))
    assert trainer.batched
    X0 = initial_stack(model, len(sizes), torch.device("cpu"))
    X0 = X0 + 0.1 * torch.randn(X0.shape, generator=torch.Generator().manual_seed(1))
    result = trainer.train(X0, round_index=2, lr=0.1, rule=LOCAL_RULES[rule_name])
    reference = sequential_reference(model, layout, data, trainer.schedule(2), X0, 0.1, LOCAL_RULES[rule_name])
    torch.testing.assert_close(result.Y, reference, atol=1e-5, rtol=1e-5)
