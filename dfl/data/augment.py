"""On-device CIFAR augmentation: random crop with zero padding 4 + random horizontal flip, per sample.

For a sample with shift (dy, dx) in {0..2p}^2 and flip f, the output pixel at (h, w) is
    out[c, h, w] = pad(x)[c, dy + h, dx + w'],   w' = W - 1 - w if f else w,
where pad(x) is x zero-padded by p on every side (crop, then flip). Since inputs are normalized, zero is
the channel mean. Everything is a gather on x's device: no Python loop over samples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dfl.errors import DataError

PADDING = 4


def crop_flip(x: torch.Tensor, shifts: torch.Tensor, flips: torch.Tensor, padding: int = PADDING) -> torch.Tensor:
    """Crop-and-flip x [..., C, H, W] with explicit per-sample shifts [..., 2] (dy, dx) and flips [...] (bool)."""
    if x.dim() < 3:
        raise DataError(f"x must have shape [..., C, H, W], got {list(x.shape)}")
    lead, (C, H, W) = x.shape[:-3], x.shape[-3:]
    if shifts.shape != (*lead, 2) or flips.shape != lead:
        raise DataError(f"shifts must be {[*lead, 2]} and flips {list(lead)}, got {list(shifts.shape)} and "
                        f"{list(flips.shape)}")
    flat = x.reshape(-1, C, H, W)
    n = flat.shape[0]
    shifts = shifts.reshape(n, 2).to(x.device)
    flips = flips.reshape(n).to(x.device).bool()
    padded = F.pad(flat, (padding,) * 4)  # [n, C, H + 2p, W + 2p]
    ar_h = torch.arange(H, device=x.device)
    ar_w = torch.arange(W, device=x.device)
    rows = shifts[:, :1] + ar_h  # [n, H]
    cols = shifts[:, 1:] + torch.where(flips[:, None], W - 1 - ar_w, ar_w)  # [n, W]
    out = padded.gather(2, rows[:, None, :, None].expand(n, C, H, W + 2 * padding))
    out = out.gather(3, cols[:, None, None, :].expand(n, C, H, W))
    return out.reshape(x.shape)


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int = PADDING) -> torch.Tensor:
    """Random crop (zero padding `padding`) + horizontal flip (p = 1/2) of every sample of x [..., C, H, W].

    Shifts and flips are drawn from `generator` on its own device (so a CPU generator gives the same
    augmentation for a CUDA x) and applied on x's device.
    """
    if x.dim() < 3:
        raise DataError(f"x must have shape [..., C, H, W], got {list(x.shape)}")
    lead = x.shape[:-3]
    dev = generator.device
    shifts = torch.randint(0, 2 * padding + 1, (*lead, 2), generator=generator, device=dev)
    flips = torch.randint(0, 2, lead, generator=generator, device=dev).bool()
    return crop_flip(x, shifts, flips, padding)
