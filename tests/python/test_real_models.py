"""Real models tune when called the way their users call them: Hugging Face BERT (keyword
and positional calls), GPT-2 (attention mask, use_cache=False, dynamic sequence length),
ViT, and a ResNet with BatchNorm (dynamic batch), with both exporters on the CPU provider.
Tiny random configurations made here; nothing is downloaded."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState

transformers = pytest.importorskip("transformers")

EXPORTERS = [pytest.param(True, id="dynamo"), pytest.param(False, id="trace")]
TOL = dict(atol=1e-4, rtol=1e-4)


def _tune(inner: torch.nn.Module, name: str, samples, use_dynamo: bool, **kwargs) -> ait.Module:
    model = ait.Module(inner, name, strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    ait.tune(model, samples, ignore_failing_modules=False, disable_external_logging=True, progress=False, **kwargs)
    assert model.ait_state is ModuleState.TUNED
    assert all("ONNXRuntimeBackend" in b for b in model.ait_backends.values()), model.ait_backends
    return model


def _no_eager(model: ait.Module, monkeypatch) -> None:
    """From now on a call that reaches the wrapped module's forward fails the test."""
    monkeypatch.setattr(model.ait_module, "forward", lambda *a, **k: pytest.fail("the eager forward ran"))


def _assert_same_output(actual, expected) -> None:
    """Same ModelOutput type, same fields in the same order, values close."""
    assert type(actual) is type(expected)
    assert list(actual.keys()) == list(expected.keys())
    for key in expected.keys():
        torch.testing.assert_close(actual[key], expected[key], **TOL)


def _bert(layers: int = 1) -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64,
    )
    return transformers.BertModel(config).eval()


def _token_sample(length: int, vocab: int = 100) -> dict[str, torch.Tensor]:
    mask = torch.ones(length, dtype=torch.long)
    mask[length - 2 :] = 0  # padding: the mask matters
    return {"input_ids": torch.randint(0, vocab, (length,)), "attention_mask": mask}


@pytest.mark.parametrize("use_dynamo", EXPORTERS)
def test_bert_called_with_keywords_returns_its_model_output(use_dynamo, monkeypatch):
    inner = _bert()
    samples = [_token_sample(8), _token_sample(16)]  # sequence length varies: a dynamic axis
    model = _tune(inner, "bert", samples, use_dynamo, batch_sizes=[1, 2])
    ids, mask = torch.randint(0, 100, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    with torch.no_grad():
        expected = inner(input_ids=ids, attention_mask=mask)
        _no_eager(model, monkeypatch)
        actual = model(input_ids=ids, attention_mask=mask)
        again = model(attention_mask=mask, input_ids=ids)  # keyword order does not matter
    assert type(expected).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
    _assert_same_output(actual, expected)
    _assert_same_output(again, expected)


def test_two_layer_bert_with_padded_samples_tunes_with_the_trace_exporter():
    """Issue 28's GPU suite: transformers' padding mask (``mask[batch, kv]`` in
    masking_utils) made the trace export refuse ``q_length > 1``
    (sdpa_attention.py) of the second layer, whose query the mask reached through the first
    layer's attention, as a branch on the inputs' values. It is a shape."""
    inner = _bert(layers=2)
    model = _tune(inner, "bert-two-layers", [_token_sample(12) for _ in range(4)], use_dynamo=False, batch_sizes=[2])
    ids, mask = torch.randint(0, 100, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    mask[0, 9:] = 0
    with torch.no_grad():
        _assert_same_output(model(input_ids=ids, attention_mask=mask), inner(input_ids=ids, attention_mask=mask))


def test_bert_called_positionally():
    inner = _bert()
    samples = [tuple(_token_sample(10).values()) for _ in range(2)]  # (ids, mask): positional calls
    model = _tune(inner, "bert-positional", samples, use_dynamo=False)
    ids, mask = torch.randint(0, 100, (2, 10)), torch.ones(2, 10, dtype=torch.long)
    with torch.no_grad():
        _assert_same_output(model(ids, mask), inner(ids, mask))


def test_a_recorded_call_is_replayed_as_the_user_made_it():
    """No default is filled in: forward sees the keywords it was called with, nothing more
    (Hugging Face's forward decorators add keywords of their own and collided)."""
    seen = []

    class Spy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x, mask=None, use_cache=None, **kwargs):
            seen.append((torch.is_tensor(x), sorted(kwargs), mask is None, use_cache))
            return self.fc(x)

    model = _tune(Spy().eval(), "spy", [{"x": torch.randn(4), "flag": True}], use_dynamo=False)
    assert seen and all(call == (True, ["flag"], True, None) for call in seen), seen
    (graph,) = model.ait_graphs
    args, kwargs = graph.call_arguments(graph.samples[0].inputs)
    assert args == () and set(kwargs) == {"x", "flag"}


def test_bert_model_output_survives_save_and_load(tmp_path, monkeypatch):
    inner = _bert()
    model = _tune(inner, "bert-saved", [_token_sample(8), _token_sample(12)], use_dynamo=False)
    ait.save(model, tmp_path / "bert.ait")
    loaded = ait.load(ait.Module(_bert(), "bert-saved"), tmp_path / "bert.ait")
    ids, mask = torch.randint(0, 100, (2, 10)), torch.ones(2, 10, dtype=torch.long)
    with torch.no_grad():
        expected = inner(input_ids=ids, attention_mask=mask)
        _no_eager(loaded, monkeypatch)
        _assert_same_output(loaded(input_ids=ids, attention_mask=mask), expected)


@pytest.mark.parametrize("use_dynamo", EXPORTERS)
def test_gpt2_with_attention_mask_and_dynamic_sequence_length(use_dynamo, monkeypatch):
    config = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    inner = transformers.GPT2Model(config).eval()
    samples = [{**_token_sample(n), "use_cache": False} for n in (6, 14)]
    model = _tune(inner, "gpt2", samples, use_dynamo, batch_sizes=[1, 2])
    for length in (7, 13):
        ids, mask = torch.randint(0, 100, (2, length)), torch.ones(2, length, dtype=torch.long)
        mask[0, -3:] = 0
        with torch.no_grad():
            expected = inner(input_ids=ids, attention_mask=mask, use_cache=False)
            with monkeypatch.context() as patch:
                _no_eager(model, patch)
                actual = model(input_ids=ids, attention_mask=mask, use_cache=False)
        assert "past_key_values" not in expected.keys()
        _assert_same_output(actual, expected)


@pytest.mark.parametrize("use_dynamo", EXPORTERS)
def test_vit_image_model(use_dynamo, monkeypatch):
    config = transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
    )
    inner = transformers.ViTModel(config).eval()
    model = _tune(inner, "vit", [torch.randn(3, 32, 32) for _ in range(2)], use_dynamo, batch_sizes=[1, 3])
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = inner(x)
        _no_eager(model, monkeypatch)
        _assert_same_output(model(x), expected)


def _resnet() -> torch.nn.Module:
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="bottleneck")
    inner = transformers.ResNetModel(config)
    inner.train()
    with torch.no_grad():  # BatchNorm statistics set by a few training-mode passes, as after training
        for _ in range(3):
            inner(torch.randn(4, 3, 32, 32) * 2 + 0.5)
    return inner.eval()


@pytest.mark.parametrize("use_dynamo", EXPORTERS)
def test_resnet_with_batchnorm_and_dynamic_batch(use_dynamo, monkeypatch):
    inner = _resnet()
    samples = [{"pixel_values": torch.randn(3, 32, 32)} for _ in range(2)]
    model = _tune(inner, "resnet", samples, use_dynamo, batch_sizes=[1, 4])
    for batch in (1, 3, 4):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            expected = inner(pixel_values=x)
            with monkeypatch.context() as patch:
                _no_eager(model, patch)
                actual = model(pixel_values=x)
        _assert_same_output(actual, expected)


# -- gradients (issue 17 item 7) ----------------------------------------------------------


def test_inputs_that_require_grad_run_eagerly_with_autograd_intact(caplog):
    inner = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()
    model = _tune(inner, "grad", [torch.randn(8) for _ in range(2)], use_dynamo=False)
    x = torch.randn(2, 8)
    with torch.no_grad():
        model(x)  # a served call first: the C++ hot path has a route for this form now
    leaf = x.clone().requires_grad_()
    with caplog.at_level("WARNING", logger="aitune"):
        (model(leaf).sum() + leaf.sum()).backward()
        model(leaf)
    reference = x.clone().requires_grad_()
    (inner(reference).sum() + reference.sum()).backward()
    torch.testing.assert_close(leaf.grad, reference.grad)
    assert not torch.allclose(leaf.grad, torch.ones_like(leaf.grad))  # not detached: more than x.sum()'s ones
    assert sum("require grad" in r.getMessage() for r in caplog.records) == 1  # said once
    with torch.no_grad():  # without gradients the tuned graph serves the same input
        torch.testing.assert_close(model(leaf), inner(x), **TOL)


# -- the reference ------------------------------------------------------------------------


def test_exact_float32_turns_tf32_off_and_restores_the_users_settings():
    from aitune.torch.graph_tuning import exact_float32

    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = True, True
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with exact_float32():
                assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
                raise RuntimeError("inside")
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_large_activations_pass_the_scaled_default_and_a_wrong_export_still_fails():
    """Outputs in the hundreds: the strict candidate's float32 rounding passes the scaled
    atol; the trace exporter baking in the wrong branch of a data-dependent model fails."""

    class Amplified(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(64, 64)

        def forward(self, x):
            y = self.fc(x) * 300.0
            return y if x.sum() > 0 else -y  # the trace exporter records one branch

    inner = Amplified().eval()
    samples = [torch.randn(64).abs() for _ in range(2)] + [-torch.randn(64).abs() for _ in range(2)]
    # allow_trace_warnings: past the refusal of such a trace (test_semantics_control_flow), to the check
    backend = cpu_strategy(use_dynamo=False, tune_provider_options=False, allow_trace_warnings=True).backends[0]
    model = ait.Module(inner, "amplified", strategy=ait.FirstWinsStrategy([backend, ait.TorchEagerBackend()]))
    ait.tune(model, samples, batch_sizes=[1], progress=False, disable_external_logging=True)
    (report,) = model.ait_reports.values()
    (candidate,) = report.candidates
    assert candidate.status == "incorrect" and "x output RMS" in candidate.reason, report.summary_table()
    assert model.ait_backends[report.graph.split("/")[-1]].startswith("TorchEagerBackend")

    positive = ait.Module(Amplified().eval(), "amplified-positive", strategy=cpu_strategy(
        use_dynamo=False, tune_provider_options=False, allow_trace_warnings=True))
    ait.tune(positive, samples[:2], batch_sizes=[1, 2], progress=False, ignore_failing_modules=False,
             disable_external_logging=True)
    (report,) = positive.ait_reports.values()
    assert report.winner is not None, report.summary_table()


def test_a_cache_object_in_the_outputs_is_refused_by_name():
    """T5 called as its users do returns a transformers Cache (use_cache=True by default):
    an ONNX graph cannot return it, and returning the object recorded while tuning would be
    wrong, so the graph is refused with the output's name and the fixes (use_cache=False, or
    DecodeStep for a generation loop with its cache); with
    use_cache=False the same model tunes and matches eager."""
    config = transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    inner = transformers.T5Model(config).eval()
    sample = {"input_ids": torch.randint(0, 100, (12,)), "decoder_input_ids": torch.randint(0, 100, (5,))}
    model = ait.Module(copy.deepcopy(inner), "t5-cache", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"output\[.past_key_values.\].*use_cache=False.*DecodeStep"):
        ait.tune(model, [sample], batch_sizes=[1], ignore_failing_modules=False, disable_external_logging=True)
    kept = ait.Module(copy.deepcopy(inner), "t5-cache-kept", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(kept, [sample], batch_sizes=[1], disable_external_logging=True)  # ignore_failing_modules: stays eager
    ids, dec = torch.randint(0, 100, (1, 12)), torch.randint(0, 100, (1, 5))
    with torch.no_grad():
        out = kept(input_ids=ids, decoder_input_ids=dec)
    assert type(out.past_key_values).__name__.endswith("Cache")  # eager's own, fresh per call
    nocache = ait.Module(copy.deepcopy(inner), "t5-nocache", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(nocache, [{**sample, "use_cache": False}], batch_sizes=[1], ignore_failing_modules=False,
             disable_external_logging=True)
    with torch.no_grad():
        expected = inner(input_ids=ids, decoder_input_ids=dec, use_cache=False)
        actual = nocache(input_ids=ids, decoder_input_ids=dec, use_cache=False)
    assert nocache.ait_backends and all("ONNXRuntimeBackend" in b for b in nocache.ait_backends.values())
    torch.testing.assert_close(actual.last_hidden_state, expected.last_hidden_state, atol=1e-4, rtol=1e-4)
