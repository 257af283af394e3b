"""A checkpoint's graphs served from one process: requests checked, grouped, run, split."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import numpy as np

from aitune import _core

from .codec import BadRequest

logger = logging.getLogger("aitune")

#: Key of aitune.torch's entry in a checkpoint's metadata (aitune.torch.checkpoint.METADATA_KEY).
TORCH_METADATA_KEY = "aitune.torch"


def unserved_graphs(manifest) -> dict[str, str]:
    """Graphs ait.save kept outside ONNX Runtime (eager, torch.compile): they need the user's
    nn.Module, so a server of the checkpoint alone cannot run them. key -> what they are:
    the manifest's graphs of another section than onnxruntime, and those older checkpoints
    listed in the metadata (format 1 and 2)."""
    kinds = {_core.EAGER_BACKEND_NAME: "runs eagerly", _core.TORCH_COMPILE_BACKEND_NAME: "torch.compile"}
    out = {g.key: kinds.get(g.backend, g.backend) for g in manifest.graphs
           if g.backend != _core.ONNX_RUNTIME_BACKEND_NAME}
    try:
        ours = json.loads(manifest.metadata_json).get(TORCH_METADATA_KEY) or {}
    except (ValueError, AttributeError):
        return out
    for field, kind in (("eager_graphs", "runs eagerly"), ("compiled_graphs", "torch.compile")):
        for entry in ours.get(field) or []:
            if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                out[entry["key"]] = kind
    return out


def _recorded_call(structure_json: str) -> str:
    """The "recorded" description aitune.torch keeps in a graph's structure ("" without one:
    a checkpoint of an ONNX model, or one written before it was kept)."""
    try:
        structure = json.loads(structure_json)
    except (ValueError, RecursionError):
        return ""
    recorded = structure.get("recorded") if isinstance(structure, dict) else None
    return recorded if isinstance(recorded, str) else ""


@dataclass
class RunFailed:
    """A request the checks let through but the model refused when run (``run_batch``'s
    answer for it): 422 for what the engine calls an invalid argument (a token id out of
    the vocabulary, inputs whose lengths disagree), 500 for anything else."""

    message: str
    status: int

    @classmethod
    def of(cls, error: Exception) -> RunFailed:
        status = 422 if isinstance(error, _core.InvalidArgumentError) else 500
        logger.warning("a request failed when run (%d): %s: %s", status, type(error).__name__, error)
        return cls(f"{type(error).__name__}: {error}", status)


@dataclass
class Request:
    """One checked request: its graph and its inputs in the graph's input order."""

    graph: str
    arrays: list[np.ndarray]


class GraphServer:
    """Opens every ONNX Runtime graph of a checkpoint (C++ loader, verified) in sessions
    and runs batches of checked requests. `device` "cpu" serves on the CPU whatever the
    checkpoint was tuned on; None keeps the saved provider (device id 0: the one GPU a
    replica with num_gpus=1 sees)."""

    def __init__(self, checkpoint: str, device: str | None = None, intra_op_threads: int = 0):
        self.checkpoint = _core.Checkpoint.load(os.fspath(checkpoint))
        overrides = _core.CheckpointBackendOverrides()
        if device == "cpu":
            overrides.provider = _core.ExecutionProvider.CPU
        elif device is not None:
            overrides.device_id = 0 if device == "cuda" else int(device.split(":")[1])
        self.specs: dict[str, object] = {}
        self.sessions: dict[str, object] = {}
        for key in self.checkpoint.graph_keys():
            if not self.checkpoint.runs_in_engine(key):
                continue  # an eager or torch.compile graph (unserved_graphs)
            graph = self.checkpoint.graph(key)
            config = self.checkpoint.backend_config(key, overrides)
            if intra_op_threads:
                config.intra_op_threads = intra_op_threads
            self.sessions[key] = _core.OnnxSession.create(self.checkpoint.model_path(key), config, graph.graph_spec)
            self.specs[key] = graph.graph_spec
        for key, spec in self.specs.items():
            if any(t.batch_axis is not None for t in spec.inputs) and (why := _core.requests_apart_reason(spec)):
                logger.warning("checkpoint %s: graph %s serves each request in a call of its own: %s", checkpoint,
                               key, why)
        self.unserved = unserved_graphs(self.checkpoint.manifest)
        if self.unserved:
            logger.warning("checkpoint %s: graphs not served (they need the nn.Module): %s", checkpoint,
                           ", ".join(f"{k} ({v})" for k, v in self.unserved.items()))
        if not self.sessions:
            raise _core.InvalidArgumentError(f"checkpoint {checkpoint} has no ONNX Runtime graph to serve")
        self.session_inputs = {k: [io.name for io in s.inputs] for k, s in self.sessions.items()}
        # per graph, the call it was recorded from as the front end described it (its
        # non-tensor values: `pooled=True`), where the checkpoint holds one
        self.recorded = {k: _recorded_call(self.checkpoint.graph(k).structure_json) for k in self.sessions}

    def input_names(self, graph: str) -> list[str]:
        return [t.name for t in self.specs[graph].inputs]

    def single_input(self) -> str | None:
        """The input name a one-array body (.npy, raw bytes) is for, when every graph has one input of that name."""
        names = {tuple(self.input_names(k)) for k in self.specs}
        return next(iter(names))[0] if len(names) == 1 and len(next(iter(names))) == 1 else None

    def check(self, inputs: dict[str, np.ndarray], graph: str | None = None, from_json: bool = False) -> Request:
        """The request checked against a graph's spec (the one named, else the one whose
        inputs it names); BadRequest (422 for a tensor the graph refuses) otherwise.
        ``from_json``: the arrays came from a JSON body, whose dtypes a wrong one may be fixed by."""
        keys = [graph] if graph is not None else list(self.specs)
        if graph is not None and graph not in self.specs:
            raise BadRequest(f"no graph '{graph}' in the checkpoint; it has: {', '.join(self.specs)}", status=404)
        tensors = []
        for name, array in inputs.items():
            if not isinstance(array, np.ndarray):
                raise BadRequest(f"input '{name}' is not an array")
            tensors.append((name, array.dtype.name, list(array.shape)))
        if len(keys) > 1:  # several call structures: the one whose input names the request gives
            named = [k for k in keys if set(self.input_names(k)) == set(inputs)]
            if len(named) > 1:  # and of those, the one whose spec takes the tensors
                taking = [k for k in named if self._takes(k, tensors)]
                if len(taking) > 1:
                    # Graphs of one module told apart by a non-tensor argument (`pooled=True`)
                    # take the same tensors: picking one would answer for the other silently.
                    raise BadRequest(
                        f"the request fits {len(taking)} graphs, which take the same inputs: "
                        + "; ".join(f"{k} ({self.recorded.get(k) or 'recorded call not saved'})" for k in taking)
                        + ". Name one with ?graph=KEY (the deployment's handle: infer(inputs, graph=KEY))",
                        status=400)
                named = taking or named
            keys = named[:1] or keys[:1]
        key = keys[0]
        try:
            order = _core.check_request(self.specs[key], tensors)
        except _core.DTypeMismatchError as error:
            # JSON has no dtypes: whole numbers read as int64 (JavaScript writes 1.0 as 1); an
            # .npy, raw or handle request carries its dtype, and the hint would mislead it
            hint = ""
            if from_json:
                wanted = {t.name: t.dtype for t in self.specs[key].inputs}
                name, dtype = next(((n, wanted[n]) for n, d, _ in tensors if n in wanted and d != wanted[n]),
                                   ("<input>", "float32"))
                hint = f' (a JSON body states it: "dtypes": {{"{name}": "{dtype}"}})'
            raise BadRequest(f"{error}{hint}", status=422) from None
        except _core.ShapeMismatchError as error:
            raise BadRequest(str(error), status=422) from None
        except _core.InvalidArgumentError as error:
            raise BadRequest(str(error), status=400) from None
        values = list(inputs.values())
        # np.asarray(order="C"), not np.ascontiguousarray, which makes a 0-d array (a scalar
        # input: a diffusion timestep) 1-d, so that the graph would refuse it. In native byte
        # order: a big-endian float32 (an .npy written so, ?dtype=>f4) is float32 to the check,
        # but the session takes native arrays only, and the batch it joined would fail.
        return Request(key, [np.asarray(values[i], dtype=values[i].dtype.newbyteorder("="), order="C")
                             for i in order])

    def _takes(self, key: str, tensors: list) -> bool:
        """Whether graph ``key``'s spec takes these (name, dtype, shape) tensors."""
        try:
            _core.check_request(self.specs[key], tensors)
        except (_core.DTypeMismatchError, _core.ShapeMismatchError, _core.InvalidArgumentError):
            return False
        return True

    def run_batch(self, requests: list[Request]) -> list[dict[str, np.ndarray] | RunFailed]:
        """Outputs per request, by output name, or ``RunFailed`` for a request the model
        refused when run. Requests of one graph whose shapes agree off the batch axes run in
        one call (grouped by the engine, within the batch limit); a call that fails is run
        again request by request, so that one bad request never fails the others."""
        results: list[dict[str, np.ndarray] | None] = [None] * len(requests)
        by_graph: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            by_graph.setdefault(r.graph, []).append(i)
        for key, members in by_graph.items():
            spec = self.specs[key]
            shapes = [[list(a.shape) for a in requests[i].arrays] for i in members]
            # an input without a batch axis is one value per call: the engine groups only
            # requests that sent the same bytes for each
            unbatched = [i for i, t in enumerate(spec.inputs) if t.batch_axis is None]
            values = [b"".join(requests[i].arrays[u].tobytes() for u in unbatched) for i in members]
            for call in _core.group_requests(spec, shapes, values):
                indices = [members[c] for c in call]
                try:
                    ran = self._run(key, [requests[i].arrays for i in indices])
                except Exception as error:  # noqa: BLE001  (a request's values the model refuses, found by running it)
                    if len(indices) == 1:
                        results[indices[0]] = RunFailed.of(error)
                        continue
                    # The checks before a batch see shapes and dtypes, not values (a token id past
                    # the vocabulary) nor how inputs relate: a call that fails is run again one
                    # request at a time, so the bad request fails alone and the others are answered.
                    for i in indices:
                        try:
                            (results[i],) = self._run(key, [requests[i].arrays])
                        except Exception as alone:  # noqa: BLE001
                            results[i] = RunFailed.of(alone)
                    continue
                for i, outputs in zip(indices, ran):
                    results[i] = outputs
        return results  # type: ignore[return-value]

    def _run(self, key: str, calls: list[list[np.ndarray]]) -> list[dict[str, np.ndarray]]:
        spec = self.specs[key]
        names = self.input_names(key)
        in_axes = [t.batch_axis for t in spec.inputs]
        if len(calls) == 1 or all(a is None for a in in_axes):
            joined = calls[0] if len(calls) == 1 else None
            if joined is None:
                return [self._infer(key, names, c) for c in calls]
            return [self._infer(key, names, joined)]
        joined = [np.concatenate([c[i] for c in calls], axis=axis) if axis is not None else calls[0][i]
                  for i, axis in enumerate(in_axes)]
        outputs = self._infer(key, names, joined)
        sizes = [_core.request_batch_size(spec, [list(a.shape) for a in c]) for c in calls]
        bounds = np.cumsum(sizes)[:-1]
        out_axes = {t.name: t.batch_axis for t in spec.outputs}
        split = {name: np.split(value, bounds, axis=out_axes[name]) if out_axes.get(name) is not None else None
                 for name, value in outputs.items()}
        per_request = []
        for r in range(len(calls)):
            # an output without a batch axis is the same for the whole call: each request gets it
            per_request.append({n: (parts[r] if parts is not None else outputs[n]).copy() for n, parts in split.items()})
        return per_request

    def _infer(self, key: str, names: list[str], arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        session = self.sessions[key]
        wanted = set(self.session_inputs[key])
        feeds = {n: a for n, a in zip(names, arrays) if n in wanted}
        if session.device == "cpu":
            values = session.infer_named(feeds, framework="numpy")
        else:  # a CUDA session takes and gives device memory: torch moves it (replicas have torch)
            import torch

            device = torch.device(session.device)
            values = session.infer_named({n: torch.from_numpy(a if a.flags.writeable else a.copy()).to(device)
                                          for n, a in feeds.items()}, framework="torch")
            values = [v.cpu().numpy() for v in values]
        return {t.name: np.asarray(v) for t, v in zip(self.specs[key].outputs, values)}
