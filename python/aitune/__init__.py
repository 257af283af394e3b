"""aitune: tune PyTorch models for inference through ONNX Runtime, with a C++ engine.

`aitune.torch` is the PyTorch front end; this package re-exports the engine's error
types so that callers can catch them without touching the extension module. On import it
tells the engine where the onnxruntime / onnxruntime-gpu wheel and the pip CUDA libraries
are (aitune._ort_wheel), so that ONNX Runtime loads from the wheel.
"""
from aitune import _core, _ort_wheel
from aitune._core import (  # noqa: F401
    AituneError,
    AituneIOError,
    BackendUnavailableError,
    CheckpointCorruptError,
    CudaGraphCaptureError,
    DTypeMismatchError,
    InternalError,
    InvalidArgumentError,
    ModelInvalidError,
    OutOfMemoryError,
    ProviderUnavailableError,
    ShapeMismatchError,
    StateError,
    UnsupportedDTypeError,
    __version__,
)

_ort_wheel.register(_core)
