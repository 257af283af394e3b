"""aitune.serve: tuned checkpoints as Ray Serve deployments (`pip install 'aitune[serve]'`).

`build(checkpoint, ...)` gives the application for `serve.run`; `plan_for` the batching the
engine chooses from the checkpoint's measured latencies; `aitune serve` / `aitune loadtest`
are the command lines. Ray is imported only by the modules that need it (deployment,
ray_instance), so the plan and the codec work without it.
"""
from .codec import BadRequest
from .graph_server import GraphServer
from .plan import plan_for

__all__ = ["BadRequest", "GraphServer", "plan_for", "build"]


def build(*args, **kwargs):
    """The Serve application of a checkpoint (see aitune.serve.deployment.build); needs ray[serve]."""
    from .deployment import build as _build

    return _build(*args, **kwargs)
