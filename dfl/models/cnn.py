"""Small convolutional networks: the MNIST-1D CNN and the two-conv image CNNs of the FL literature.

- `CNN1d` (docs/how-to/models.md): conv 1->32 k5, conv 32->32 k3 ("same" padding, ReLU), linear 32*L -> classes;
  on MNIST-1D (L = 40) that is linear 1280 -> 10, 16,106 parameters. It also runs many clients at once
  (`CNN1d.batched_forward`, see `dfl.training.batched`).
- `CNN`, variant "mcmahan" (McMahan et al. 2017, the FedAvg CNN used on (E)MNIST): conv5x5 32 "same",
  maxpool 2, conv5x5 64 "same", maxpool 2, FC 512, FC classes; 1,663,370 parameters on 28x28x1, 10 classes.
- `CNN`, variant "cifar" (the CIFAR CNN of Caldarola et al.'s FedSAM and FedGLoSS, a LeNet-5 style
  net): conv5x5 64 (valid), maxpool 2, conv5x5 64 (valid), maxpool 2, FC 384, FC 192, FC classes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from typing_extensions import override

from dfl.models.layers import Conv1d, Conv2d


class CNN1d(nn.Module):
    """The MNIST-1D CNN: conv C→32 k5, conv 32→32 k3 ("same" padding, ReLU), linear 32·L → classes."""
    def __init__(self, channels: int, length: int, num_classes: int, conv_impl: str):
        super().__init__()
        self.channels = channels
        self.conv1 = Conv1d(channels, 32, 5, padding=2, conv_impl=conv_impl)
        self.conv2 = Conv1d(32, 32, 3, padding=1, conv_impl=conv_impl)
        self.fc = nn.Linear(32 * length, num_classes)

    @override
    def forward(self, x):
        if x.dim() == 2:  # [B, L] signals without a channel axis
            x = x.unsqueeze(1)
        x = self.conv2(self.conv1(x).relu()).relu()
        return self.fc(x.flatten(1))

    @property
    def batched(self) -> bool:
        """Whether `batched_forward` computes `forward` of every client.

        With native convolutions (its grouped convolutions are theirs), not with conv_impl = "unfold".
        """
        return self.conv1.conv_impl != "unfold"

    def batched_forward(self, params: dict, x):
        """Every client's logits: params {name: [a, *shape]}, x [a, B, L] or [a, B, C, L] -> [a, B, classes].

        The a clients' convolutions are one grouped convolution (groups = a; client a's channels a·C … a·C + C − 1)
        on the signals as a channels-last (NHWC) image [B, a·C, 1, L], whose activations stay channels-last from
        the input to the head: oneDNN's grouped convolution is 1.3-1.5x faster there than in the NCW layout vmap
        uses (`benchmarks/conv_layouts.py`), and no layout conversion sits between the layers (in the backward
        pass either: the head's gradient arrives channels-last, as the ReLUs' outputs are). The head reads the
        activations as [a, B, L·O] (o innermost) against fc's weights permuted to that order, one baddbmm.
        """
        a, b = x.shape[:2]
        c, length = self.channels, x.shape[-1]
        h = x.reshape(a, b, c, length).permute(1, 3, 0, 2).contiguous().view(b, 1, length, a * c).permute(0, 3, 1, 2)
        for conv, name in ((self.conv1, "conv1"), (self.conv2, "conv2")):
            w = params[f"{name}.weight"]
            h = F.conv2d(h, w.reshape(-1, w.shape[2], 1, w.shape[3]), params[f"{name}.bias"].reshape(-1),
                         (1, conv.stride), (0, conv.padding), 1, a)
            # in place: a convolution's backward reads its input, not its output
            h = h.relu_() if name == "conv1" else _ClientMajorReLU.apply(h, a)
        o = h.shape[3]
        h = h.view(a, b, length * o)
        w = params["fc.weight"]
        w = w.view(a, -1, o, length).transpose(2, 3).reshape(a, -1, length * o)
        return torch.baddbmm(params["fc.bias"].unsqueeze(1), h, w.transpose(1, 2))


class _ClientMajorReLU(torch.autograd.Function):
    # relu of the last convolution's channels-last output h [B, a·O, 1, L], written client-major as [a, B, L, O] (the
    # head's baddbmm layout) in one pass; the backward writes the masked gradient back channels-last in one pass.
    # Separately (relu, then the layout copy; in the backward the copy back, then relu's mask) that is two passes
    # over the largest activation each way. The values are relu's and its gradient's exactly (clamp_min, and
    # threshold_backward on the output, as autograd's relu).

    @staticmethod
    def forward(ctx, h, a):
        b, channels, _, length = h.shape
        src = h.permute(0, 2, 3, 1).reshape(b, length, a, channels // a).permute(2, 0, 1, 3)
        out = torch.empty(src.shape, dtype=h.dtype, device=h.device)
        torch.clamp_min(src, 0, out=out)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        a, b, length, o = out.shape
        grad_h = torch.empty((b, a * o, 1, length), dtype=grad.dtype, device=grad.device,
                             memory_format=torch.channels_last)
        dst = grad_h.permute(0, 2, 3, 1).view(b, length, a, o).permute(2, 0, 1, 3)
        torch.ops.aten.threshold_backward.grad_input(grad.reshape(out.shape), out, 0, grad_input=dst)
        return grad_h, None


class CNN(nn.Module):
    """The two-convolution image CNN of McMahan et al. (variant "mcmahan") or of the CIFAR papers ("cifar")."""
    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, variant: str, conv_impl: str):
        super().__init__()
        c, h, w = input_shape
        if variant == "mcmahan":
            self.conv1 = Conv2d(c, 32, 5, padding=2, conv_impl=conv_impl)
            self.conv2 = Conv2d(32, 64, 5, padding=2, conv_impl=conv_impl)
            h, w = h // 2 // 2, w // 2 // 2
            hidden: tuple[int, ...] = (512,)
        else:
            self.conv1 = Conv2d(c, 64, 5, conv_impl=conv_impl)
            self.conv2 = Conv2d(64, 64, 5, conv_impl=conv_impl)
            h, w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
            hidden = (384, 192)
        self.pool = nn.MaxPool2d(2)
        widths = (self.conv2.out_channels * h * w, *hidden)
        layers: list[nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.head = nn.Sequential(*layers)

    @override
    def forward(self, x):
        x = self.pool(self.conv1(x).relu())
        x = self.pool(self.conv2(x).relu())
        return self.head(x.flatten(1))
