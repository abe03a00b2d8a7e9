"""Fully connected models: multinomial logistic regression and a ReLU MLP (any input shape, flattened)."""

from __future__ import annotations

import math

from torch import nn


class LogReg(nn.Module):
    """logits = W vec(x) + b."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int):
        super().__init__()
        self.linear = nn.Linear(math.prod(input_shape), num_classes)
        self.ndim = len(input_shape)

    def forward(self, x):
        return self.linear(x.flatten(-self.ndim))


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

    def forward(self, x):
        return self.net(x.flatten(-self.ndim))
