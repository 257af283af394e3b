"""The Ray Serve deployment of a checkpoint: one GraphServer per replica, requests batched by @serve.batch."""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import numpy as np
from ray import serve
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from . import codec
from .codec import BadRequest
from .graph_server import GraphServer, Request, RunFailed

logger = logging.getLogger("ray.serve")

#: The deployment's name in its application (and in a written config file).
DEPLOYMENT_NAME = "AituneModel"


class AituneModel:
    """One replica: loads the checkpoint through the C++ loader, checks each request on its
    own (a bad one gets a 4xx and never joins a batch), and runs the rest in batches.
    Batching comes from `user_config` ({"max_batch_size", "batch_wait_timeout_s"}), so a
    config file can change it without a new deployment."""

    def __init__(self, checkpoint: str, device: str | None = None, intra_op_threads: int = 0):
        import ray

        self.server = GraphServer(checkpoint, device=device, intra_op_threads=intra_op_threads)
        context = serve.get_replica_context()
        # The replica's actor name in the "serve" namespace: clients and tests can tell replicas apart.
        self.replica = context.replica_id.to_full_id_str() if context else str(os.getpid())
        gpu_ids = ray.get_gpu_ids() if ray.is_initialized() else []
        self.devices = {k: s.device for k, s in self.server.sessions.items()}
        # Logged so that one replica per GPU can be checked in the replicas' logs.
        logger.info("aitune replica %s: pid %d, ray gpu ids %s, CUDA_VISIBLE_DEVICES=%s, sessions on %s",
                    self.replica, os.getpid(), gpu_ids, os.environ.get("CUDA_VISIBLE_DEVICES"), self.devices)
        self.gpu_ids = [str(g) for g in gpu_ids]
        self.batches = 0
        self.batching: dict[str, Any] = {}

    def reconfigure(self, config: dict[str, Any]) -> None:
        self.batching = dict(config)
        if "max_batch_size" in config:
            self._batched.set_max_batch_size(int(config["max_batch_size"]))
        if "batch_wait_timeout_s" in config:
            self._batched.set_batch_wait_timeout_s(float(config["batch_wait_timeout_s"]))

    @serve.batch(max_batch_size=1, batch_wait_timeout_s=0.0)
    async def _batched(self, requests: list[Request]) -> list[tuple[dict[str, np.ndarray], int]]:
        self.batches += 1
        outputs = self.server.run_batch(requests)
        return [(o, len(requests)) for o in outputs]

    async def infer(self, inputs: dict[str, np.ndarray], graph: str | None = None) -> dict[str, np.ndarray]:
        """For deployment handles (composition): named arrays in, named arrays out;
        BadRequest for inputs the graph refuses."""
        outputs, _ = await self._batched(self.server.check(inputs, graph))
        if isinstance(outputs, RunFailed):
            raise BadRequest(outputs.message, status=outputs.status)
        return outputs

    def info(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "pid": os.getpid(),
            "gpu_ids": self.gpu_ids,
            "devices": self.devices,
            "graphs": {k: {"inputs": [{"name": t.name, "dtype": t.dtype, "min_shape": list(t.min_shape),
                                      "max_shape": list(t.max_shape), "batch_axis": t.batch_axis}
                                     for t in spec.inputs],
                           "outputs": [t.name for t in spec.outputs],
                           # the call it was recorded from (non-tensor values: `pooled=True`), and
                           # whether requests share a call (GraphSpec.batch_rows)
                           "recorded": self.server.recorded.get(k, ""),
                           "batch_rows": spec.batch_rows, "batch_rows_reason": spec.batch_rows_reason}
                       for k, spec in self.server.specs.items()},
            "not_served": self.server.unserved,
            "batching": self.batching,
            "batches_run": self.batches,
        }

    async def __call__(self, http: HttpRequest) -> Response:
        headers = {"X-Aitune-Replica": self.replica}
        if http.method == "GET":
            return Response(json.dumps(self.info()), media_type=codec.JSON, headers=headers)
        if http.method != "POST":  # a PUT or DELETE is no inference call ("body is not JSON" said it was)
            return Response(json.dumps({"error": f"method {http.method} is not allowed: POST a request, GET the "
                                                 "graphs"}),
                            status_code=405, media_type=codec.JSON, headers={**headers, "Allow": "GET, POST"})
        started = time.perf_counter()
        try:
            body = await http.body()
            content_type = http.headers.get("content-type", codec.JSON)
            inputs = codec.decode(body, content_type, http.query_params, self.server.single_input())
            request = self.server.check(inputs, http.query_params.get("graph"), from_json=codec.is_json(content_type))
        except BadRequest as error:  # refused before it joined a batch: a batch of 0
            return Response(json.dumps({"error": str(error)}), status_code=error.status, media_type=codec.JSON,
                            headers=_timed(headers, 0, started))
        outputs, batch = await self._batched(request)
        if isinstance(outputs, RunFailed):  # this request alone: the others of its batch were answered
            return Response(json.dumps({"error": outputs.message}), status_code=outputs.status,
                            media_type=codec.JSON, headers=_timed(headers, batch, started))
        payload, media = codec.encode(outputs, http.headers.get("accept", codec.JSON))
        return Response(payload, media_type=media, headers=_timed(headers, batch, started))


def _timed(headers: dict, batch: int, started: float) -> dict:
    """``headers`` with the batch the request shared (0: refused before it joined one) and
    the server's time on it: every answer carries them (docs/serving.md)."""
    return {**headers, "X-Aitune-Batch": str(batch), "X-Aitune-Server-Ms": f"{(time.perf_counter() - started) * 1e3:.3f}"}


def deployment_options(num_replicas: int = 1, num_cpus: float = 1.0, num_gpus: float = 0.0, max_batch_size: int = 1,
                       batch_wait_timeout_s: float = 0.0, autoscaling: dict | None = None) -> dict[str, Any]:
    """The deployment's options: resources per replica, replicas (or autoscaling), and the
    batching as user_config. max_ongoing_requests leaves room for two batches, so that a
    batch fills while the previous one runs."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
        "max_ongoing_requests": max(8, 2 * max_batch_size),
        "user_config": {"max_batch_size": max_batch_size, "batch_wait_timeout_s": batch_wait_timeout_s},
    }
    if autoscaling:
        options["autoscaling_config"] = autoscaling
    else:
        options["num_replicas"] = num_replicas
    return options


def build(checkpoint: str, device: str | None = None, intra_op_threads: int = 0, **options):
    """The Serve application: `serve.run(build(...))`."""
    deployment = serve.deployment(name=DEPLOYMENT_NAME)(AituneModel).options(**deployment_options(**options))
    return deployment.bind(os.path.abspath(checkpoint), device, intra_op_threads)


def app_builder(args: dict[str, Any]):
    """The config file's import_path target: args {checkpoint, device, intra_op_threads}; the
    deployment's options come from the config file's deployments entry."""
    deployment = serve.deployment(name=DEPLOYMENT_NAME)(AituneModel)
    return deployment.bind(args["checkpoint"], args.get("device"), int(args.get("intra_op_threads", 0)))
