"""benchmarks/zoo.py measures models whose outputs can judge a candidate: a model with random
weights whose eager outputs are constant (transformers' EfficientNet from a config: every logit 0)
made every candidate "match" with error 0, and its row measured nothing on the H200."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
zoo = pytest.importorskip("zoo")
transformers = pytest.importorskip("transformers")


def test_vacuous_outputs_names_constant_and_non_finite_outputs():
    varying = torch.randn(2, 5)
    assert zoo.vacuous_outputs(varying) == []
    assert zoo.vacuous_outputs({"logits": torch.zeros(2, 5), "hidden": varying}) == ["logits (constant 0)"]
    assert zoo.vacuous_outputs((varying, torch.full((3,), float("nan")))) == ["1 (not finite)"]
    assert zoo.vacuous_outputs(torch.tensor([[1, 1], [1, 1]])) == []  # integer outputs are compared exactly


def test_the_zoo_efficientnet_has_outputs_that_vary():
    config = transformers.EfficientNetConfig(width_coefficient=0.25, depth_coefficient=0.25, image_size=64,
                                             hidden_dim=320, num_labels=10)
    torch.manual_seed(0)
    with torch.no_grad():
        stock = transformers.EfficientNetForImageClassification(config).eval()(torch.randn(2, 3, 64, 64))
    assert zoo.vacuous_outputs(dict(stock)) == ["logits (constant 0)"]  # why the zoo initialises it itself
    model, args, kwargs = zoo.build("efficientnet-b0", True, torch.device("cpu"))
    with torch.no_grad():
        logits = model.eval()(*args, **kwargs).logits
    assert zoo.vacuous_outputs(logits) == []
    assert logits.std().item() > 1e-2
