"""Fully connected models: multinomial logistic regression and a ReLU MLP (any input shape, flattened).

Both also run many clients at once (`batched_forward`, see `dfl.training.batched`): a linear layer with every
client's own weights is one batched product over the clients, `torch.baddbmm(b_a, W_a, h_aᵀ)`.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from typing_extensions import override


def batched_linear(params: dict, name: str, h: torch.Tensor) -> torch.Tensor:
    """h_a W_aᵀ + b_a for every client a.

    H [a, B, in], params[name.weight] [a, out, in], params[name.bias] [a, out] -> [a, B, out]. Computed transposed, (W_a
    h_aᵀ + b_a)ᵀ, one baddbmm whose result is [a, out, B] in memory (the next layer's hᵀ as it is, no copy): so the
    weights' gradient, ∂/∂W_a = ∂z_aᵀ h_a, comes out of the backward contiguous like W (bmm's backward would hand back a
    transposed view, and every update would stride over it).
    """
    zt = torch.baddbmm(params[f"{name}.bias"].unsqueeze(2), params[f"{name}.weight"], h.transpose(1, 2))
    return zt.transpose(1, 2)


class LogReg(nn.Module):
    """logits = W vec(x) + b."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)
        self.ndim = len(input_shape)

    @override
    def forward(self, x):
        return self.linear(x.flatten(-self.ndim))

    batched = True  # `batched_forward` computes `forward` of every client

    def batched_forward(self, params: dict, x):
        """Every client's logits: params {name: [a, *shape]}, x [a, B, *input_shape] -> [a, B, classes]."""
        return batched_linear(params, "linear", x.flatten(-self.ndim))


class MLP(nn.Module):
    """logits = W_L relu(... relu(W_1 vec(x) + b_1) ...) + b_L, hidden widths `hidden`."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...]):
        super().__init__()
        widths = (math.prod(input_shape), *hidden)
        layers: list[nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.net = nn.Sequential(*layers)
        self.ndim = len(input_shape)

    @override
    def forward(self, x):
        return self.net(x.flatten(-self.ndim))

    batched = True  # `batched_forward` computes `forward` of every client

    def batched_forward(self, params: dict, x):
        """Every client's logits: params {name: [a, *shape]}, x [a, B, *input_shape] -> [a, B, classes]."""
        h = x.flatten(-self.ndim)
        for i, layer in enumerate(self.net):
            h = batched_linear(params, f"net.{i}", h) if isinstance(layer, nn.Linear) else h.relu()
        return h
