"""Metrics of the client stack: averaged-model accuracy/loss, per-client accuracy, consensus distance.

Models are evaluated in eval mode (`dfl.models.eval_mode`: dropout off), and left in the mode they were in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from dfl.models.modes import eval_mode


@torch.no_grad()
def evaluate_row(model, layout, row: torch.Tensor, x: torch.Tensor, y: torch.Tensor, batch_size: int):
    """(accuracy, mean cross-entropy) of one parameter row on (x, y)."""
    params = layout.views(row)
    correct, loss = 0.0, 0.0
    with eval_mode(model):
        for s in range(0, x.shape[0], batch_size):
            logits = functional_call(model, params, (x[s : s + batch_size],))
            target = y[s : s + batch_size]
            loss += F.cross_entropy(logits, target, reduction="sum").item()
            correct += (logits.argmax(dim=1) == target).sum().item()
    n = max(x.shape[0], 1)
    return correct / n, loss / n


@torch.no_grad()
def client_accuracies(model, layout, X, x, y, batch_size: int, client_chunk: int) -> torch.Tensor:
    """Accuracy of every row of X on the same (x, y): [m] (vmapped over clients, chunked)."""
    forward = vmap(lambda row, xb: functional_call(model, layout.views(row), (xb,)), in_dims=(0, None))
    chunk = client_chunk or X.shape[0]
    correct = torch.zeros(X.shape[0], device=X.device)
    # keep chunk × batch roughly constant so memory does not grow with the number of clients
    batch = max(1, batch_size // max(1, min(chunk, X.shape[0]) // 4 or 1))
    with eval_mode(model):
        for c in range(0, X.shape[0], chunk):
            for s in range(0, x.shape[0], batch):
                logits = forward(X[c : c + chunk], x[s : s + batch])
                correct[c : c + chunk] += (logits.argmax(dim=2) == y[s : s + batch]).sum(dim=1)
    return correct / max(x.shape[0], 1)


ROW_BLOCK_BYTES = 64 * 2**20  # temporaries of the row-wise metrics stay this small whatever m is


def row_blocks(X: torch.Tensor):
    """Slices of X's rows whose [rows, d] temporaries stay under ROW_BLOCK_BYTES."""
    rows = max(1, ROW_BLOCK_BYTES // max(1, X.shape[1] * X.element_size()))
    for s in range(0, X.shape[0], rows):
        yield slice(s, s + rows)


def consensus_distance(X: torch.Tensor, comm) -> float:
    """(1/m) Σ_i ‖x_i − x̄‖² over all clients of all processes (summed block by block in float64)."""
    mean = comm.mean_rows(X)
    local = torch.zeros(1, dtype=torch.float64, device=X.device)
    for rows in row_blocks(X):
        local += ((X[rows] - mean) ** 2).sum(dtype=torch.float64)
    return float(comm.sum(local)) / comm.num_clients


def nonfinite_rows(X: torch.Tensor) -> torch.Tensor:
    """[m] bool: rows of X with a NaN or inf (block by block: no [m, d] bool temporary)."""
    out = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
    for rows in row_blocks(X):
        out[rows] = ~torch.isfinite(X[rows]).all(dim=1)
    return out
