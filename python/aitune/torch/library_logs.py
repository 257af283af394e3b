"""What the libraries aitune drives log (onnxscript's optimizer), routed into aitune's own logger."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

logger = logging.getLogger("aitune.torch")

#: Loggers of libraries whose messages during an export or a transform are notes about
#: their own work, nothing a user can act on: onnxscript's constant folder warns
#: "Evaluation failed: cannot reshape array ..." when it cannot pre-compute a node (the
#: node then simply stays in the graph). Without a handler of the user's they reached the
#: terminal through Python's last-resort handler. torch's exporter registers its
#: torchvision ops on every export and, where torchvision is not installed, warns
#: "torchvision is not installed. Skipping torchvision::nms" (four lines an export) through
#: torch's own handler: a model that uses no torchvision op has no use for it.
#: onnxruntime.transformers' optimizer warns "Unsupported model type: roberta for optimization,
#: directly return model." where it has no fusions for a model (the candidate then simply
#: has none, which its report says).
ROUTED = ("onnxscript", "torch.onnx._internal.exporter._registration", "onnxruntime.transformers")


class _ToAitune(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        logger.debug("%s: %s", record.name, record.getMessage())


#: Modules whose numpy floating-point warnings during an export or a transform are the
#: same kind of note, not shown: the constant folder evaluates nodes with ONNX's reference evaluator,
#: whose numpy warns "divide by zero encountered in log" where a folded constant is log(0)
#: (T5's relative position buckets), a value the graph then holds as -inf like eager does.
ROUTED_WARNINGS = r"onnx\.reference(\.|$)"


@contextlib.contextmanager
def routed_to_aitune() -> Iterator[None]:
    """While the block runs, the ``ROUTED`` loggers' records go to the ``aitune.torch``
    logger at DEBUG instead of propagating (to the root logger or the last resort), and
    the RuntimeWarnings of the ``ROUTED_WARNINGS`` modules are not shown; other warnings
    are shown as the user's filters say."""
    handler = _ToAitune()
    saved = []
    for name in ROUTED:
        library = logging.getLogger(name)
        saved.append((library, library.propagate))
        library.addHandler(handler)
        library.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=ROUTED_WARNINGS)
            yield
    finally:
        for library, propagate in saved:
            library.removeHandler(handler)
            library.propagate = propagate
