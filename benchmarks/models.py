"""The four benchmark models of docs/benchmarks.md, random weights.

ResNet-18 comes from torchvision or timm when installed; otherwise from the definition
below, which has torchvision's resnet18 architecture (BasicBlock x [2, 2, 2, 2]).
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """4 x (Linear 256, GELU)."""

    def __init__(self, width: int = 256, layers: int = 4):
        super().__init__()
        self.net = nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())])

    def forward(self, x):
        return self.net(x)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + identity)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def resnet18() -> tuple[nn.Module, str]:
    try:
        import torchvision

        return torchvision.models.resnet18(weights=None), "torchvision"
    except ImportError:
        pass
    try:
        import timm

        return timm.create_model("resnet18", pretrained=False), "timm"
    except ImportError:
        return ResNet18(), "benchmarks/models.py (torchvision's architecture)"


class Encoder(nn.Module):
    """nn.TransformerEncoder, 4 x (d_model 256, 4 heads), batch first."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


def cases() -> list[tuple[str, nn.Module, tuple[int, ...], str]]:
    """(name, model, input shape, source) for each row of the table."""
    resnet, source = resnet18()
    return [
        ("MLP b1", MLP(), (1, 256), "benchmarks/models.py"),
        ("ResNet-18 b1", resnet, (1, 3, 224, 224), source),
        ("ResNet-18 b32", resnet, (32, 3, 224, 224), source),
        ("Encoder s128 b8", Encoder(), (8, 128, 256), "torch.nn.TransformerEncoder"),
    ]
