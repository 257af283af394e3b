"""Real models on CUDA (skipped without a GPU): the BERT dynamo-export CUDA-graph regression
of issue 13 (a capture that broke the process's CUDA context), keyword calls with the
Quick Start's CUDA provider, and the exact (TF32-off) reference."""

from __future__ import annotations

import pytest
import torch

import aitune.torch as ait
from aitune import _core
from aitune.torch import ModuleState
from aitune.torch.backend import ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from aitune.torch.candidate_isolation import check_cuda_health
from aitune.torch.graph_tuning import exact_float32

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _bert(layers: int = 2):
    config = transformers.BertConfig(num_hidden_layers=layers, hidden_size=256, num_attention_heads=4,
                                     intermediate_size=1024)
    return transformers.BertModel(config).eval().cuda(), config


class LastHiddenState(torch.nn.Module):
    """The wrapping of the issue: forward(ids, mask) -> last_hidden_state."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, ids, mask):
        return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state


def _token_samples(vocab: int, n: int = 16, length: int = 128):
    samples = []
    for _ in range(n):
        mask = torch.ones(length, dtype=torch.long)
        mask[length - 20 :] = 0
        samples.append((torch.randint(0, vocab, (length,)), mask))
    return samples


def _quick_start(module, name: str, **config):
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider=ONNXExecutionProvider.CUDA, **config))
    return ait.Module(module, name, strategy=ait.OneBackendStrategy(backend=backend))


def _check_winner(model, reference, actual):
    (report,) = model.ait_reports.values()
    assert report.winner is not None, report.summary_table()
    winner = report.candidates[report.winner]
    tolerance = _core.default_tolerance("float32", winner.precision)
    scale = max(1.0, reference.pow(2).mean().sqrt().item())
    torch.testing.assert_close(actual, reference, atol=tolerance.atol * scale, rtol=tolerance.rtol)
    return report


def test_bert_dynamo_export_with_cuda_graph_candidates_keeps_the_process_healthy():
    bert, config = _bert()
    model = _quick_start(LastHiddenState(bert), "bert-graphs")  # default exporter: dynamo
    ait.tune(model, _token_samples(config.vocab_size), batch_sizes=[8], progress=False, ignore_failing_modules=False)
    check_cuda_health(torch.device("cuda"), "the BERT tune")
    (report,) = model.ait_reports.values()
    graphs = [c for c in report.candidates if "enable_cuda_graph=1" in c.name]
    assert graphs, report.summary_table()  # static shapes: the CUDA-graph variants were offered
    for c in graphs:  # each either ran or failed with a reason, never took the process down
        assert c.status != "failed" or c.reason, report.summary_table()
    ids = torch.randint(0, config.vocab_size, (8, 128), device="cuda")
    mask = torch.ones(8, 128, dtype=torch.long, device="cuda")
    with torch.no_grad():
        with exact_float32():
            reference = bert(input_ids=ids, attention_mask=mask).last_hidden_state
        actual = model(ids, mask)
    _check_winner(model, reference, actual)
    a = torch.randn(256, 256, device="cuda")
    torch.testing.assert_close((a @ a).cpu(), a.cpu() @ a.cpu(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_bert_keyword_calls_on_cuda_return_the_model_output(use_dynamo):
    bert, config = _bert()
    model = _quick_start(bert, f"bert-kw-{use_dynamo}", use_dynamo=use_dynamo)
    samples = [{"input_ids": ids, "attention_mask": mask} for ids, mask in _token_samples(config.vocab_size, 8)]
    ait.tune(model, samples, batch_sizes=[4], progress=False, ignore_failing_modules=False)
    assert model.ait_state is ModuleState.TUNED
    ids = torch.randint(0, config.vocab_size, (4, 128), device="cuda")
    mask = torch.ones(4, 128, dtype=torch.long, device="cuda")
    with torch.no_grad():
        with exact_float32():
            expected = bert(input_ids=ids, attention_mask=mask)
        actual = model(input_ids=ids, attention_mask=mask)
    assert type(actual) is type(expected) and list(actual.keys()) == list(expected.keys())
    _check_winner(model, expected.last_hidden_state, actual.last_hidden_state)
    check_cuda_health(torch.device("cuda"), "the BERT keyword tune")


def test_the_reference_is_computed_with_tf32_off_and_the_settings_are_restored():
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3)).eval().cuda()
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            seen.append(torch.backends.cudnn.allow_tf32)
            return self.conv(x)

    model = _quick_start(Spy().eval(), "tf32-off", tune_provider_options=False)
    ait.tune(model, [torch.randn(3, 32, 32, device="cuda") for _ in range(2)], batch_sizes=[2], progress=False,
             ignore_failing_modules=False)
    assert False in seen  # the reference ran with TF32 off
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before
