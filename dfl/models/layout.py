"""Where each parameter lives in the flat `[d]` row of a client (`named_parameters()` order, row-major)."""

from __future__ import annotations

from torch import nn


def param_layout(model: nn.Module) -> list[tuple[str, tuple[int, ...], int, int]]:
    """[(name, shape, numel, offset)]: parameter `name` is row[offset : offset + numel].view(shape)."""
    layout, offset = [], 0
    for name, p in model.named_parameters():
        layout.append((name, tuple(p.shape), p.numel(), offset))
        offset += p.numel()
    return layout


def num_params(model: nn.Module) -> int:
    """D = total number of parameters (the width of the client stack)."""
    return sum(p.numel() for p in model.parameters())
