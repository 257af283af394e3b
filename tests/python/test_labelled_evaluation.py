"""The user's metric over a labelled evaluation set (``ait.tune(..., accuracy=fn,
evaluation=(samples, labels), max_accuracy_drop=d)``): scored on the evaluation batches for
eager and for each candidate; the engine refuses a candidate whose drop exceeds d."""

from __future__ import annotations

import json

import pytest
import torch
from torch_models import MLP, cpu_strategy

import aitune.torch as ait
from aitune import _core
from aitune.torch.evaluation import evaluation_batches, labelled_metric
from aitune.torch.graph_tuning import _samples
from aitune.torch.options import TuneOptions

CLASSES = 8


def _accuracy(outputs, labels) -> float:
    """Top-1 accuracy against the labels, over every evaluation batch."""
    right = sum((o.argmax(-1) == y).sum().item() for o, y in zip(outputs, labels, strict=True))
    return right / sum(len(y) for y in labels)


def _labelled_set(model: torch.nn.Module, count: int = 10):
    """Samples and labels on which eager's accuracy is known: the labels are eager's own
    predictions, except every fourth one, which is set to a wrong class."""
    torch.manual_seed(1)
    samples = [torch.randn(16) for _ in range(count)]
    with torch.no_grad():
        predicted = [int(model(x).argmax(-1)) for x in samples]
    labels = [(p + 1) % CLASSES if i % 4 == 0 else p for i, p in enumerate(predicted)]
    wrong = sum(1 for i in range(count) if i % 4 == 0)
    return samples, labels, 1 - wrong / count


def test_the_labelled_metric_is_scored_for_eager_and_the_candidate():
    torch.manual_seed(0)
    inner = MLP(classes=CLASSES).eval()
    samples, labels, eager_accuracy = _labelled_set(inner)
    model = ait.Module(inner, "mlp_labelled", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    seen = []

    def metric(outputs, batch_labels):
        seen.append(([tuple(o.shape) for o in outputs], [y.tolist() for y in batch_labels]))
        return _accuracy(outputs, batch_labels)

    ait.tune(model, [torch.randn(16) for _ in range(4)], batch_sizes=[1, 4], accuracy=metric,
             evaluation=(samples, labels), max_accuracy_drop=0.0, ignore_failing_modules=False,
             performance_validation=False, disable_external_logging=True, progress=False)
    assert model.ait_state is ait.ModuleState.TUNED
    # batches of the largest batch size, in order, the last one smaller; labels collated
    expected = ([(4, CLASSES), (4, CLASSES), (2, CLASSES)], [labels[0:4], labels[4:8], labels[8:10]])
    assert seen[0] == expected and seen[1] == expected  # the baseline (eager), then the candidate
    (report,) = model.ait_reports.values()
    winner = next(c for c in json.loads(report.to_json())["candidates"] if c["status"] == "selected")
    user = winner["correctness"]["user_metric"]
    assert user["baseline"] == pytest.approx(eager_accuracy)  # 0.7: 3 of 10 labels are wrong
    assert user["score"] == pytest.approx(eager_accuracy) and user["passed"] is True


@pytest.mark.parametrize(("damaged", "status"), [(0, "passed"), (1, "passed"), (2, "incorrect")])
def test_a_candidate_whose_labelled_accuracy_drops_beyond_the_maximum_is_refused(damaged, status):
    """Engine seam: candidates whose outputs are eager's with the logits of `damaged`
    evaluation samples turned upside down (their predictions flip away from the label);
    the maximum drop allows one sample of ten."""
    torch.manual_seed(0)
    inner = MLP(classes=CLASSES).eval()
    samples, labels, eager_accuracy = _labelled_set(inner)
    model = ait.Module(inner, f"mlp_labelled_drop_{damaged}")
    ait.tune(model, [torch.randn(16) for _ in range(4)], batch_sizes=[1, 4], accuracy=_accuracy,
             evaluation=(samples, labels), max_accuracy_drop=0.1, dry_run=True)
    (graph,) = model.ait_graphs
    evaluated = [i for i, s in enumerate(graph.samples) if s.evaluation is not None]
    assert [graph.samples[i].evaluation for i in evaluated] == [0, 1, 2]
    options = TuneOptions(accuracy=_accuracy, max_accuracy_drop=0.1)
    tuner_options = options.tuner_options()
    tuner_options.profile.warmup_calls, tuner_options.profile.window_calls = 1, 5
    tuner_options.profile.time_cap_s = 0.2
    recorded = _samples(graph)
    labels_per_batch = [b.labels for b in evaluation_batches((samples, labels), 4)]
    tuner_options.accuracy_metric = labelled_metric(graph, recorded, _accuracy, labels_per_batch)
    tuner = _core.GraphTuner("mlp", graph.graph_spec(), recorded, tuner_options)

    # samples 1, 2 (labels right): flipped logits predict another class
    flips = {1, 2}
    flips = set(sorted(flips)[:damaged])

    def outputs(i):
        out = graph.samples[i].outputs[0].clone()
        if graph.samples[i].evaluation == 0:
            for row in flips:
                out[row] = -out[row]
        return [out.contiguous().numpy()]

    tuner.evaluate_external("damaged", "Test", 0, _core.Precision.STRICT, "{}", outputs, lambda: None)
    (candidate,) = tuner.report.candidates
    assert candidate.status == status, candidate.reason
    data = json.loads(tuner.report.to_json())["candidates"][0]["correctness"]["user_metric"]
    assert data["baseline"] == pytest.approx(eager_accuracy)
    assert data["score"] == pytest.approx(eager_accuracy - damaged / 10)
    assert data["max_drop"] == pytest.approx(0.1)
    if status == "incorrect":
        assert "user accuracy metric 0.5 vs eager's 0.7: drop 0.2 > maximum 0.1" in candidate.reason


def test_bad_evaluation_sets_are_refused_before_recording():
    model = ait.Module(MLP().eval(), "mlp_bad_evaluation")
    data = [torch.randn(16) for _ in range(2)]
    with pytest.raises(ValueError, match="needs accuracy"):
        ait.tune(model, data, evaluation=([torch.randn(16)], [0]))
    with pytest.raises(ValueError, match="2 samples but 1 labels"):
        ait.tune(model, data, accuracy=_accuracy, evaluation=([torch.randn(16)] * 2, [0]))
    with pytest.raises(TypeError, match="pair"):
        ait.tune(model, data, accuracy=_accuracy, evaluation=[torch.randn(16)])
    with pytest.raises(ValueError, match="cannot be stacked"):
        ait.tune(model, data, accuracy=_accuracy, evaluation=([torch.randn(16), torch.randn(8)], [0, 1]))
