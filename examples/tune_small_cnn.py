"""The main job of `make demo`: tune a small torchvision-style CNN (random weights) with
aitune on the best provider available here and compare it with eager PyTorch.

    python examples/tune_small_cnn.py
"""
import time

import torch
from torch import nn

import aitune.torch as ait
from aitune import _core
from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig


class BasicBlock(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm and a skip connection."""

    def __init__(self, channels_in: int, channels_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.skip = (nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride, bias=False), nn.BatchNorm2d(channels_out))
                     if stride != 1 or channels_in != channels_out else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


class SmallCNN(nn.Module):
    """Stem, three residual stages, global pooling, classifier (10 classes)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.stages = nn.Sequential(BasicBlock(32, 32, 1), BasicBlock(32, 64, 2), BasicBlock(64, 128, 2))
        self.head = nn.Linear(128, num_classes)

    def forward(self, x):
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1))


def best_provider() -> ONNXExecutionProvider:
    cuda = _core.OrtRuntime.load().provider_status(_core.ExecutionProvider.CUDA)
    if cuda.available and torch.cuda.is_available():
        return ONNXExecutionProvider.CUDA
    print(f"CUDA unavailable ({cuda.reason.split(';')[0]}); using the CPU provider")
    return ONNXExecutionProvider.CPU


def p50_us(fn, x, iterations: int = 200) -> float:
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
    for _ in range(20):
        fn(x)
    sync()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn(x)
        sync()
        samples.append((time.perf_counter() - start) * 1e6)
    return sorted(samples)[len(samples) // 2]


def main() -> None:
    torch.manual_seed(0)
    provider = best_provider()
    device = torch.device("cuda" if provider is ONNXExecutionProvider.CUDA else "cpu")
    eager = SmallCNN().eval().to(device)
    samples = [torch.randn(3, 32, 32, device=device) for _ in range(4)]
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider=provider))
    model = ait.Module(SmallCNN().eval().to(device), "small-cnn", strategy=ait.OneBackendStrategy(backend=backend))
    model.load_state_dict(eager.state_dict())
    ait.tune(model, samples, batch_sizes=[1, 2, 4], ignore_failing_modules=False)
    print(f"state: {model.ait_state.value}; chosen: {model.ait_backends}")

    with torch.no_grad():
        x = torch.randn(4, 3, 32, 32, device=device)
        diff = (model(x) - eager(x)).abs().max().item()
        eager_us, tuned_us = p50_us(eager, x), p50_us(model, x)
    print(f"max |aitune - eager| at batch 4: {diff:.2e}")
    print(f"p50 latency, batch 4 on {device}: eager {eager_us:.0f} us, aitune {tuned_us:.0f} us "
          f"({eager_us / tuned_us:.2f}x eager)")


if __name__ == "__main__":
    main()
