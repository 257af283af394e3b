"""Tiny models with random weights used by the tests, and CPU-provider helpers."""

from __future__ import annotations

import dataclasses

import torch


def cpu_backend(**config):
    from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig

    return ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider=ONNXExecutionProvider.CPU, **config))


def cpu_strategy(**config):
    import aitune.torch as ait

    return ait.OneBackendStrategy(cpu_backend(**config))


class MLP(torch.nn.Module):
    def __init__(self, features: int = 16, hidden: int = 32, classes: int = 8):
        super().__init__()
        self.fc1 = torch.nn.Linear(features, hidden)
        self.act = torch.nn.GELU()
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class SmallCNN(torch.nn.Module):
    """Conv stack with global pooling: any spatial size in, [batch, 10] out."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1),
            torch.nn.BatchNorm2d(8),
            torch.nn.ReLU(),
            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
            torch.nn.ReLU(),
        )
        self.head = torch.nn.Linear(16, 10)

    def forward(self, image):
        return self.head(self.features(image).mean(dim=(2, 3)))


@dataclasses.dataclass
class Features:
    embedding: torch.Tensor
    pooled: torch.Tensor


class DictModel(torch.nn.Module):
    """Dict input; returns a tuple holding a tensor and a dataclass."""

    def __init__(self):
        super().__init__()
        self.image = torch.nn.Linear(12, 6)
        self.meta = torch.nn.Linear(4, 6)

    def forward(self, inputs):
        embedding = torch.tanh(self.image(inputs["image"]) + self.meta(inputs["meta"]))
        return embedding.sum(-1), Features(embedding=embedding, pooled=embedding.mean(-1, keepdim=True))


class MaskedModel(torch.nn.Module):
    """A keyword-only optional input."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, *, mask=None):
        y = self.proj(x)
        if mask is not None:
            y = y * mask
        return y


class NestedModel(torch.nn.Module):
    """Nested inputs (a tuple and a dict of lists), non-tensor arguments, and a dict
    output holding a list, a dataclass and a constant."""

    def __init__(self):
        super().__init__()
        self.left = torch.nn.Linear(8, 4)
        self.right = torch.nn.Linear(8, 4)

    def forward(self, pair, extra, scale=2.0, mode="sum"):
        a, b = pair
        left = self.left(a) * scale
        right = self.right(b) + extra["bias"][0]
        total = left + right if mode == "sum" else left - right
        return {"total": total, "parts": [left, right], "features": Features(total, total.mean(-1)), "mode": mode}


def saved_tuned_mlp(root):
    """One MLP tuned on the CPU provider (performance validation off: a second or two) and
    saved to ``root / "ckpt"``, its tuning cache under ``root``: the checkpoint, a sample
    input and the tuned module's output for it, for tests that copy or damage it."""
    import pytest

    import aitune.torch as ait
    from aitune.torch import ModuleState

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AITUNE_CACHE_DIR", str(root / "cache"))
        ait.enable_performance_validation(False)
        try:
            torch.manual_seed(0)
            model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy())
            ait.tune(model, [torch.randn(16) for _ in range(2)], disable_external_logging=True,
                     ignore_failing_modules=False)
            assert model.ait_state is ModuleState.TUNED
            x = torch.randn(2, 16)
            with torch.no_grad():
                expected = model(x)
            ait.save(model, root / "ckpt")
        finally:
            ait.enable_performance_validation(True)
    return root / "ckpt", x, expected
