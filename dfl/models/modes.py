"""`eval_mode(model)`: evaluation runs in eval mode (dropout off), training in train mode."""

from __future__ import annotations

import contextlib

from torch import nn


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """model.eval() inside the block; every submodule's own mode restored after (a model may mix modes)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training
