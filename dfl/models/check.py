"""Does a model fit the engine? Checked once, right after the run builds it, before any training.

The engine keeps every client's parameters as one row of an `[m, d]` stack and trains with
`vmap(grad(functional_call(model, params, x)), randomness="different")` over clients; it evaluates with
`vmap(functional_call)` in eval mode. So a model must have
- float32 parameters, all trainable (the engine trains every parameter: a constant belongs in a buffer);
- no per-client state: buffers are shared by all clients as constants and must never change. BatchNorm with
  running statistics is rejected with a message saying why (its statistics would be per-client state that every
  step updates, to be averaged in gossip, checkpointed and restored: not supported) and what to use instead:
  GroupNorm, as the built-in ResNets do, or BatchNorm(track_running_stats=False) (batch statistics always);
- a forward that vmap can transform and that leaves its input alone: no `.item()`/`.tolist()`, no Python
  control flow on tensor values, no in-place writes to its input (evaluation passes views of the test set) or
  to buffers, logits of shape [batch, num_classes], no randomness in eval mode.
  Randomness in train mode (dropout) is fine: every client draws its own (`dfl.training.local`).
`check_model` runs a forward, and a two-client vmapped forward + gradient (train mode) and forward (eval mode) on
two training samples, and turns a failure into one line naming the model, the torch error's key sentence and
the line of the model's code that raised it.
"""

from __future__ import annotations

import traceback

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from dfl.errors import ModelError
from dfl.models.modes import eval_mode

TORCH_DIR = torch.__file__.rsplit("/", 1)[0]
HINT = ("a forward must be vmappable: no .item()/.tolist(), no Python if/while on tensor values, no in-place writes "
        "to its input or buffers (see docs/how-to/own-model.md)")


def _check_parameters(model: nn.Module, spec: str) -> dict[str, nn.Parameter]:
    """The model's parameters, checked: some, all float32 and trainable, and no module with running statistics.

    Running statistics (BatchNorm's) are per-client state that the engine does not hold.
    """
    params = dict(model.named_parameters())
    if not params:
        raise ModelError(f"model {spec!r} has no parameters: there is nothing to train")
    for name, p in params.items():
        if p.dtype != torch.float32:
            raise ModelError(f"model {spec!r}: parameter {name!r} is {p.dtype}; the engine trains float32 "
                             "parameters (build the model in float32, or call .float() in the factory)")
        if not p.requires_grad:
            raise ModelError(f"model {spec!r}: parameter {name!r} has requires_grad=False, but the engine trains "
                             "every parameter; keep a constant as a buffer (register_buffer) instead")
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats:
            where = repr(name) if name else "(the model itself)"
            raise ModelError(
                f"model {spec!r}: {type(module).__name__} {where} keeps running statistics, per-client state "
                "that the engine does not keep (it holds only parameters per client, and shares buffers as "
                "constants); use GroupNorm, or track_running_stats=False (batch statistics in training and "
                "evaluation)"
            )
    return params


def check_model(model: nn.Module, spec: str, num_classes: int, x: torch.Tensor, y: torch.Tensor) -> None:
    """Raise ModelError (one line, naming `spec`) unless `model` trains and evaluates under the engine.

    (x, y) are a few training samples. Leaves the model in train mode and torch's RNG as it found them.
    """
    params = _check_parameters(model, spec)
    x, y = x[:2], y[:2]
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    with torch.random.fork_rng(devices=[x.device] if x.device.type == "cuda" else []):
        x_in = x.clone()
        with torch.no_grad():
            logits = _step(spec, "a forward", lambda: model(x_in))
        if not torch.equal(x_in, x):
            raise ModelError(f"model {spec!r} writes to its input in place (e.g. x.mul_(2), x += 1, x[...] = ...), "
                             "which would change the dataset during evaluation; use out-of-place operations "
                             "(x = x * 2)")
        if not isinstance(logits, torch.Tensor):
            raise ModelError(f"model {spec!r} must return a tensor of logits; its forward returned "
                             f"{type(logits).__name__}")
        if tuple(logits.shape) != (x.shape[0], num_classes):
            raise ModelError(f"model {spec!r} must return logits of shape [batch, num_classes] = "
                             f"[{x.shape[0]}, {num_classes}]; got {list(logits.shape)} for input {list(x.shape)}")
        rows = {k: torch.stack([p.detach(), p.detach()]) for k, p in params.items()}  # two clients

        def loss(p, xb, yb):
            return F.cross_entropy(functional_call(model, p, (xb,)), yb)

        _step(spec, "a vmapped gradient (training)",
              lambda: vmap(grad(loss), randomness="different")(rows, torch.stack([x, x]), torch.stack([y, y])))
        with eval_mode(model):
            _step(spec, "a vmapped forward in eval mode (evaluation)",
                  lambda: vmap(lambda p, xb: functional_call(model, p, (xb,)), in_dims=(0, None))(rows, x.clone()))
    for name, b in model.named_buffers():
        if name not in buffers or b.shape != buffers[name].shape or not torch.equal(b, buffers[name]):
            raise ModelError(f"model {spec!r}: buffer {name!r} changed in a forward pass; buffers are shared by "
                             "all clients as constants, per-client state is not supported")


def _step(spec: str, what: str, call):
    try:
        return call()
    except ModelError:
        raise
    except Exception as exc:
        raise ModelError(f"model {spec!r} fails in {what}{_where(exc)}: {type(exc).__name__}: {_key(exc)}; "
                         f"{HINT}") from exc


def _key(exc: BaseException) -> str:
    """The torch message's first sentence (its first line can run to 500 characters)."""
    line = next((s.strip() for s in str(exc).splitlines() if s.strip()), "")
    if len(line) > 160 and ". " in line[40:]:
        line = line[: line.index(". ", 40)]
    return line.rstrip(".")


def _where(exc: BaseException) -> str:
    """The suffix " at FILE:LINE (`code`)" of the innermost frame outside torch and this module (the model's code)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(TORCH_DIR) and f.filename != __file__]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename}:{f.lineno} (`{(f.line or '').strip()}`)"

