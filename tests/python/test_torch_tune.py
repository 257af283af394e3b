"""ait.tune end to end on the CPU execution provider: export, session, parity with eager."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging

import pytest
import torch
from torch_models import MLP, DictModel, Features, MaskedModel, SmallCNN, cpu_backend, cpu_strategy

import aitune
import aitune.torch as ait
from aitune.torch import ModuleState
from aitune.torch.backend import ONNXRuntimeBackend, ONNXRuntimeBackendConfig, TorchEagerBackend

TOL = {"atol": 1e-4, "rtol": 1e-4}


def _uses_backend(model) -> None:
    """The module really dispatches to ONNX Runtime: the wrapped module must not run."""
    model.ait_module.forward = lambda *a, **k: pytest.fail("eager forward ran on a tuned module")


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_mlp_matches_eager(use_dynamo, cache_dir):
    inner = MLP().eval()
    model = ait.Module(inner, "mlp", strategy=cpu_strategy(use_dynamo=use_dynamo))
    ait.tune(model, [torch.randn(16) for _ in range(4)])
    assert model.ait_state is ModuleState.TUNED
    x = torch.randn(2, 16)
    expected = inner(x)
    _uses_backend(model)
    out = model(x)
    assert isinstance(out, torch.Tensor) and not out.requires_grad
    torch.testing.assert_close(out, expected, **TOL)

    (graph,) = model.ait_graphs
    (backend_dir,) = (cache_dir / "mlp" / graph.key / cpu_backend(use_dynamo=use_dynamo).key()).glob("run-*")
    assert (backend_dir / "model_raw.onnx").is_file()
    config = json.loads((backend_dir / "config.json").read_text())
    assert config["backend"] == "ONNXRuntimeBackend"
    assert config["config"] == {
        "use_dynamo": use_dynamo,
        "execution_provider": "cpu",
        "opset_version": None,
        "tune_provider_options": True,
        "provider_options": None,
        "precision": "any",
        "transformer_fusions": True,
        "allow_trace_warnings": False,
        "fp16_search_seconds": 120.0,
        "in_place_outputs": False,
    }
    assert not list(backend_dir.glob(".export-*"))  # scratch directory gone


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_cnn_with_dynamic_batch_and_two_spatial_sizes(use_dynamo):
    inner = SmallCNN().eval()
    model = ait.Module(inner, "cnn", strategy=cpu_strategy(use_dynamo=use_dynamo))
    samples = [torch.randn(3, 16, 16), torch.randn(3, 16, 16), torch.randn(3, 24, 24), torch.randn(3, 24, 24)]
    ait.tune(model, samples, batch_sizes=[1, 2, 4])
    assert model.ait_state is ModuleState.TUNED
    (graph,) = model.ait_graphs  # one graph, dynamic batch and spatial axes
    spec = graph.graph_spec()
    (image,) = spec.inputs
    assert image.batch_axis == 0
    assert image.dynamic_axes() == [0, 2, 3]
    assert list(image.min_shape) == [1, 3, 16, 16] and list(image.max_shape) == [4, 3, 24, 24]
    references = {size: torch.randn(batch, 3, size, size) for batch, size in [(1, 16), (3, 24), (4, 20)]}
    expected = {size: inner(x) for size, x in references.items()}
    _uses_backend(model)
    for size, x in references.items():
        torch.testing.assert_close(model(x), expected[size], **TOL)


def test_dict_input_and_tuple_with_dataclass_output():
    inner = DictModel().eval()
    model = ait.Module(inner, "dict-model", strategy=cpu_strategy())
    ait.tune(model, [{"inputs": {"image": torch.randn(12), "meta": torch.randn(4)}} for _ in range(2)])
    assert model.ait_state is ModuleState.TUNED
    inputs = {"image": torch.randn(2, 12), "meta": torch.randn(2, 4)}
    expected = inner(inputs)
    _uses_backend(model)
    total, features = model(inputs)
    assert isinstance(features, Features)
    torch.testing.assert_close(total, expected[0], **TOL)
    torch.testing.assert_close(features.embedding, expected[1].embedding, **TOL)
    torch.testing.assert_close(features.pooled, expected[1].pooled, **TOL)


@pytest.mark.parametrize("use_dynamo", [True, False], ids=["dynamo", "trace"])
def test_keyword_only_optional_input_gives_two_graphs(use_dynamo):
    inner = MaskedModel().eval()
    model = ait.Module(inner, "masked", strategy=cpu_strategy(use_dynamo=use_dynamo))
    data = [(torch.randn(8),), ((torch.randn(8),), {"mask": (torch.rand(8) > 0.5).float()})]
    ait.tune(model, data)
    assert model.ait_state is ModuleState.TUNED and len(model.ait_graphs) == 2
    x, mask = torch.randn(2, 8), (torch.rand(2, 8) > 0.5).float()
    expected_plain, expected_masked = inner(x), inner(x, mask=mask)
    _uses_backend(model)
    torch.testing.assert_close(model(x), expected_plain, **TOL)
    torch.testing.assert_close(model(x, mask=mask), expected_masked, **TOL)
    torch.testing.assert_close(model(x=x, mask=None), expected_plain, **TOL)


def test_unused_input_dropped_by_the_trace_exporter_is_handled():
    class IgnoresB(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, a, b):
            return self.fc(a)

    inner = IgnoresB().eval()
    model = ait.Module(inner, strategy=cpu_strategy(use_dynamo=False))
    ait.tune(model, [(torch.randn(4), torch.randn(4))])
    assert model.ait_state is ModuleState.TUNED
    a, b = torch.randn(2, 4), torch.randn(2, 4)
    torch.testing.assert_close(model(a, b), inner(a, b), **TOL)


def test_opset_version_is_passed_to_the_exporter(cache_dir):
    import onnx

    model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy(opset_version=18))
    ait.tune(model, torch.randn(16))
    (path,) = cache_dir.glob("mlp/*/*/run-*/model_raw.onnx")
    opsets = {o.domain: o.version for o in onnx.load(str(path), load_external_data=False).opset_import}
    assert opsets[""] == 18


# -- datasets -------------------------------------------------------------------------


def test_dataset_forms_tensor_dataloader_and_factory():
    from torch.utils.data import DataLoader, TensorDataset

    forms = {
        "tensor": torch.randn(16),
        "dataloader": DataLoader(TensorDataset(torch.randn(6, 16)), batch_size=3),
        "factory": lambda batch_size: [torch.randn(batch_size, 16)],
    }
    for name, dataset in forms.items():
        model = ait.Module(MLP().eval(), name, strategy=cpu_strategy())
        ait.tune(model, dataset)
        assert model.ait_state is ModuleState.TUNED, name
        assert model.ait_graphs[0].graph_spec().batch_sizes == [1, 2], name


def test_max_num_batches_and_device_move():
    model = ait.Module(MLP().eval(), strategy=cpu_strategy())
    ait.tune(model, [torch.randn(16) for _ in range(8)], max_num_batches_per_batch_size=1, dry_run=True)
    assert len(model.ait_graphs[0].samples) == 2  # one batch of size 1, one of size 2


def test_any_callable_that_calls_wrapped_modules_can_be_tuned():
    class Pipeline(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = ait.Module(MLP(16, 32, 12).eval(), "encoder", strategy=cpu_strategy())
            self.decoder = ait.Module(MLP(12, 16, 4).eval(), "decoder", strategy=cpu_strategy())

        def forward(self, x):
            return self.decoder(torch.relu(self.encoder(x)))

    pipeline = Pipeline().eval()
    x = torch.randn(2, 16)
    expected = pipeline(x)
    ait.tune(pipeline, [torch.randn(16)])
    assert pipeline.encoder.ait_state is ModuleState.TUNED and pipeline.decoder.ait_state is ModuleState.TUNED
    torch.testing.assert_close(pipeline(x), expected, **TOL)


class _Generator(torch.nn.Module):
    """A model with a loop method calling itself, as a transformers model's ``generate``."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP(16, 32, 16).eval()

    def forward(self, x):
        return self.mlp(x)

    def generate(self, x, steps=3):
        for _ in range(steps):
            x = self(x)
        return x


def test_a_method_of_the_wrapped_module_calling_it_directly_is_named(caplog):
    # was: "func called no ait.Module: wrap the modules to tune with ait.Module(...)" for a
    # module that was wrapped: wrapper.generate is the wrapped model's, whose self(...)
    # bypasses the ait.Module; nothing said so, and once tuned it would silently run eagerly
    model = ait.Module(_Generator(), "generator", strategy=cpu_strategy())
    with pytest.raises(ValueError, match=r"_Generator that ait.Module 'generator' wraps ran 6 times called directly"):
        ait.tune(lambda x: model.generate(x), [torch.randn(16)], batch_sizes=[1, 2])
    # another ait.Module called through: tuned, and the bypassed one named in a warning
    other = ait.Module(MLP(16, 32, 16).eval(), "other", strategy=cpu_strategy())
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(lambda x: model.generate(other(x)), [torch.randn(16)], batch_sizes=[1], dry_run=True)
    assert other.ait_state is ModuleState.RECORDING
    assert "ait.Module 'generator' wraps ran 3 times called directly" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):  # called through the wrapper: nothing to say
        ait.tune(lambda x: model(other(x)), [torch.randn(16)], batch_sizes=[1], dry_run=True)
    assert "called directly" not in caplog.text


def test_nested_wrapped_modules_export_eagerly():
    inner = ait.Module(MLP().eval(), "inner", strategy=cpu_strategy())
    outer_module = torch.nn.Sequential(inner, torch.nn.Tanh()).eval()
    outer = ait.Module(outer_module, "outer", strategy=cpu_strategy())
    x = torch.randn(2, 16)
    expected = outer(x)
    ait.tune(outer, torch.randn(16))
    assert outer.ait_state is ModuleState.TUNED and inner.ait_state is ModuleState.TUNED
    torch.testing.assert_close(outer(x), expected, **TOL)


# -- failures -------------------------------------------------------------------------


def test_unrecorded_dtype_or_rank_is_a_clear_error_listing_the_recorded_graphs():
    model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy())
    ait.tune(model, torch.randn(16))
    for bad in (torch.randn(2, 16).double(), torch.randn(2, 3, 16)):
        with pytest.raises(ait.GraphNotRecordedError) as info:
            model(bad)
        text = str(info.value)
        assert "mlp" in text and "Recorded graphs" in text and "input_x: float32 rank 2" in text
        assert isinstance(info.value, aitune.InvalidArgumentError) and isinstance(info.value, ValueError)


def test_eager_fallback_runs_unrecorded_calls_with_a_warning():
    inner = MLP().eval()
    model = ait.Module(inner, "mlp", strategy=cpu_strategy(), eager_fallback=True)
    ait.tune(model, torch.randn(16))
    x = torch.randn(2, 3, 16)
    with pytest.warns(RuntimeWarning, match="running eagerly"):
        out = model(x)
    torch.testing.assert_close(out, inner(x))


def test_shape_outside_the_recorded_range_is_reported():
    model = ait.Module(SmallCNN().eval(), "cnn", strategy=cpu_strategy())
    ait.tune(model, torch.randn(3, 16, 16))
    with pytest.raises(aitune.ShapeMismatchError):
        model(torch.randn(1, 3, 32, 32))


def test_input_on_the_wrong_device_is_a_clear_error():
    model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy())
    ait.tune(model, torch.randn(16))
    with pytest.raises(aitune.InvalidArgumentError, match="input_x.*meta.*cpu"):
        model(torch.empty(2, 16, device="meta"))


def test_a_sample_on_the_meta_device_is_refused_naming_it_and_the_module_stays_as_it_was():
    """A meta-device sample failed deep in Tensor.to ("Cannot copy out of meta tensor; no
    data!"), through ignore_failing_modules too, naming neither the sample nor what to do."""
    inner = MLP().eval()
    model = ait.Module(inner, "mlp_meta", strategy=cpu_strategy())
    with pytest.raises(aitune.InvalidArgumentError, match=r"meta device.*no values.*give samples with values"):
        ait.tune(model, [{"x": torch.randn(16, device="meta")}])
    assert model.ait_state is ModuleState.INIT
    x = torch.randn(2, 16)
    torch.testing.assert_close(model(x), inner(x))


def _cuda_available_in_engine() -> bool:
    from aitune import _core

    return _core.OrtRuntime.load().provider_status(_core.ExecutionProvider.CUDA).available


@pytest.mark.skipif("_cuda_available_in_engine()", reason="needs a machine without the CUDA provider")
def test_default_provider_without_gpu_is_a_provider_unavailable_error(caplog):
    model = ait.Module(MLP().eval(), "mlp", strategy=ait.OneBackendStrategy(ONNXRuntimeBackend()))
    with pytest.raises(aitune.ProviderUnavailableError, match="CUDA"):
        ait.tune(model, torch.randn(16), ignore_failing_modules=False)
    assert model.ait_state is ModuleState.PASSTHROUGH

    default = ait.Module(MLP().eval(), "default")  # the default strategy: ORT, provider None = CUDA
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(default, torch.randn(16))
    assert default.ait_state is ModuleState.PASSTHROUGH
    assert "stays eager" in caplog.text and "ProviderUnavailableError" in caplog.text
    x = torch.randn(2, 16)
    torch.testing.assert_close(default(x), default.ait_module(x))


class _DataDependent(torch.nn.Module):
    """Python control flow on a tensor value: torch.export refuses it, tracing records one branch."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        if x.abs().sum() >= 0:  # always true
            return self.fc(x)
        return -x


def test_first_wins_reports_why_dynamo_failed_and_the_trace_backend_wins(caplog):
    inner = _DataDependent().eval()
    # The branch always takes one side: the user accepts the trace's risk (else it is refused,
    # test_semantics_control_flow.py)
    strategy = ait.FirstWinsStrategy([cpu_backend(use_dynamo=True),
                                      cpu_backend(use_dynamo=False, allow_trace_warnings=True)])
    model = ait.Module(inner, "data-dependent", strategy=strategy)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(model, torch.randn(4), disable_external_logging=True)
    assert model.ait_state is ModuleState.TUNED
    assert "use_dynamo=False" in next(iter(model.ait_backends.values()))
    assert "ExportError" in caplog.text and "use_dynamo=False" in caplog.text
    x = torch.randn(2, 4)
    torch.testing.assert_close(model(x), inner(x), **TOL)


def test_failed_export_leaves_no_partial_files_and_suggests_the_trace_exporter(cache_dir):
    model = ait.Module(_DataDependent().eval(), "data-dependent", strategy=cpu_strategy(use_dynamo=True))
    with pytest.raises(ait.ExportError, match="use_dynamo=False"):
        ait.tune(model, torch.randn(4), ignore_failing_modules=False, disable_external_logging=True)
    assert not list(cache_dir.rglob("*.onnx*"))
    assert not list(cache_dir.rglob(".export-*"))


def test_first_wins_falls_back_to_eager_and_lists_every_reason():
    strategy = ait.FirstWinsStrategy([cpu_backend(use_dynamo=True), TorchEagerBackend()])
    model = ait.Module(_DataDependent().eval(), strategy=strategy)
    ait.tune(model, torch.randn(4), disable_external_logging=True)
    assert list(model.ait_backends.values()) == ["TorchEagerBackend"]

    failing = ait.FirstWinsStrategy([cpu_backend(use_dynamo=True)])
    model = ait.Module(_DataDependent().eval(), strategy=failing)
    with pytest.raises(ait.TuningError, match="ONNXRuntimeBackend.*ExportError"):
        ait.tune(model, torch.randn(4), ignore_failing_modules=False, disable_external_logging=True)


def test_eager_outputs_that_cannot_be_reproduced_fail_the_build():
    class Noisy(torch.nn.Module):
        """Differs between recording and the check: eager outputs cannot be reproduced, so
        the tune stops before judging any candidate against them (test_accuracy has more)."""

        def forward(self, x):
            return x + torch.rand_like(x)

    model = ait.Module(Noisy(), strategy=cpu_strategy(use_dynamo=False))
    with pytest.raises(ait.NondeterministicModuleError, match="not deterministic.*output_0.*max abs error"):
        ait.tune(model, torch.randn(64), ignore_failing_modules=False)


def test_retuning_replaces_the_recordings():
    model = ait.Module(MLP().eval(), strategy=cpu_strategy())
    ait.tune(model, torch.randn(16))
    ait.tune(model, torch.randn(3, 16))  # now rank 3 inputs
    assert len(model.ait_graphs) == 1 and model.ait_graphs[0].input_names == ["input_x"]
    model(torch.randn(2, 3, 16))
    with pytest.raises(ait.GraphNotRecordedError):
        model(torch.randn(2, 16))


def test_clear_cache_removes_the_module_directory(cache_dir):
    stale = cache_dir / "mlp" / "old-graph"
    stale.mkdir(parents=True)
    model = ait.Module(MLP().eval(), "mlp", strategy=cpu_strategy())
    ait.tune(model, torch.randn(16), clear_cache=True)
    assert not stale.exists() and list(cache_dir.glob("mlp/graph_*/*/run-*/model_raw.onnx"))


def test_config_json_is_written_even_when_the_export_fails(cache_dir):
    model = ait.Module(_DataDependent().eval(), "dd", strategy=ait.OneBackendStrategy(
        ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cpu"))))
    ait.tune(model, torch.randn(4), disable_external_logging=True)
    assert model.ait_state is ModuleState.PASSTHROUGH
    assert list(cache_dir.glob("dd/*/*/run-*/config.json"))


class _ModelOutputLike(collections.OrderedDict):
    """What Hugging Face's ModelOutput is (an OrderedDict dataclass), without transformers."""

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if getattr(self, field.name) is not None:
                self[field.name] = getattr(self, field.name)


@dataclasses.dataclass
class _ClassifierOutput(_ModelOutputLike):
    logits: torch.Tensor = None
    hidden_states: torch.Tensor | None = None


class _Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None):
        return _ClassifierOutput(logits=self.fc(input_ids * attention_mask[..., None]))


def test_model_output_style_results_are_rebuilt():
    inner = _Classifier().eval()
    model = ait.Module(inner, "classifier", strategy=cpu_strategy())
    ait.tune(model, [{"input_ids": torch.randn(5, 8), "attention_mask": torch.ones(5)}])
    assert model.ait_graphs[0].output_names == ["output_logits"]
    ids, mask = torch.randn(2, 5, 8), torch.ones(2, 5)
    expected = inner(ids, attention_mask=mask)
    _uses_backend(model)
    out = model(input_ids=ids, attention_mask=mask)
    assert type(out) is _ClassifierOutput and out.hidden_states is None and list(out.keys()) == ["logits"]
    torch.testing.assert_close(out.logits, expected.logits, **TOL)


def test_forward_hooks_run_around_the_tuned_backend():
    model = ait.Module(MLP().eval(), strategy=cpu_strategy())
    ait.tune(model, torch.randn(16))
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append("pre"))
    model.register_forward_hook(lambda module, args, output: seen.append(tuple(output.shape)))
    _uses_backend(model)
    model(torch.randn(2, 16))
    assert seen == ["pre", (2, 8)]


def test_module_on_another_device_than_the_provider_fails_before_the_export(monkeypatch, cache_dir):
    monkeypatch.setattr(ONNXRuntimeBackend, "_check_provider", staticmethod(lambda config: None))  # as if a GPU
    model = ait.Module(MLP().eval(), "mlp", strategy=ait.OneBackendStrategy(ONNXRuntimeBackend()))
    with pytest.raises(aitune.InvalidArgumentError, match=r"runs on cpu.*cuda:0.*move the module"):
        ait.tune(model, torch.randn(16), ignore_failing_modules=False)
    assert not list(cache_dir.rglob("*.onnx"))


@pytest.mark.parametrize("tuned_before", [True, False], ids=["tuned", "new"])
def test_a_recording_that_raises_leaves_the_module_as_it_was(tuned_before, cache_dir, monkeypatch):
    """The user's code raises on the second batch of a (re-)tune: ait.tune raises that error,
    and the module is as before the call, not RECORDING with its recordings gone: a tuned
    module keeps serving its graphs, a new one stays INIT and runs eagerly."""
    inner = MLP().eval()
    model = ait.Module(inner, "mlp-record-raises", strategy=cpu_strategy(use_dynamo=False))
    if tuned_before:
        ait.tune(model, [torch.randn(16) for _ in range(4)], batch_sizes=[2], ignore_failing_modules=False,
                 progress=False)
    state, graphs, tuned = model.ait_state, model.ait_graphs, dict(model._ait_tuned)

    def func(x):
        out = model(x)
        if x.shape[0] == 2:
            raise RuntimeError("the user's code refused this batch")
        return out

    with pytest.raises(RuntimeError, match="refused this batch"):
        ait.tune(func, [torch.randn(16) for _ in range(4)], batch_sizes=[1, 2], progress=False)
    assert model.ait_state is state
    assert model.ait_graphs == graphs and model._ait_tuned == tuned
    x = torch.randn(2, 16)  # the tuned graph's batch
    with torch.no_grad():
        expected = inner(x)
        if tuned_before:
            monkeypatch.setattr(inner, "forward", lambda *a, **k: pytest.fail("the eager forward ran"))
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


class _Embedder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 4)

    def forward(self, input_ids):
        return self.embed(input_ids)


def test_samples_of_python_lists_are_named_when_forward_refuses_them():
    """Tokenizer output without return_tensors gives lists of ints, which ait.tune passes to
    forward as they are: the model failed deep inside (an embedding given a list) and the
    note spoke of stacking only. It now names the lists and says to give tensors."""
    model = ait.Module(_Embedder().eval(), "lists", strategy=ait.OneBackendStrategy(cpu_backend()))
    with pytest.raises(TypeError) as failed:
        ait.tune(model, [{"input_ids": [1, 2, 3]}], batch_sizes=[1], ignore_failing_modules=False)
    notes = " ".join(getattr(failed.value, "__notes__", []))
    assert "Python lists of numbers (input_ids)" in notes and "torch.tensor(ids)" in notes, notes


class _BrokenForward(torch.nn.Module):
    def forward(self, x):
        raise AttributeError("'Config' object has no attribute 'num_attention_heads'")


def test_the_stacking_hint_is_given_only_where_ait_tune_stacked_the_samples():
    """A forward that fails on batches a factory made was told "ait.tune stacks samples on
    a new axis 0 ... give batches through a DataLoader or a factory", which it already did
    (a session-31 probe, RWKV's missing config attribute): the hint is for samples ait.tune
    stacked, and the note names the call either way."""
    def notes_of(data) -> str:
        model = ait.Module(_BrokenForward(), "broken", strategy=ait.OneBackendStrategy(cpu_backend()))
        with pytest.raises(AttributeError) as failed:
            ait.tune(model, data, batch_sizes=[2], ignore_failing_modules=False)
        return " ".join(getattr(failed.value, "__notes__", []))

    stacked = notes_of([torch.randn(4) for _ in range(2)])
    assert "raised by func called eagerly with a batch of 2 samples" in stacked and "new axis 0" in stacked
    made = notes_of(lambda size: [torch.randn(size, 4)])
    assert "raised by func called eagerly with a batch of 2 samples" in made and "new axis 0" not in made


class _SparseMask(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.register_buffer("mask", torch.eye(8).to_sparse())

    def forward(self, x):
        return self.fc(x) + torch.sparse.mm(self.mask, x.t()).t()


def test_a_sparse_buffer_leaves_the_module_eager_naming_it():
    """A sparse buffer raised torch's NotImplementedError ("Could not run 'aten::eq.Tensor' with
    arguments from the 'SparseCPU' backend") out of ait.tune while recording, whatever
    ignore_failing_modules said, and the module stayed INIT (a session-37 probe)."""
    model = ait.Module(_SparseMask().eval(), "sparse", strategy=cpu_strategy(tune_provider_options=False))
    ait.tune(model, [torch.randn(8) for _ in range(2)], progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    x = torch.randn(2, 8)
    torch.testing.assert_close(model(x), model.ait_module(x))
    with pytest.raises(ValueError, match=r"holds tensors of a layout other than strided \(mask \(torch.sparse_coo\)\)"):
        ait.tune(ait.Module(_SparseMask().eval(), "sparse2", strategy=cpu_strategy(tune_provider_options=False)),
                 [torch.randn(8) for _ in range(2)], progress=False, ignore_failing_modules=False)


class _Autoencoder(torch.nn.Module):
    """diffusers' AutoencoderKL's shape: ``decode`` runs submodules, never ``forward``."""

    def __init__(self):
        super().__init__()
        self.post_quant = torch.nn.Linear(16, 16)
        self.decoder = MLP(16, 32, 16)

    def decode(self, z):
        return self.decoder(self.post_quant(z))

    def forward(self, z):
        return self.decode(z)


def test_a_method_running_the_wrapped_modules_submodules_is_named(caplog):
    """``pipeline.vae.decode(z)`` through an ait.Module runs the wrapped module's submodules and
    never its forward: with another module tuned, the VAE stayed untuned without a word; alone,
    "func called no ait.Module: wrap the modules" named a module that was wrapped (a session-37
    probe)."""
    vae = ait.Module(_Autoencoder().eval(), "vae", strategy=cpu_strategy())
    with pytest.raises(ValueError, match=r"ait.Module 'vae' wraps ran its submodules outside its forward \(4 calls, "
                                         r"'post_quant' first\)"):
        ait.tune(lambda z: vae.decode(z), [torch.randn(16)], batch_sizes=[1, 2])
    other = ait.Module(MLP(16, 32, 16).eval(), "unet", strategy=cpu_strategy())
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(lambda z: vae.decode(other(z)), [torch.randn(16)], batch_sizes=[1], dry_run=True)
    assert "ait.Module 'vae' wraps ran its submodules outside its forward" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):  # forward through the wrapper: nothing to say
        ait.tune(lambda z: vae(other(z)), [torch.randn(16)], batch_sizes=[1], dry_run=True)
    assert "outside its forward" not in caplog.text


class _OptionalBranch:
    """A pipeline whose second encoder runs only for some inputs (img2img beside txt2img)."""

    def __init__(self):
        torch.manual_seed(0)
        self.main = ait.Module(MLP(16, 32, 16).eval(), "main-branch", strategy=cpu_strategy())
        self.image_encoder = ait.Module(MLP(16, 32, 16).eval(), "image-encoder", strategy=cpu_strategy())

    def __call__(self, x, image=None):
        with torch.no_grad():
            return self.main(x if image is None else x + self.image_encoder(image))


def test_a_wrapped_module_the_data_never_reaches_is_named(caplog):
    """An optional branch the tuning data never took left its ait.Module untuned without a
    word, and ait.save then refused the pipeline with "tune it (ait.tune)" (a session-37
    probe). ait.tune names it, whether func is the pipeline, a lambda over it or its method."""
    pipeline = _OptionalBranch()
    for func in (pipeline, lambda x: pipeline(x), pipeline.__call__):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="aitune"):
            ait.tune(func, [torch.randn(16)], batch_sizes=[1], dry_run=True)
        assert "ait.Module 'image-encoder' of func was not called while ait.tune ran it" in caplog.text
        assert "'main-branch'" not in caplog.text


class _GrowingCache(torch.nn.Module):
    """A decoder step that concatenates onto a cache which starts empty."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x, past):
        cache = torch.cat([past, self.fc(x)[:, None]], 1)
        return cache.mean(1), cache


def test_a_call_with_an_empty_tensor_is_refused_before_any_export_naming_the_remedy():
    """A cache that starts empty (length 0) was recorded into the graph of the later steps; every
    candidate then failed after the export ("aitune runs no tensor of 0 elements") and nothing
    said what to do (a session-37 probe)."""
    model = ait.Module(_GrowingCache().eval(), "growing-cache", strategy=cpu_strategy())
    samples = [((torch.randn(16), torch.randn(n, 16)), {}) for n in (0, 1, 2)]
    with pytest.raises(ait.TuningError, match=r"1 of the \d+ recorded calls give an empty tensor \('input_past' "
                                              r"\[1, 0, 16\] in call 0\).*Pass None for it on the first step"):
        ait.tune(model, samples, batch_sizes=[1], ignore_failing_modules=False, progress=False)
