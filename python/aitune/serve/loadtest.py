"""Load generator for a served checkpoint: a concurrency sweep with latency percentiles,
throughput and errors, every answer checked against the tuned module on the client."""
from __future__ import annotations

import http.client
import io
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

import numpy as np

from aitune import _core

from . import codec
from .graph_server import GraphServer


@dataclass
class Answer:
    status: int              # HTTP status, 0 when the connection failed
    latency_ms: float
    correct: bool | None     # None: not an answer (an error)
    replica: str = ""
    batch: int = 0
    error: str = ""
    finished: float = field(default_factory=time.perf_counter)  # perf_counter when the answer came


@dataclass
class LevelResult:
    concurrency: int
    answers: list[Answer] = field(default_factory=list)
    wall_s: float = 0.0

    def ok(self) -> list[Answer]:
        return [a for a in self.answers if a.status == 200]

    def row(self) -> dict:
        ok = self.ok()
        latencies = [a.latency_ms for a in ok]
        return {
            "concurrency": self.concurrency,
            "requests": len(self.answers),
            "errors": sum(a.status != 200 for a in self.answers),
            "wrong": sum(a.correct is False for a in ok),
            "p50_ms": float(np.percentile(latencies, 50)) if latencies else float("nan"),
            "p99_ms": float(np.percentile(latencies, 99)) if latencies else float("nan"),
            "throughput": len(ok) / self.wall_s if self.wall_s else 0.0,
            "mean_batch": float(np.mean([a.batch for a in ok])) if ok else 0.0,
            "replicas": len({a.replica for a in ok}),
            # why the first request that got no answer failed (a refused connection, a 500's body)
            "first_error": next((f"{a.status or 'no answer'}: {a.error}" for a in self.answers if a.status != 200), ""),
        }


class RequestPool:
    """Random inputs of the checkpoint's (first) graph at batch 1 and the tuned module's
    answers to them, computed here with the checkpoint's own sessions."""

    def __init__(self, checkpoint: str, size: int = 32, seed: int = 0, device: str | None = "cpu"):
        self.server = GraphServer(checkpoint, device=device)
        self.graph = next(iter(self.server.specs))
        spec = self.server.specs[self.graph]
        rng = np.random.default_rng(seed)
        self.inputs, self.expected = [], []
        for _ in range(size):
            arrays = {}
            for t in spec.inputs:
                shape = [1 if a == t.batch_axis else lo for a, lo in enumerate(t.min_shape)]
                if t.dtype.startswith("float"):
                    arrays[t.name] = rng.standard_normal(shape).astype(t.dtype)
                else:  # ids: small non-negative integers every embedding accepts
                    arrays[t.name] = rng.integers(0, 2, size=shape).astype(t.dtype)
            self.inputs.append(arrays)
            self.expected.append(self.server.run_batch([self.server.check(arrays)])[0])
        self.tolerances = {t.name: _core.default_tolerance(t.dtype) for t in spec.outputs}

    def matches(self, index: int, outputs: dict[str, np.ndarray]) -> bool:
        expected = self.expected[index]
        if set(outputs) != set(expected):
            return False
        for name, want in expected.items():
            got = outputs[name]
            if got.shape != want.shape or got.dtype != want.dtype:
                return False
            tol = self.tolerances[name]
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            if not np.all((diff <= tol.atol) | (diff <= tol.rtol * np.abs(want.astype(np.float64)))):
                return False
        return True

    def body(self, index: int, fmt: str) -> tuple[bytes, dict[str, str], str]:
        arrays = self.inputs[index]
        if fmt == "npz":
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            return buffer.getvalue(), {"Content-Type": codec.NPZ, "Accept": codec.NPZ}, ""
        if fmt == "raw" and len(arrays) == 1:
            (a,) = arrays.values()
            query = urllib.parse.urlencode({"dtype": a.dtype.name, "shape": ",".join(map(str, a.shape))})
            return a.tobytes(), {"Content-Type": codec.RAW, "Accept": codec.NPZ}, query
        payload = {"inputs": {k: codec._json_values(v) for k, v in arrays.items()}, "dtypes": {k: v.dtype.name for k, v in arrays.items()}}
        return json.dumps(payload).encode(), {"Content-Type": codec.JSON}, ""


def url_problem(url: str) -> str:
    """Why `send` cannot post to `url` ("" if it can): each client thread would otherwise fail
    on its first request (no host: a TypeError in http.client) after the checkpoint loaded."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        return "not an http:// or https:// URL"
    if not parsed.hostname:
        return "no host"
    try:
        port = parsed.port  # urllib checks digits and 0..65535
    except ValueError:
        port = 0
    return "the port is not a TCP port, 1..65535" if port == 0 else ""


def send(url: str, body: bytes, headers: dict[str, str], query: str = "", timeout: float = 30.0,
         connection: http.client.HTTPConnection | None = None):
    """One POST; returns (status, headers, body, connection to reuse). `url` passed url_problem."""
    parsed = urllib.parse.urlsplit(url)
    path = (parsed.path or "/") + (f"?{query}" if query else "")
    if connection is None:
        # https over TLS: a plain HTTPConnection sent it unencrypted to port 80
        kind, port = ((http.client.HTTPSConnection, 443) if parsed.scheme == "https"
                      else (http.client.HTTPConnection, 80))
        connection = kind(parsed.hostname, parsed.port or port, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read(), connection
    except (OSError, http.client.HTTPException):
        connection.close()
        raise


def run_level(url: str, pool: RequestPool, concurrency: int, requests: int, fmt: str = "json",
              stop: threading.Event | None = None) -> LevelResult:
    """`requests` requests from `concurrency` clients, each waiting for its answer before the next."""
    result = LevelResult(concurrency)
    lock = threading.Lock()
    counter = iter(range(requests))

    def client(seed: int) -> None:
        rng = np.random.default_rng(seed)
        connection = None
        while not (stop and stop.is_set()):
            with lock:
                if next(counter, None) is None:
                    return
            index = int(rng.integers(len(pool.inputs)))
            body, headers, query = pool.body(index, fmt)
            started = time.perf_counter()
            try:
                status, response_headers, payload, connection = send(url, body, headers, query, connection=connection)
            except (OSError, http.client.HTTPException) as error:
                connection = None
                answer = Answer(0, (time.perf_counter() - started) * 1e3, None, error=repr(error))
            else:
                latency = (time.perf_counter() - started) * 1e3
                if status == 200:
                    outputs = codec.decode_response(payload, response_headers.get("content-type", codec.JSON))
                    answer = Answer(status, latency, pool.matches(index, outputs),
                                    response_headers.get("x-aitune-replica", ""),
                                    int(response_headers.get("x-aitune-batch", 0)))
                else:
                    answer = Answer(status, latency, None, response_headers.get("x-aitune-replica", ""),
                                    error=payload[:200].decode(errors="replace"))
            with lock:
                result.answers.append(answer)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.wall_s = time.perf_counter() - started
    return result


def table(rows: list[dict]) -> str:
    """A markdown table of sweep rows."""
    lines = ["| concurrency | requests | errors | wrong | p50 ms | p99 ms | req/s | mean batch | replicas |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['requests']} | {r['errors']} | {r['wrong']} | {r['p50_ms']:.2f} | "
                     f"{r['p99_ms']:.2f} | {r['throughput']:.1f} | {r['mean_batch']:.2f} | {r['replicas']} |")
    return "\n".join(lines)


def sweep(url: str, pool: RequestPool, levels: list[int], requests_per_client: int, fmt: str = "json") -> list[dict]:
    rows = []
    for c in levels:
        run_level(url, pool, c, min(2 * c, 16), fmt)  # warm-up of connections and batches, not counted
        rows.append(run_level(url, pool, c, c * requests_per_client, fmt).row())
    return rows
