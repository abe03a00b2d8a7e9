"""Per-client gradients from a model's batched forward: the clients as a batch dimension, one backward, no vmap.

A built-in model may run every client's forward at once: `model.batched_forward(params, x)` takes
params {name: [a, *shape]} (client a's parameters in row a) and x [a, B, *input_shape] and returns the logits
[a, B, classes], computing for every client what `forward` computes (its flag `model.batched` says whether it
does under the model's options). The clients' losses f_a(θ_a) then depend on their own parameters only, so one
backward pass of their sum gives every client's gradient at once:

    ∂(Σ_c f_c(θ_c)) / ∂θ_a = ∂f_a(θ_a) / ∂θ_a,

the gradient `vmap(grad(f))` computes client by client, from the same products (a linear layer's per-client
matmuls become one bmm, a convolution's one grouped convolution, as under vmap) without vmap's per-op batching
rules and layout moves (`benchmarks/round_profile.py`: mlp × 100, 13% of a round). A model of one's own, or a
subclass that overrides `forward`, keeps the vmapped gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def batched_forward_of(model) -> Callable | None:
    """The model's batched forward, or None when its gradients must come from vmap.

    Args:
        model: a template model.

    Returns:
        `model.batched_forward` when the class that defines the model's `forward` defines it too and the model says it
        computes `forward` (`model.batched`); else None.
    """
    for cls in type(model).__mro__:
        if "forward" in vars(cls):
            if "batched_forward" in vars(cls) and getattr(model, "batched", False):
                return model.batched_forward
            return None
    return None


def batched_grad_and_value(forward: Callable, layout, device_type: str, bf16: bool):
    """Every client's minibatch gradient and loss from one backward of the clients' summed losses.

    The returned grad_fn(params, x, y, w) -> (grads, losses) has the contract of `vmap(grad_and_value(loss))` in
    `dfl.training.local.LocalTrainer` (params: one [a, *shape] tensor per parameter; x [a, B, ...], y and w [a, B]):

        f_a = Σ_b w_ab ℓ(logits_ab, y_ab) / Σ_b w_ab   (ℓ: cross-entropy);   grads = ∂(Σ_a f_a)/∂θ_a.

    Args:
        forward: the model's `batched_forward` (params {name: [a, *shape]}, x [a, B, ...]) -> logits [a, B, C].
        layout: the `ParamLayout` naming the per-parameter tensors.
        device_type: the device type autocast runs on.
        bf16: whether the forward runs under bf16 autocast (the loss stays fp32).

    Returns:
        grad_fn: (params, x, y, w) -> (a tuple of [a, *shape] gradients, the [a] losses).
    """

    def grad_and_value(params, x, y, w):
        leaves = [p.detach().requires_grad_() for p in params]
        with torch.enable_grad():
            with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
                logits = forward(layout.named(leaves), x)
            # cross-entropy as log_softmax + gather over the class dim, in fp32, as the vmapped loss
            losses = -torch.log_softmax(logits.float(), dim=2).gather(2, y.unsqueeze(2)).squeeze(2)
            loss = (losses * w).sum(1) / w.sum(1)
            grads = torch.autograd.grad(loss.sum(), leaves)
        return grads, loss.detach()

    return grad_and_value
