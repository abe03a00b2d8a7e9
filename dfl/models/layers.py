"""vmap-friendly convolutions that can run as im2col + matmul.

The engine trains many clients at once with `vmap(grad(functional_call(model, params, x)))`, where every
parameter has a leading client dimension. Under vmap a native convolution with per-client weights turns
into a grouped convolution; written as im2col followed by a matmul, the same convolution becomes one
batched matmul (bmm) over clients.

`conv_impl` picks the forward: "unfold" (im2col + matmul), "native" (`F.conv1d` / `F.conv2d`), or
"auto" (the default, = "native"). Measured on the 2-core CPU (torch 2.13): for 2-D convolutions oneDNN's
grouped convolution is 1.3-3.7x faster than any im2col we tried (the k*k-slice im2col copy and its
backward dominate), and inside the engine's vmapped SAM step the 1-D CNN also ran 1.5-1.7x faster
natively. "unfold" stays available (e.g. to compare under `torch.compile` or on other hardware).
All choices compute the same function with the same parameters (cross-correlation, zero padding).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from typing_extensions import override

from dfl.errors import ModelError
from dfl.models.builtin import CONV_IMPLS


def check_conv_impl(conv_impl: str) -> str:
    """`conv_impl` if it is one of CONV_IMPLS, else a ModelError naming the choices."""
    if conv_impl not in CONV_IMPLS:
        raise ModelError(f"conv_impl must be one of {CONV_IMPLS}, got {conv_impl!r}")
    return conv_impl


def _use_native(conv_impl: str, x: torch.Tensor, dims: int) -> bool:
    # "auto" is native: inside the engine's vmapped SAM step (cnn1d, 32 clients, 2 CPU threads) the
    # grouped convolution measured 1.5-1.7x faster than unfold + bmm, whose backward is dominated by
    # zero-fills and adds of the stacked slices.
    return conv_impl in ("native", "auto")


class _ConvNd(nn.Module):
    """Shared parameters and init of the 1-D and 2-D convolutions (PyTorch's default init)."""

    dims = 0

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, bias: bool = True, conv_impl: str = "auto"):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.conv_impl = check_conv_impl(conv_impl)
        shape = (out_channels, in_channels) + (kernel_size,) * self.dims
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        # Same distribution as nn.Conv*d.reset_parameters: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(in_channels * kernel_size**self.dims)
            nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, conv_impl={self.conv_impl!r}")


class Conv1d(_ConvNd):
    """y[b, o, t] = bias[o] + sum_{c, j} w[o, c, j] * x_pad[b, c, t * stride + j]; x: [B, C, L]."""

    dims = 1

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _use_native(self.conv_impl, x, self.dims):
            return F.conv1d(x, self.weight, self.bias, self.stride, self.padding)
        k, s, p = self.kernel_size, self.stride, self.padding
        xt = F.pad(x, (p, p)).transpose(1, 2)  # [B, L, C]
        B, L = xt.shape[0], xt.shape[1]
        T = (L - k) // s + 1
        # im2col as k strided slices stacked last: [B, T, C, k], already contiguous, so the reshape is free.
        # (Tensor.unfold would be a view, but its backward has no vmap batching rule.)
        cols = torch.stack([xt[:, j : j + (T - 1) * s + 1 : s] for j in range(k)], dim=-1)
        y = _matmul_bias(cols.reshape(B * T, -1), self.weight, self.bias)
        return y.view(B, T, self.out_channels).transpose(1, 2)


class Conv2d(_ConvNd):
    """y[b, o, i, j] = bias[o] + sum_{c, u, v} w[o, c, u, v] * x_pad[b, c, i*s + u, j*s + v].

    x: [B, C, H, W] -> y: [B, O, Ho, Wo], contiguous (GroupNorm cannot take a channels-last
    layout under vmap).
    """

    dims = 2

    @override
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _use_native(self.conv_impl, x, self.dims):
            return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)
        k, s, p = self.kernel_size, self.stride, self.padding
        xt = F.pad(x, (p, p, p, p)).permute(0, 2, 3, 1)  # [B, H, W, C]
        B, H, W = xt.shape[:3]
        Ho, Wo = (H - k) // s + 1, (W - k) // s + 1
        cols = torch.stack([xt[:, u : u + (Ho - 1) * s + 1 : s, v : v + (Wo - 1) * s + 1 : s]
                            for u in range(k) for v in range(k)], dim=-1)  # [B, Ho, Wo, C, k*k]
        y = _matmul_bias(cols.reshape(B * Ho * Wo, -1), self.weight, self.bias)
        return y.view(B, Ho, Wo, self.out_channels).permute(0, 3, 1, 2).contiguous()


def _matmul_bias(cols: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Cols @ W^T + b with W flattened to [O, C*k...]; under vmap this is one (bad)dbmm over clients."""
    w = weight.reshape(weight.shape[0], -1).t()
    return cols @ w if bias is None else torch.addmm(bias, cols, w)
