"""More Hugging Face call styles and models than test_real_models.py: what a probe of
tiny random configurations found broken, each with the class of failure it stands for, and
models a probe found working (CLIP's nested ModelOutput, Wav2Vec2's audio of any length)
kept working. Nothing is downloaded."""

from __future__ import annotations

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune import _core
from aitune.torch import ModuleState

transformers = pytest.importorskip("transformers")

TOL = dict(atol=1e-4, rtol=1e-4)


def _tune(inner: torch.nn.Module, name: str, samples, use_dynamo: bool = False, **kwargs) -> ait.Module:
    model = ait.Module(inner, name, strategy=cpu_strategy(use_dynamo=use_dynamo, tune_provider_options=False))
    ait.tune(model, samples, ignore_failing_modules=False, disable_external_logging=True, progress=False, **kwargs)
    assert model.ait_state is ModuleState.TUNED
    assert all("ONNXRuntimeBackend" in b for b in model.ait_backends.values()), model.ait_backends
    return model


def _assert_same(actual, expected) -> None:
    """Same type and structure (ModelOutput keys, tuple lengths), tensors close."""
    assert type(actual) is type(expected)
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, **TOL)
    elif hasattr(expected, "keys"):
        assert list(actual.keys()) == list(expected.keys())
        for key in expected.keys():
            _assert_same(actual[key], expected[key])
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _assert_same(a, e)
    else:
        assert actual == expected


def _bert_classifier() -> torch.nn.Module:
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64,
    )
    return transformers.AutoModelForSequenceClassification.from_config(config).eval()


def _tokens(length: int, batch: int | None = None) -> dict[str, torch.Tensor]:
    shape = (length,) if batch is None else (batch, length)
    mask = torch.ones(shape, dtype=torch.long)
    mask[..., length - 2 :] = 0
    return {"input_ids": torch.randint(0, 100, shape), "attention_mask": mask,
            "token_type_ids": torch.randint(0, 2, shape)}


# -- samples in a BatchEncoding (what a tokenizer and Hugging Face's collators return) ----


def test_batch_encoding_samples_are_stacked_like_dicts():
    """A BatchEncoding is a UserDict, not a dict: pytree saw one opaque leaf, so samples
    were never stacked (a "batch" of 2 reached the model without a batch axis and BERT
    failed unpacking its shape). Its keys are keywords, as a dict's are."""
    inner = _bert_classifier()
    samples = [transformers.BatchEncoding(_tokens(n)) for n in (8, 8, 16)]
    model = _tune(inner, "bert-batch-encoding", samples, batch_sizes=[1, 2])
    (graph,) = model.ait_graphs
    assert {s.batch_size for s in graph.samples} == {1, 2}
    assert all(s.inputs[0].shape[0] == s.batch_size for s in graph.samples)
    batch = transformers.BatchEncoding(_tokens(12, batch=2))
    with torch.no_grad():
        _assert_same(model(**batch), inner(**batch))


def test_a_dataloader_of_batch_encodings_knows_its_batch_size():
    """Batches made by the user (a DataLoader without batch_size) in BatchEncodings: the
    batch size is read from their tensors, not 0."""
    from aitune.torch.dataset import iterate_calls

    batches = [transformers.BatchEncoding(_tokens(8, batch=b)) for b in (1, 3)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None)
    calls = list(iterate_calls(loader, [1, 2]))
    assert [size for size, _, _ in calls] == [1, 3]
    assert all(args == () and set(kwargs) == {"input_ids", "attention_mask", "token_type_ids"}
               for _, args, kwargs in calls)


def test_tensors_inside_an_unknown_mapping_are_refused_not_left_unbatched():
    from aitune.torch.dataset import iterate_calls

    samples = [((transformers.BatchEncoding(_tokens(8)),), {}) for _ in range(2)]  # a positional BatchEncoding
    with pytest.raises(ValueError, match="BatchEncoding.*cannot be stacked"):
        list(iterate_calls(samples, [2]))


# -- a failed trace export stays quiet when asked to (Whisper's aten::diff) ---------------


class _Diff(torch.nn.Module):
    """An operator the trace exporter cannot export (Whisper's decoder uses it)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.diff(self.fc(x), dim=-1)


@pytest.fixture
def onnx_log_off():
    """The trace exporter's ONNX log flag off for the test, as in a fresh process (an
    earlier test's direct torch.onnx.export leaves it on), and put back after."""
    before = torch._C._jit_is_onnx_log_enabled()
    torch._C._jit_set_onnx_log_enabled(False)
    yield
    torch._C._jit_set_onnx_log_enabled(before)


def test_a_failed_trace_export_prints_nothing_with_external_logging_disabled(capfd, onnx_log_off):
    """torch's trace exporter turns its ONNX log on for every export (and never off) and,
    when the export fails, writes the whole TorchScript graph to file descriptor 1 from
    C++, past Python's redirection: 96 KB for a tiny Whisper. disable_external_logging
    swallows it; the typed error names the operator; the log flag is left as it was."""
    import aitune

    assert not torch._C._jit_is_onnx_log_enabled()
    model = ait.Module(_Diff().eval(), "diff", strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    capfd.readouterr()
    with pytest.raises(aitune.AituneError, match="aten::diff"):
        ait.tune(model, [torch.randn(8)], batch_sizes=[1], ignore_failing_modules=False,
                 disable_external_logging=True, progress=False)
    out, err = capfd.readouterr()
    assert "Torch IR graph" not in out + err and "graph(" not in out + err, (out + err)[:300]
    assert not torch._C._jit_is_onnx_log_enabled()
    assert model.ait_state is ModuleState.PASSTHROUGH
    with torch.no_grad():
        torch.testing.assert_close(model(torch.ones(2, 8)), model.ait_module(torch.ones(2, 8)))


# -- train() after tuning (fine-tuning a tuned model, Trainer's train()/eval() switches) ---


def _no_eager(model: ait.Module, monkeypatch) -> None:
    monkeypatch.setattr(model.ait_module, "forward", lambda *a, **k: pytest.fail("the eager forward ran"))


def test_a_tuned_module_put_in_train_mode_runs_eagerly_until_eval(caplog, monkeypatch):
    """The graph was exported in eval mode: served in train mode it silently applied no
    dropout, kept BatchNorm statistics frozen and returned outputs without gradients (a
    training step's backward failed). Train-mode calls run eagerly, said once; eval()
    brings the graph back."""
    inner = _bert_classifier()  # hidden and attention dropout 0.1
    model = _tune(inner, "bert-train-mode", [_tokens(8), _tokens(12)], batch_sizes=[2])
    parent = torch.nn.ModuleDict({"classifier": model})  # train() reaches the proxy through a parent
    batch = _tokens(10, batch=2)
    with torch.no_grad():
        model(**batch)  # a served call first: the C++ half has a route for this call now
    parent.train()
    assert inner.training and model.training
    with caplog.at_level("WARNING", logger="aitune"):
        torch.manual_seed(1)
        out = model(**batch)
        torch.manual_seed(1)
        expected = inner(**batch)
        model(**batch)
    assert out.logits.requires_grad
    torch.testing.assert_close(out.logits, expected.logits)  # the same dropout masks: it ran eagerly
    torch.nn.functional.cross_entropy(out.logits, torch.tensor([0, 1])).backward()
    assert inner.classifier.weight.grad is not None and inner.classifier.weight.grad.abs().sum() > 0
    assert sum("train mode" in r.getMessage() for r in caplog.records) == 1, caplog.text
    parent.eval()
    with torch.no_grad():
        expected = inner(**batch)
        _no_eager(model, monkeypatch)
        torch.testing.assert_close(model(**batch).logits, expected.logits, **TOL)


def test_train_called_on_the_wrapped_module_itself_is_seen_by_the_cpp_half(monkeypatch):
    """Not through the proxy or a parent: ``inner.train()`` after a call the C++ half has a
    route for (plain positional tensors). Its guard reads the mode per call, so the next call
    runs eagerly (dropout on, gradients), and ``inner.eval()`` brings the graph back, served
    without the eager forward."""
    inner = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 4)).eval()
    model = _tune(inner, "dropout-inner-train", [torch.randn(16) for _ in range(4)], batch_sizes=[2])
    x = torch.randn(2, 16)
    with torch.no_grad():
        model(x)
    assert model._ait_calls.direct is not None, "the C++ half serves this call form now"
    inner.train()
    assert not model.training and inner.training  # the proxy was not told
    torch.manual_seed(3)
    out = model(x)
    torch.manual_seed(3)
    expected = inner(x)
    assert out.requires_grad
    torch.testing.assert_close(out, expected)  # the same dropout mask: it ran eagerly
    assert not torch.allclose(out, inner.eval()(x)), "dropout changed the output"
    inner.train()
    inner.eval()
    with torch.no_grad():
        expected = inner(x)
        _no_eager(model, monkeypatch)
        torch.testing.assert_close(model(x), expected, **TOL)


def test_load_puts_the_module_in_the_mode_it_was_tuned_in(tmp_path, monkeypatch):
    inner = _bert_classifier()
    model = _tune(inner, "bert-mode-saved", [_tokens(8), _tokens(12)], batch_sizes=[2])
    ait.save(model, tmp_path / "bert.ait")
    fresh = transformers.AutoModelForSequenceClassification.from_config(inner.config)  # built in train mode
    assert fresh.training
    loaded = ait.load(ait.Module(fresh, "bert-mode-saved"), tmp_path / "bert.ait")
    assert not fresh.training and not loaded.training
    batch = _tokens(10, batch=2)
    with torch.no_grad():
        expected = inner(**batch)
        with monkeypatch.context() as patch:
            _no_eager(loaded, patch)
            torch.testing.assert_close(loaded(**batch).logits, expected.logits, **TOL)
    loaded.train()
    out = loaded(**batch)
    assert out.logits.requires_grad  # eager: its own weights, with gradients


# -- samples with a batch axis of their own (a tokenizer's return_tensors="pt") -----------


def test_a_forward_refusing_stacked_samples_says_samples_carry_no_batch_axis():
    """tokenizer(text, return_tensors="pt") gives tensors of shape [1, L]: stacked, BERT
    gets [2, 1, L] and fails unpacking its shape, a message that says nothing of why. The
    error (the model's own, unchanged) now carries a note: the batch and the rule."""
    inner = _bert_classifier()
    samples = [transformers.BatchEncoding(_tokens(8, batch=1)) for _ in range(2)]
    model = ait.Module(inner, "bert-batched-samples", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match="too many values to unpack") as caught:
        ait.tune(model, samples, batch_sizes=[2], disable_external_logging=True, progress=False)
    note = "\n".join(getattr(caught.value, "__notes__", []))
    assert "batch of 2 samples" in note and "input_ids: int64[2, 1, 8]" in note, note
    assert "no batch axis" in note and "return_tensors='pt'" in note


# -- a zoo of tiny models, through the user's path (dynamo export, tune, call, save, load) --


def _clip():
    text = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=16)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8)
    model = transformers.CLIPModel(transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    return model, lambda n: {"input_ids": torch.randint(0, 64, (n,)), "pixel_values": torch.randn(3, 32, 32)}


def _wav2vec2():
    config = transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                         conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                         num_conv_pos_embedding_groups=4, vocab_size=32)
    return transformers.Wav2Vec2Model(config), lambda n: {"input_values": torch.randn(50 * n)}


@pytest.mark.parametrize("make", [_clip, _wav2vec2], ids=["clip", "wav2vec2"])
def test_zoo_model_tunes_runs_and_round_trips_a_checkpoint(make, tmp_path):
    torch.manual_seed(0)
    inner, sample = make()
    inner.eval()
    model = ait.Module(inner, "zoo", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [sample(8), sample(12)], ignore_failing_modules=False, disable_external_logging=True,
             progress=False, performance_validation=False)
    assert model.ait_state is ModuleState.TUNED
    call = {k: v[None] for k, v in sample(10).items()}  # a size between the recorded ones
    with torch.no_grad():
        expected = inner(**call)
        _assert_same(model(**call), expected)
        ait.save(model, tmp_path / "zoo.ait")
        fresh, _ = make()
        fresh.load_state_dict(inner.state_dict())
        loaded = ait.load(ait.Module(fresh.eval(), "zoo"), tmp_path / "zoo.ait")
        _assert_same(loaded(**call), expected)


def test_swin_holds_only_the_image_sizes_its_export_took_the_branch_of():
    """torch.export decides Swin's window-padding branch on the example image (32 and 48 wide
    need no padding). Without a guard the ONNX graph returned last_hidden_state [1, 16, 32]
    at 33 where eager gives [1, 25, 32]; the export's conditions now keep that branch in the
    graph's spec: aitune's own crop to 33 lands across them and is not run through the graph
    (it failed the tune before), the graph runs at the recorded sizes and refuses the sizes
    that need padding (run eagerly with eager_fallback)."""
    config = transformers.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                     window_size=4)
    inner = transformers.SwinModel(config).eval()
    model = ait.Module(inner, "swin", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [{"pixel_values": torch.randn(3, 32, 32)}, {"pixel_values": torch.randn(3, 48, 48)}],
             ignore_failing_modules=False, disable_external_logging=True, progress=False)
    assert model.ait_state is ModuleState.TUNED
    with torch.no_grad():
        for size in (32, 48):
            x = torch.randn(2, 3, size, size)
            torch.testing.assert_close(model(pixel_values=x).last_hidden_state,
                                       inner(pixel_values=x).last_hidden_state, atol=1e-4, rtol=1e-4)
        for size in (33, 36):
            with pytest.raises(_core.ShapeMismatchError, match=rf"input_pixel_values \[2, 3, {size}, {size}\] violate"):
                model(pixel_values=torch.randn(2, 3, size, size))
