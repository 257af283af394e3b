"""ONNXRuntimeBackendConfig: validation, provider enum, key() and describe()."""

from __future__ import annotations

import dataclasses

import pytest

from aitune.torch.backend import BackendConfig, ONNXExecutionProvider, ONNXRuntimeBackend, ONNXRuntimeBackendConfig


def test_provider_enum_is_a_str_enum_with_the_spec_values():
    assert ONNXExecutionProvider.CUDA == "cuda"
    assert ONNXExecutionProvider.TENSORRT == "tensorrt"
    assert ONNXExecutionProvider.CPU == "cpu"
    assert isinstance(ONNXExecutionProvider.CUDA, str)


def test_config_is_a_dataclass_with_the_spec_defaults():
    config = ONNXRuntimeBackendConfig()
    assert isinstance(config, BackendConfig)
    assert dataclasses.is_dataclass(config)
    assert (config.use_dynamo, config.execution_provider, config.opset_version) == (True, None, None)
    assert config.provider is ONNXExecutionProvider.CUDA  # None means CUDA


@pytest.mark.parametrize("text, member", [("cuda", "CUDA"), ("TensorRT", "TENSORRT"), ("cpu", "CPU")])
def test_strings_are_converted_to_the_enum(text, member):
    config = ONNXRuntimeBackendConfig(execution_provider=text)
    assert config.execution_provider is ONNXExecutionProvider[member]


@pytest.mark.parametrize("bad", ["rocm", 3, object()])
def test_other_providers_are_rejected_listing_the_valid_values(bad):
    with pytest.raises(ValueError, match="'cuda', 'tensorrt', 'cpu'"):
        ONNXRuntimeBackendConfig(execution_provider=bad)


@pytest.mark.parametrize("field, bad", [("use_dynamo", "yes"), ("opset_version", 0), ("opset_version", "17")])
def test_other_fields_are_validated(field, bad):
    with pytest.raises(ValueError, match=field):
        ONNXRuntimeBackendConfig(**{field: bad})


def test_key_is_stable_and_equal_for_none_and_cuda():
    default = ONNXRuntimeBackendConfig()
    assert default.key() == ONNXRuntimeBackendConfig(execution_provider=ONNXExecutionProvider.CUDA).key()
    assert default.key() == ONNXRuntimeBackendConfig(execution_provider="cuda").key()
    assert default.key().startswith("ONNXRuntimeBackendConfig_")
    # A fixed value: the key names cache directories, so it must not change between runs.
    assert default.key() == ONNXRuntimeBackendConfig().key()
    others = {
        ONNXRuntimeBackendConfig(use_dynamo=False).key(),
        ONNXRuntimeBackendConfig(execution_provider="tensorrt").key(),
        ONNXRuntimeBackendConfig(execution_provider="cpu").key(),
        ONNXRuntimeBackendConfig(opset_version=18).key(),
    }
    assert default.key() not in others and len(others) == 4


def test_key_does_not_depend_on_the_process(tmp_path):
    import subprocess
    import sys

    code = "from aitune.torch.backend import ONNXRuntimeBackendConfig as C; print(C(opset_version=18).key())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ONNXRuntimeBackendConfig(opset_version=18).key()


def test_describe_shows_only_non_default_fields():
    assert ONNXRuntimeBackendConfig().describe() == "ONNXRuntimeBackendConfig()"
    text = ONNXRuntimeBackendConfig(use_dynamo=False, execution_provider="cpu").describe()
    assert text == "ONNXRuntimeBackendConfig(use_dynamo=False, execution_provider='cpu')"
    assert "opset_version" not in text


def test_backend_defaults_its_config_and_keys_its_directory():
    backend = ONNXRuntimeBackend()
    assert backend.config == ONNXRuntimeBackendConfig()
    assert backend.key() == f"ONNXRuntimeBackend_{ONNXRuntimeBackendConfig().digest()}"
    assert ONNXRuntimeBackend(ONNXRuntimeBackendConfig(execution_provider="cuda")).key() == backend.key()
    with pytest.raises(TypeError):
        ONNXRuntimeBackend({"use_dynamo": False})
