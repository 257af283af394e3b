"""Model families a probe (session 16) tuned for the first time: BART, DeiT with its
distillation token, SegFormer, DINOv2, LeViT, DeBERTa-v2, Longformer, BigBird, Mamba,
HuBERT, AST, and inputs and outputs of unusual dtypes and layouts. What it found broken,
each with a test that failed before the fix; tiny random configurations, nothing is
downloaded."""

from __future__ import annotations

import logging

import pytest
import torch
from torch_models import cpu_strategy

import aitune.torch as ait
from aitune.torch import ModuleState

transformers = pytest.importorskip("transformers")


def _quick_profile():
    """Warm-up and one short window per candidate: these tests check what a tune decides and says."""
    from aitune import _core

    profile = _core.ProfileConfig()
    profile.warmup_calls, profile.window_calls, profile.stable_windows, profile.max_windows = 2, 5, 1, 1
    return profile


def _tune(inner: torch.nn.Module, name: str, samples, **kwargs) -> ait.Module:
    """Tuned with the trace exporter (fast) on the CPU provider, one candidate."""
    model = ait.Module(inner, name, strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    ait.tune(model, samples, ignore_failing_modules=False, disable_external_logging=True, progress=False,
             performance_validation=False, profile_config=_quick_profile(), **kwargs)
    assert model.ait_state is ModuleState.TUNED
    assert all("ONNXRuntimeBackend" in b for b in model.ait_backends.values()), model.ait_backends
    return model


# -- transformers' own output-capturing hooks are not the user's hooks ---------------------


def test_transformers_output_capturing_hooks_are_not_named_as_the_users_hooks(caplog):
    """transformers 5 installs forward hooks on its layers the first time a call asks for
    hidden states (output_hidden_states=True, or a head such as SegFormer's that asks its
    base model): they only collect layer outputs into the ModelOutput, which the graph
    returns. Tuning warned that 'forward hooks on submodules' would lose their effects,
    naming install_output_capuring_hook, and told the user to move hooks they never
    registered. The hidden states still come back right; a hook of the user's on a
    submodule is still named."""
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    inner = transformers.BertModel(config).eval()
    samples = [{"input_ids": torch.randint(0, 100, (8,)), "output_hidden_states": True} for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="aitune"):
        model = _tune(inner, "bert-hidden-states", samples)
    assert "forward hooks on submodules" not in caplog.text, caplog.text
    call = {"input_ids": torch.randint(0, 100, (2, 8)), "output_hidden_states": True}
    with torch.no_grad():
        got, expected = model(**call), inner(**call)
    assert len(got.hidden_states) == len(expected.hidden_states) == 2
    for a, e in zip(got.hidden_states, expected.hidden_states):
        torch.testing.assert_close(a, e, atol=1e-4, rtol=1e-4)

    seen = []
    inner.encoder.layer[0].register_forward_hook(lambda *_: seen.append(1))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        _tune(inner, "bert-user-hook", samples)
    assert "forward hooks on submodules" in caplog.text and "encoder.layer.0: " in caplog.text
    assert "install_output_capuring_hook" not in caplog.text


# -- an export specialised to its example's length says so (Mamba's slow path) -------------


class _Scan(torch.nn.Module):
    """A Python loop over the sequence, as Mamba's slow path scans its state: torch.export
    unrolls it for the example's length and declares that length on the output, while the
    input stays dynamic."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        state, states = torch.zeros_like(h[:, 0]), []
        for i in range(x.shape[1]):
            state = state * 0.5 + h[:, i]
            states.append(state)
        return torch.stack(states, 1)


def test_a_graph_specialised_to_one_length_names_the_sample_and_the_fixed_size():
    """A tiny Mamba failed the tune with ONNX Runtime's 'Gather node ... indices element out
    of data bounds, idx=15 must be within [-8,7]' and nothing else: not which sample, nor
    that the export had fixed the length. The failure now names the sample and its input
    shapes, and the size the exported model fixes where the samples vary."""
    from aitune.torch.graph_tuning import TuningError

    inner = _Scan().eval()
    model = ait.Module(inner, "scan", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(TuningError) as caught:
        ait.tune(model, [torch.randn(n, 4) for n in (3, 6, 4)], ignore_failing_modules=False,
                 disable_external_logging=True, progress=False, performance_validation=False)
    message = str(caught.value)
    assert "indices element out of data bounds" in message  # ONNX Runtime's own words are kept
    assert "sample " in message and "; input_x [" in message, message
    assert "the exported model fixes sizes the recorded samples vary (output_0 axis 1 is 6 in the model, " \
           "3..6 in the samples)" in message, message
    assert model.ait_state is ModuleState.PASSTHROUGH
    x = torch.randn(2, 5, 4)
    with torch.no_grad():
        torch.testing.assert_close(model(x), inner(x))


def test_a_failing_run_prints_nothing_of_onnx_runtimes_own(capfd):
    """The failed run above also printed ONNX Runtime's own log line to stderr, in red
    ('[E:onnxruntime:, sequential_executor.cc:677 ExecuteKernel] Non-zero status code ...'),
    with disable_external_logging=True, and in a tune that goes on to choose another
    candidate: the failure is already the candidate's reason, with ORT's message. Runs log
    at FATAL only; the message still reaches the caller."""
    from aitune.torch.graph_tuning import TuningError

    model = ait.Module(_Scan().eval(), "scan-quiet", strategy=cpu_strategy(tune_provider_options=False))
    capfd.readouterr()
    with pytest.raises(TuningError, match="indices element out of data bounds"):
        ait.tune(model, [torch.randn(n, 4) for n in (3, 6, 4)], ignore_failing_modules=False,
                 disable_external_logging=True, progress=False, performance_validation=False)
    out, err = capfd.readouterr()
    assert "onnxruntime" not in out + err and "Non-zero status code" not in out + err, (out + err)[:500]


# -- tensors of a dtype no graph carries are refused by name ------------------------------


class _Spectrum(torch.nn.Module):
    def forward(self, x):
        return torch.fft.rfft(x, dim=-1)


class _ComplexIn(torch.nn.Module):
    def forward(self, z, scale):
        return torch.view_as_real(z).sum(-1) * scale


def test_a_complex_output_or_input_is_refused_naming_the_module_and_the_tensor(caplog):
    """torch.fft returns complex64: the tune failed deep in the engine with
    "InvalidArgumentError: unknown dtype 'complex64'; valid dtypes: ...", naming neither the
    module nor the tensor, and under the default ignore_failing_modules only that was logged.
    The recording now refuses it, naming the tensor and what to return instead; the module
    stays eager and keeps working."""
    model = ait.Module(_Spectrum(), "spectrum", strategy=cpu_strategy(tune_provider_options=False))
    with pytest.raises(ValueError, match=r"ait.Module 'spectrum': output_0 is a complex64 tensor, .*view_as_real"):
        ait.tune(model, [torch.randn(8) for _ in range(2)], ignore_failing_modules=False,
                 disable_external_logging=True, progress=False)
    assert model.ait_state is ModuleState.PASSTHROUGH
    x = torch.randn(2, 8)
    torch.testing.assert_close(model(x), torch.fft.rfft(x, dim=-1))

    model = ait.Module(_ComplexIn(), "complex-in", strategy=cpu_strategy(tune_provider_options=False))
    samples = [(torch.randn(4, dtype=torch.complex64), torch.randn(4)) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="aitune"):
        ait.tune(model, samples, disable_external_logging=True, progress=False)  # ignore_failing_modules: logged
    assert model.ait_state is ModuleState.PASSTHROUGH
    assert "input_z is a complex64 tensor" in caplog.text, caplog.text


# -- ait.inspect under generate finds an encoder-decoder's encoder ------------------------


def _tiny_bart():
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64, eos_token_id=2, pad_token_id=1,
                                     forced_eos_token_id=None)
    model = transformers.BartForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = None  # every call generates max_new_tokens
    return model


def test_inspect_under_generate_lists_the_encoder_the_loop_calls_itself():
    """generate() calls BART's encoder once, then the decoder steps through the model's
    forward. ait.inspect listed the model alone ('outermost only': the encoder is inside it),
    at a third of the total time, so the encoder, whose calls are no part of the model's,
    could not be found for ait.wrap. It is listed now with its own calls; submodules called
    only inside a forward still are not. Wrapped and tuned through generate, the tokens are
    eager's."""
    bart = _tiny_bart()
    samples = [{"input_ids": torch.randint(3, 100, (n,))} for n in (8, 12)]

    def generate(input_ids):
        return bart.generate(input_ids=input_ids, max_new_tokens=3, do_sample=False)

    info = ait.inspect(bart, samples, inference_function=generate, number_of_iterations=2, warmup_iterations=0)
    by_path = {m.object_path: m for m in info.get_modules()}
    assert sorted(by_path) == ["", "model.encoder"], info.table()
    assert by_path["model.encoder"].execution_count == 2 and by_path[""].execution_count == 2 * 3
    assert sum(info.share(m) for m in by_path.values()) <= 1.0
    with pytest.raises(ValueError, match="inside another module being wrapped"):
        ait.wrap(bart, list(by_path.values()))

    x = torch.randint(3, 100, (2, 10))
    with torch.no_grad():
        expected = generate(x)
    ait.wrap(bart, [by_path["model.encoder"]], strategy=cpu_strategy(use_dynamo=False, tune_provider_options=False))
    assert isinstance(bart.model.encoder, ait.Module)
    ait.tune(generate, samples, ignore_failing_modules=False, disable_external_logging=True, progress=False,
             performance_validation=False, profile_config=_quick_profile())
    assert bart.model.encoder.ait_state is ModuleState.TUNED
    with torch.no_grad():
        assert torch.equal(generate(x), expected)


# -- an encoder-decoder's attention_mask leaves out the encoder's padded positions only ------


class _Seq2Seq(torch.nn.Module):
    """An encoder-decoder called as transformers' are; its exported graph is wrong at the
    decoder positions that share an index with the source's padding (only there)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.head = torch.nn.Linear(8, 6)

    def forward(self, input_ids, attention_mask, decoder_input_ids):
        encoder = self.embed(input_ids) * attention_mask[..., None]
        logits = self.head(self.embed(decoder_input_ids) + encoder.mean(1, keepdim=True))
        if torch.jit.is_tracing():  # the graph differs from eager where the source is padded
            logits = logits + (1 - attention_mask[..., None]) * 5.0
        return {"logits": logits, "encoder_last_hidden_state": encoder}


def test_an_encoder_decoders_attention_mask_does_not_hide_the_decoders_positions():
    """BART-style calls with source and target of one length (both padded to max_length):
    the derived rule applied the encoder's attention_mask to the decoder's logits as well,
    since its shape prefixes theirs, so the logits at the source's padded positions (which
    the decoder defines) were left out and a graph wrong there alone was accepted (a tiny BART
    said '6 of 16 positions undefined by attention_mask, left out': 3 of them the logits').
    The encoder's mask now covers the encoder's outputs only; decoder_attention_mask, where
    given, the decoder's."""
    from aitune.torch.backend.onnx_runtime_backend import NumericMismatchError

    def call(pad: int):
        mask = torch.ones(8, dtype=torch.long)
        mask[8 - pad:] = 0
        return {"input_ids": torch.randint(0, 50, (8,)), "attention_mask": mask,
                "decoder_input_ids": torch.randint(0, 50, (8,))}

    model = ait.Module(_Seq2Seq().eval(), "seq2seq",
                       strategy=cpu_strategy(use_dynamo=False, allow_trace_warnings=True, tune_provider_options=False))
    with pytest.raises(NumericMismatchError, match="output_logits"):
        ait.tune(model, [call(3), call(2)], batch_sizes=[1], ignore_failing_modules=False,
                 disable_external_logging=True, progress=False, performance_validation=False)

    from aitune.torch.valid_positions import masks_for

    args = {**{k: v[None] for k, v in call(3).items()}}
    outputs = [torch.zeros(1, 8, 6), torch.zeros(1, 8, 8)]
    masks, source = masks_for(None, args, outputs, "here", ["output_logits", "output_encoder_last_hidden_state"])
    assert masks[0] is None and masks[1] is not None and int(masks[1].sum()) == 5 and source == "attention_mask"
    args["decoder_attention_mask"] = torch.ones(1, 8, dtype=torch.long)
    args["decoder_attention_mask"][0, 7] = 0
    masks, source = masks_for(None, args, outputs, "here", ["output_logits", "output_encoder_last_hidden_state"])
    assert int(masks[0].sum()) == 7 and int(masks[1].sum()) == 5
    assert source == "attention_mask and decoder_attention_mask"
