"""aitune: tune PyTorch models for inference through ONNX Runtime, with a C++ engine.

`aitune.torch` is the PyTorch front end; this package re-exports the engine's error
types so that callers can catch them without touching the extension module.
"""
from aitune._core import (  # noqa: F401
    AituneError,
    AituneIOError,
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
    __version__,
)
