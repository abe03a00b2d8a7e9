"""CIFAR ResNets with GroupNorm instead of BatchNorm (no running statistics to keep per client).

- `resnet18`: He et al.'s ResNet-18 in its CIFAR form (3x3 stride-1 stem, no stem max-pool), basic blocks
  [2, 2, 2, 2] with 64/128/256/512 channels, global average pool, FC; 11.2M parameters.
- `resnet20`: the 3-stage CIFAR ResNet of He et al. Sec. 4.2, 3 basic blocks per stage, 16/32/64 channels,
  global average pool, FC; 0.27M parameters.
Shortcuts that change shape are 1x1 stride-s convolutions + GroupNorm ("option B"). Every GroupNorm has
`groups` groups (default 2, as in the GN ResNets of Hsieh et al. and Caldarola et al.'s FedSAM).
"""

from __future__ import annotations

from torch import nn
from typing_extensions import override

from dfl.models.layers import Conv2d


class BasicBlock(nn.Module):
    """out = relu(GN(conv(relu(GN(conv(x))))) + shortcut(x))."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int, conv_impl: str):
        super().__init__()
        self.conv1 = Conv2d(cin, cout, 3, stride, 1, bias=False, conv_impl=conv_impl)
        self.gn1 = nn.GroupNorm(groups, cout)
        self.conv2 = Conv2d(cout, cout, 3, 1, 1, bias=False, conv_impl=conv_impl)
        self.gn2 = nn.GroupNorm(groups, cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(Conv2d(cin, cout, 1, stride, bias=False, conv_impl=conv_impl),
                                          nn.GroupNorm(groups, cout))

    @override
    def forward(self, x):
        out = self.gn1(self.conv1(x)).relu()
        out = self.gn2(self.conv2(out))
        return (out + self.shortcut(x)).relu()


class ResNet(nn.Module):
    """A CIFAR ResNet of basic blocks with GroupNorm: a 3×3 stem, one stage per width, average pool, FC."""
    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, ...],
                 blocks: tuple[int, ...], groups: int, conv_impl: str):
        super().__init__()
        self.conv1 = Conv2d(in_channels, widths[0], 3, 1, 1, bias=False, conv_impl=conv_impl)
        self.gn1 = nn.GroupNorm(groups, widths[0])
        stages, cin = [], widths[0]
        for i, (cout, n) in enumerate(zip(widths, blocks)):
            for j in range(n):
                stride = 2 if i > 0 and j == 0 else 1
                stages.append(BasicBlock(cin, cout, stride, groups, conv_impl))
                cin = cout
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    @override
    def forward(self, x):
        x = self.layers(self.gn1(self.conv1(x)).relu())
        return self.fc(x.mean(dim=(-2, -1)))


def resnet18(in_channels: int, num_classes: int, groups: int, conv_impl: str) -> ResNet:
    """ResNet-18: stages of 64/128/256/512 channels, [2, 2, 2, 2] basic blocks."""
    return ResNet(in_channels, num_classes, (64, 128, 256, 512), (2, 2, 2, 2), groups, conv_impl)


def resnet20(in_channels: int, num_classes: int, groups: int, conv_impl: str) -> ResNet:
    """ResNet-20: stages of 16/32/64 channels, 3 basic blocks each."""
    return ResNet(in_channels, num_classes, (16, 32, 64), (3, 3, 3), groups, conv_impl)
