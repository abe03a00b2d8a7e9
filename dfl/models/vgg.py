"""VGG-11 for CIFAR without BatchNorm or dropout.

Features: conv3x3 (padding 1) + ReLU with widths 64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M
(M = maxpool 2), i.e. Simonyan & Zisserman's configuration "A". On 32x32 inputs the features are
512x1x1; larger inputs are averaged over the remaining positions. Classifier: FC 512, ReLU, FC 512,
ReLU, FC classes (the CIFAR VGG of the FL literature, dropout removed so that training is deterministic).
"""

from __future__ import annotations

from torch import nn
from typing_extensions import override

from dfl.models.layers import Conv2d

CONFIG_A = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    """VGG for 32×32 images without BatchNorm or dropout (configuration "A" by default: VGG-11)."""
    def __init__(self, in_channels: int, num_classes: int, conv_impl: str, config=CONFIG_A):
        super().__init__()
        layers: list[nn.Module] = []
        cin = in_channels
        for item in config:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                layers += [Conv2d(cin, item, 3, padding=1, conv_impl=conv_impl), nn.ReLU()]
                cin = item
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(cin, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                        nn.Linear(512, num_classes))

    @override
    def forward(self, x):
        return self.classifier(self.features(x).mean(dim=(-2, -1)))
