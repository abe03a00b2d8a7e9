"""PyTorch's process-wide kernel settings: TF32 for fp32 matmuls and convolutions, and cuDNN's algorithm choice.

They decide a run's numbers; dfl sets them for a run (or for one gossip product) and puts them back afterwards.

Two APIs hold the TF32 state. The legacy one: `torch.set_float32_matmul_precision` ("highest", "high", "medium")
and `torch.backends.cudnn.allow_tf32`. The per-backend one (torch 2.7+; "ieee" from 2.9):
`torch.backends.cuda.matmul.fp32_precision`, `torch.backends.cudnn.conv.fp32_precision`, `...cudnn.rnn...`,
`torch.backends.mkldnn.matmul.fp32_precision`. torch keeps both and checks that they agree: on 2.9–2.11 at every
cuBLAS call (and whenever inductor reads `allow_tf32`), on 2.13 when the legacy getters are read
("... you have used mix of the legacy and new APIs ..."). Setting only the per-backend value (what dfl did) leaves
them apart: `precision = "tf32"` on a fresh process, or a user's `torch.set_float32_matmul_precision("high")`
followed by gossip's IEEE products.

So every change here goes through the legacy setter first — on torch with both APIs it sets the per-backend values
too — and then pins the per-backend value where torch has the attribute (so that a generic
`torch.backends.fp32_precision` cannot override it): the two always agree. What the caller had is read before and
written back, legacy first, then per-backend; a caller's state that was already a mix (its legacy getter raises)
comes back as its per-backend values. Feature-detected (`hasattr`), not by version string.

cuDNN's algorithm choice (`Config.kernels`): "deterministic" sets `cudnn.deterministic = True` and
`cudnn.benchmark = False` (the same algorithms every run, so two runs agree bit for bit); "fast" sets
`cudnn.benchmark = True` (autotuned per shape; may pick non-deterministic backward algorithms, so runs differ in
the last bits from run to run and with the client chunk, hence the world size).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _matmul_backends() -> list[Any]:
    """The per-backend matmul settings objects this torch has (cuBLAS, oneDNN)."""
    backends = [torch.backends.cuda.matmul]
    mkldnn = getattr(torch.backends, "mkldnn", None)
    if mkldnn is not None and hasattr(mkldnn, "matmul"):
        backends.append(mkldnn.matmul)
    return [b for b in backends if _has_new_api(b)]


def _cudnn_ops() -> list[Any]:
    """The per-operator cuDNN settings objects (conv, rnn) where torch has the per-backend API."""
    cudnn = torch.backends.cudnn
    return [op for op in (getattr(cudnn, "conv", None), getattr(cudnn, "rnn", None)) if op is not None and
            _has_new_api(op)]


def _has_new_api(obj) -> bool:
    try:
        return isinstance(obj.fp32_precision, str)
    except (AttributeError, RuntimeError):
        return False


def _pin(obj, tf32: bool) -> None:
    """The per-backend value that agrees with the legacy one just set: "tf32", or "ieee" where torch spells it so.

    A torch whose per-backend API predates "ieee" refuses it: the value the legacy setter wrote stands.
    """
    try:
        obj.fp32_precision = "tf32" if tf32 else "ieee"
    except RuntimeError:
        pass


def _read(getter: Callable[[], Any]) -> Any:
    """A legacy getter's value, or None where it raises because the state is already a mix."""
    try:
        return getter()
    except RuntimeError:
        return None


def snapshot() -> dict[str, Any]:
    """Every setting `apply` may change, as the caller has it (None: a legacy value unreadable, a mix)."""
    cudnn = torch.backends.cudnn
    return {
        "matmul": _read(torch.get_float32_matmul_precision),
        "matmul_backends": [(b, b.fp32_precision) for b in _matmul_backends()],
        "cudnn_tf32": _read(lambda: cudnn.allow_tf32),
        "cudnn_ops": [(op, op.fp32_precision) for op in _cudnn_ops()],
        "deterministic": cudnn.deterministic,
        "benchmark": cudnn.benchmark,
    }


def restore(saved: dict[str, Any]) -> None:
    """Put back what `snapshot` read: the legacy values first (they also set the per-backend ones), then those."""
    cudnn = torch.backends.cudnn
    if saved["matmul"] is not None:
        torch.set_float32_matmul_precision(saved["matmul"])
    for backend, value in saved["matmul_backends"]:
        backend.fp32_precision = value
    if saved["cudnn_tf32"] is not None:
        cudnn.allow_tf32 = saved["cudnn_tf32"]
    for op, value in saved["cudnn_ops"]:
        op.fp32_precision = value
    cudnn.deterministic, cudnn.benchmark = saved["deterministic"], saved["benchmark"]


def set_matmul_tf32(tf32: bool) -> None:
    """TF32 (True) or IEEE fp32 (False) for CUDA fp32 matmuls, legacy and per-backend APIs in agreement."""
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    _pin(torch.backends.cuda.matmul, tf32)


def set_conv_tf32(tf32: bool) -> None:
    """TF32 (True) or IEEE fp32 (False) for cuDNN's fp32 convolutions (and RNNs), both APIs in agreement."""
    torch.backends.cudnn.allow_tf32 = tf32
    for op in _cudnn_ops():
        _pin(op, tf32)


def apply(precision: str, kernels: str) -> None:
    """A run's settings: TF32 matmuls and convolutions only with `precision = "tf32"`; cuDNN per `kernels`.

    fp32 and bf16 runs compute fp32 products in IEEE fp32 (bf16 autocast's products are bf16 whatever this says).
    """
    tf32 = precision == "tf32"
    set_matmul_tf32(tf32)
    set_conv_tf32(tf32)
    deterministic = kernels == "deterministic"
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic


@contextmanager
def run_settings(precision: str, kernels: str) -> Iterator[None]:
    """`apply(precision, kernels)` while inside; the caller's settings put back on the way out, whatever happens."""
    saved = snapshot()
    try:
        apply(precision, kernels)
        yield
    finally:
        restore(saved)


@contextmanager
def ieee_matmuls() -> Iterator[None]:
    """CUDA fp32 matmuls in IEEE fp32 while inside (both APIs in agreement); the caller's setting put back after."""
    saved = snapshot()
    try:
        set_matmul_tf32(False)
        yield
    finally:
        restore(saved)
