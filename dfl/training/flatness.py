"""Flatness of the averaged model: the top Hessian eigenvalue and a 2-D loss landscape.

DFedSAM (Shi et al., 2023, "Measuring on the flatness of loss landscape") and FedSAM (Qu et al., 2022)
report the largest eigenvalue of the training-loss Hessian of the averaged model: the smaller it is,
the flatter the minimum. We compute it matrix-free by power iteration on Hessian-vector products,
    H v = ∂/∂t ∇f(x + t v) |_{t=0}       (forward-over-reverse: `jvp` of `grad`),
and plot f around x along two filter-normalised random directions (Li et al., NeurIPS 2018). Both evaluate the
model in eval mode (`dfl.models.eval_mode`: dropout off), so f is a deterministic function of the parameters.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, jvp, vmap

from dfl.errors import ConfigError
from dfl.models.modes import eval_mode


def top_eigenvalue(
    hvp: Callable[[torch.Tensor], torch.Tensor], dim: int, iters: int = 20, tol: float = 1e-4, seed: int = 0,
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
) -> float:
    """The eigenvalue of largest magnitude of the symmetric operator v ↦ hvp(v), by power iteration.

    v₀ ~ N(0, I) from `seed`; v_{k+1} = H v_k / ‖H v_k‖; the estimate is the Rayleigh quotient v_kᵀ H v_k
    (signed: a negative value means the most curved direction is one of negative curvature). Stops after
    `iters` products or when two estimates agree to `tol` relative.
    """
    generator = torch.Generator().manual_seed(seed)
    v = torch.randn(dim, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
    v = v / v.norm()
    estimate, new = None, float("nan")  # nan: no product taken (iters = 0)
    for _ in range(iters):
        Hv = hvp(v)
        new = float(torch.dot(v.double().flatten(), Hv.double().flatten()))
        norm = Hv.norm()
        if norm == 0:
            return 0.0
        v = Hv / norm
        if estimate is not None and abs(new - estimate) <= tol * max(abs(new), 1e-12):
            return new
        estimate = new
    return new


def loss_hvp(loss_fn: Callable[[torch.Tensor], torch.Tensor], params: torch.Tensor):
    """The Hessian-vector product v ↦ ∇²f(params) v of a scalar function f of a flat parameter vector."""
    gradient = grad(loss_fn)
    return lambda v: jvp(gradient, (params,), (v,))[1]


def model_hvp(model, layout, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024):
    """The Hessian-vector product v ↦ H v of the mean cross-entropy at θ.

    v ↦ H v for f(θ) = mean cross-entropy of the model at θ on (x, y), summed over chunks of `batch_size` (H = Σ_c
    (n_c / n) H_c, so chunking changes memory, not the result).
    """
    n = x.shape[0]

    def chunk_loss(xc, yc):
        # split, not views: the backward of a split is one cat, of each slice view a zero-filled [d] tensor
        return lambda row: F.cross_entropy(functional_call(model, layout.named(layout.split(row)), (xc,)), yc,
                                           reduction="sum") / n

    chunks = [(x[s : s + batch_size], y[s : s + batch_size]) for s in range(0, n, batch_size)]

    def hvp(v):
        with eval_mode(model):
            return sum(loss_hvp(chunk_loss(xc, yc), params)(v) for xc, yc in chunks)

    return hvp


def hessian_top_eigenvalue(model, layout, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                           iters: int = 20, tol: float = 1e-4, batch_size: int = 1024, seed: int = 0) -> float:
    """λ_max(∇²f(params)) of the mean cross-entropy on (x, y).

    `iters` HVPs, each ≈ 2 forward+backward passes over the samples.
    """
    hvp = model_hvp(model, layout, params.detach(), x, y, batch_size)
    with warnings.catch_warnings():  # torch's forward-mode decompositions still call torch.jit.script
        warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated")
        return top_eigenvalue(hvp, params.numel(), iters, tol, seed, params.device, params.dtype)


# ------------------------------------------------------------------------------------ loss landscape
def filter_normalized_direction(layout, params: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """A random direction d ~ N(0, I), rescaled filter by filter.

    For each weight tensor with ≥ 2 dims, every filter (slice along dim 0) gets ‖d_f‖ = ‖θ_f‖. One-dimensional
    parameters (biases, GroupNorm scales and shifts) get d = 0, as Li et al. do for biases and BatchNorm.
    """
    d = torch.randn(params.shape, generator=generator, dtype=torch.float64).to(params)
    out = torch.zeros_like(params)
    for view_d, view_p, view_o in zip(layout.views(d).values(), layout.views(params).values(),
                                      layout.views(out).values()):
        if view_d.dim() < 2:
            continue
        flat_d = view_d.reshape(view_d.shape[0], -1)
        flat_p = view_p.reshape(view_p.shape[0], -1)
        scale = flat_p.norm(dim=1, keepdim=True) / (flat_d.norm(dim=1, keepdim=True) + 1e-12)
        view_o.copy_((flat_d * scale).reshape(view_d.shape))
    return out


@torch.no_grad()
def grid_losses(model, layout, rows: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                batch_size: int = 1024, chunk: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean cross-entropy [P], accuracy [P]) of every parameter row on (x, y), vmapped over `chunk` rows."""
    forward = vmap(lambda row, xb: functional_call(model, layout.views(row), (xb,)), in_dims=(0, None))
    chunk = max(1, min(chunk, rows.shape[0]))
    # as in dfl.training.evaluate.client_accuracies: keep rows × samples per call near 4 × batch_size, so memory does
    # not grow with the chunk (on CPU the smaller blocks were also no slower, often faster, for a cnn1d grid)
    batch = max(1, batch_size // max(1, chunk // 4))
    loss = torch.zeros(rows.shape[0], dtype=torch.float64, device=rows.device)
    correct = torch.zeros(rows.shape[0], dtype=torch.float64, device=rows.device)
    with eval_mode(model):
        for c in range(0, rows.shape[0], chunk):
            for s in range(0, x.shape[0], batch):
                logits = forward(rows[c : c + chunk], x[s : s + batch])  # [p, b, classes]
                target = y[s : s + batch]
                ce = F.cross_entropy(logits.flatten(0, 1), target.repeat(logits.shape[0]), reduction="none")
                loss[c : c + chunk] += ce.view(logits.shape[0], -1).sum(dim=1).double()
                correct[c : c + chunk] += (logits.argmax(dim=2) == target).sum(dim=1).double()
    n = max(x.shape[0], 1)
    return loss / n, correct / n


@torch.no_grad()
def loss_landscape(model, layout, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, span: float = 1.0,
                   points: int = 21, seed: int = 0, batch_size: int = 1024, chunk: int = 32) -> dict:
    """The loss and accuracy on a 2-D slice around θ along two filter-normalised directions.

    f(θ + a·d₁ + b·d₂) on the grid a, b ∈ linspace(−span, span, points), with d₁, d₂ filter-normalised random
    directions (`filter_normalized_direction`) drawn from `seed`; f is the mean cross-entropy on (x, y). Returns the
    axes, the loss and accuracy grids ([points, points], indexed [a, b]) and the centre's loss and accuracy (an odd
    `points` puts θ itself on the grid). `chunk` grid points are evaluated per vmapped call.
    """
    if isinstance(points, bool) or not isinstance(points, int) or points < 3:
        raise ConfigError(f"points must be an int >= 3, got {points!r}")
    if not span > 0:
        raise ConfigError(f"span must be > 0, got {span}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f"chunk must be an int >= 1, got {chunk!r}")
    generator = torch.Generator().manual_seed(seed)
    d1 = filter_normalized_direction(layout, params, generator)
    d2 = filter_normalized_direction(layout, params, generator)
    axis = torch.linspace(-span, span, points, dtype=params.dtype, device=params.device)
    a, b = (t.reshape(-1, 1) for t in torch.meshgrid(axis, axis, indexing="ij"))
    loss = torch.empty(points * points, dtype=torch.float64, device=params.device)
    acc = torch.empty_like(loss)
    for c in range(0, points * points, chunk):  # rows built per chunk: points² × dim floats would not fit for VGG
        rows = params + a[c : c + chunk] * d1 + b[c : c + chunk] * d2
        loss[c : c + chunk], acc[c : c + chunk] = grid_losses(model, layout, rows, x, y, batch_size, chunk)
    centre_loss, centre_acc = grid_losses(model, layout, params.unsqueeze(0), x, y, batch_size, 1)
    return {
        "alphas": axis.tolist(),
        "betas": axis.tolist(),
        "loss": loss.view(points, points).tolist(),
        "accuracy": acc.view(points, points).tolist(),
        "centre_loss": float(centre_loss[0]),
        "centre_accuracy": float(centre_acc[0]),
    }
