"""aitune.serve: a tuned checkpoint served by Ray Serve (two CPU replicas on a local Ray
instance of the test's own), every answer checked against the tuned module; batching
planned from the checkpoint's measurements; bad requests; a replica killed under load;
the written config accepted by Serve's schema. Request codec and grouping without Ray."""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import time
import urllib.request
import warnings
import zipfile

import numpy as np
import pytest
import torch
from torch_models import MLP, cpu_strategy

import aitune.torch as ait
from aitune import _core
from aitune.serve import BadRequest, GraphServer, plan_for
from aitune.serve import codec

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'aitune[serve]'): serving is not tested")
serve = pytest.importorskip("ray.serve")

from aitune.serve import cli as serve_cli, loadtest, ray_instance  # noqa: E402

HTTP_PORT = 26481


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tuned MLP on the CPU with the batch search run, saved; and its eager module."""
    inner = MLP().eval()
    model = ait.Module(inner, "mlp_serve", strategy=cpu_strategy())
    profile = _core.ProfileConfig()
    profile.warmup_calls, profile.window_calls, profile.stable_windows, profile.max_windows = 2, 10, 2, 4
    profile.time_cap_s = 0.5
    ait.tune(model, [torch.randn(16) for _ in range(4)], batch_sizes=[1, 4], disable_external_logging=True,
             ignore_failing_modules=False, performance_validation=False, find_max_batch_size=True,
             max_batch_size=32, profile_config=profile, progress=False)
    path = tmp_path_factory.mktemp("serve") / "mlp.ait"
    ait.save(model, path)
    return str(path), inner


def _post(url, body, content_type=codec.JSON, query=""):
    request = urllib.request.Request(url + (f"?{query}" if query else ""), data=body,
                                     headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


# --- without Ray -----------------------------------------------------------------------

def test_plan_comes_from_the_checkpoints_measurements_and_says_why(checkpoint):
    path, _ = checkpoint
    ckpt = _core.Checkpoint.load(path)
    measured = [m.batch_size for m in _core.batch_latencies_from_report(
        open(ckpt.artifact_path(f"{_core.Checkpoint.graph_directory(ckpt.graph_keys()[0])}/tune_report.json")).read())]
    assert measured[0] == 4 and len(measured) >= 2  # the winner's profile at batch 4, the search above it
    plan = plan_for(ckpt)  # no objective: the highest measured throughput
    assert plan.max_batch_size in measured and plan.batch_wait_timeout_s > 0
    assert "highest measured throughput" in plan.explain()
    tight = plan_for(ckpt, slo_ms=0.001)
    assert not tight.objective_met and tight.max_batch_size == 4 and "cannot be met" in tight.explain()


def test_graph_server_batches_give_the_tuned_modules_answers(checkpoint):
    path, inner = checkpoint
    server = GraphServer(path, device="cpu")
    xs = [np.random.default_rng(i).standard_normal((n, 16)).astype(np.float32) for i, n in enumerate([1, 2, 1, 3])]
    requests = [server.check({"x": x} if "x" in server.input_names(next(iter(server.specs))) else
                             {server.input_names(next(iter(server.specs)))[0]: x}) for x in xs]
    outputs = server.run_batch(requests)
    for x, out in zip(xs, outputs):
        (y,) = out.values()
        with torch.no_grad():
            np.testing.assert_allclose(y, inner(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)


class _Centered(torch.nn.Module):
    """Centred over the batch: each row's answer depends on the other rows."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.proj(x)
        return y - y.mean(0, keepdim=True)


class _Scorer(torch.nn.Module):
    """Scores every row against every other (`a @ b.T`): a [B, B] output."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, image, text):
        return self.proj(image) @ self.proj(text).T


class _Flattened(torch.nn.Module):
    """Token logits flattened over batch and sequence (`view(-1, V)`): no batch axis."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.out = torch.nn.Linear(8, 5)

    def forward(self, ids):
        return self.out(self.emb(ids)).view(-1, 5)


@pytest.mark.parametrize("make, sample, why", [
    (_Centered, lambda: torch.randn(8), "differs from that row alone"),
    (_Scorer, lambda: (torch.randn(8), torch.randn(8)), "alone but [1, 2] in a batch of 2"),
    (_Flattened, lambda: torch.randint(0, 50, (6,)), "has no batch axis"),
], ids=["batch-mean", "row-against-row", "flattened"])
def test_a_model_that_mixes_batch_rows_serves_each_request_alone(tmp_path, make, sample, why, caplog):
    """A probe's finding: requests joined into one call got part of each other's answers
    (a token classifier's flattened logits, a scorer's [B, B] scores, a batch mean), silently.
    The tuner compares each row of a recorded batch with that row alone; a server joins
    requests only where they are equal, and says so otherwise."""
    torch.manual_seed(0)
    inner = make().eval()
    model = ait.Module(inner, "mixed_rows", strategy=cpu_strategy())
    ait.tune(model, [sample() for _ in range(2)], batch_sizes=[1, 2], disable_external_logging=True,
             ignore_failing_modules=False, performance_validation=False, progress=False)
    ait.save(model, tmp_path / "mixed.ait")
    with caplog.at_level(logging.WARNING, logger="aitune"):
        server = GraphServer(str(tmp_path / "mixed.ait"), device="cpu")
    (key,) = server.specs
    spec = server.specs[key]
    assert spec.batch_rows == "coupled" and why in spec.batch_rows_reason
    assert "serves each request in a call of its own" in caplog.text
    names = server.input_names(key)
    rng = np.random.default_rng(0)
    feeds = [{n: (rng.integers(0, 50, (1, 6)) if t.dtype == "int64" else rng.standard_normal((1, 8)).astype(np.float32))
              for n, t in zip(names, spec.inputs)} for _ in range(2)]
    assert _core.group_requests(spec, [[list(a.shape) for a in f.values()] for f in feeds], [b""] * 2) == [[0], [1]]
    together = server.run_batch([server.check(f) for f in feeds])
    for feed, out in zip(feeds, together):
        (alone,) = server.run_batch([server.check(feed)])
        for name in alone:
            np.testing.assert_array_equal(out[name], alone[name])
    plan = plan_for(_core.Checkpoint.load(str(tmp_path / "mixed.ait")))
    assert plan.max_batch_size == 1 and "each request runs in a call of its own" in plan.explain()


def test_a_graph_without_a_batch_axis_keeps_why_its_rows_are_unchecked(tmp_path):
    """Recorded at one batch size, the graph has no batch axis: nothing to join or check,
    and the checkpoint keeps the tuner's reason (a plan and the server say it)."""
    inner = _Centered().eval()
    model = ait.Module(inner, "one_row", strategy=cpu_strategy())
    ait.tune(model, [torch.randn(8) for _ in range(2)], batch_sizes=[1], disable_external_logging=True,
             ignore_failing_modules=False, performance_validation=False, progress=False)
    ait.save(model, tmp_path / "one.ait")
    (spec,) = GraphServer(str(tmp_path / "one.ait"), device="cpu").specs.values()
    assert spec.batch_rows == "unchecked" and spec.batch_rows_reason == "the graph has no batch axis"


class _Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, pooled: bool = False):
        y = self.proj(x)
        return y.mean(-1, keepdim=True) if pooled else y


def test_a_request_that_fits_two_graphs_is_refused_naming_their_calls(tmp_path):
    """A probe's finding: `m(x)` and `m(x, pooled=True)` record two graphs of the same
    inputs; a request went to the first silently. Now it is refused, naming each graph's
    recorded call, and ?graph=KEY picks one; graphs that differ in rank still pick by shape."""
    inner = _Pooled().eval()
    model = ait.Module(inner, "pooled_serve", strategy=cpu_strategy())

    def drive(x):
        model(x)
        model(x, pooled=True)
        model(x[..., None, :])  # rank 3: the same input name, another spec

    ait.tune(drive, [torch.randn(8) for _ in range(2)], disable_external_logging=True, ignore_failing_modules=False,
             performance_validation=False, progress=False)
    ait.save(model, tmp_path / "pooled.ait")
    server = GraphServer(str(tmp_path / "pooled.ait"), device="cpu")
    assert len(server.specs) == 3
    x = np.random.default_rng(0).standard_normal((1, 8)).astype(np.float32)
    with pytest.raises(BadRequest, match="fits 2 graphs") as refused:
        server.check({"input_x": x})
    assert "pooled=True" in str(refused.value) and "pooled=False" in str(refused.value)
    pooled = next(k for k, recorded in server.recorded.items() if "pooled=True" in recorded)
    (out,) = server.run_batch([server.check({"input_x": x}, graph=pooled)])
    with torch.no_grad():
        np.testing.assert_allclose(out["output_0"], inner(torch.from_numpy(x), pooled=True).numpy(), rtol=1e-5,
                                   atol=1e-6)
    three = server.check({"input_x": x[:, None, :]})  # only the rank-3 graph takes it
    assert "rank 3" in server.recorded[three.graph]


class _Masked(torch.nn.Module):
    """Two inputs with a dynamic sequence axis besides the batch axis."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x, mask):
        return self.proj(x) * mask.unsqueeze(-1)


def test_requests_are_grouped_by_shape_off_the_batch_axis(tmp_path):
    inner = _Masked().eval()
    model = ait.Module(inner, "masked_serve", strategy=cpu_strategy())
    samples = [(torch.randn(seq, 8), torch.ones(seq)) for seq in (4, 6, 4, 6)]
    ait.tune(model, samples, batch_sizes=[1, 4], disable_external_logging=True, ignore_failing_modules=False,
             performance_validation=False, progress=False)
    ait.save(model, tmp_path / "masked.ait")
    server = GraphServer(str(tmp_path / "masked.ait"), device="cpu")
    (key,) = server.specs
    names = server.input_names(key)
    rng = np.random.default_rng(0)
    shapes = [(1, 4), (1, 6), (2, 4), (1, 5), (3, 6)]  # seq 4: 1 + 2; seq 6: 1 + 3 (one call each)
    feeds = [{names[0]: rng.standard_normal((b, s, 8)).astype(np.float32),
              names[1]: (rng.random((b, s)) > 0.3).astype(np.float32)} for b, s in shapes]
    calls = _core.group_requests(server.specs[key], [[list(a.shape) for a in f.values()] for f in feeds],
                                 [b""] * len(feeds))
    assert calls == [[0, 2], [1, 4], [3]]
    outputs = server.run_batch([server.check(f) for f in feeds])
    for feed, out in zip(feeds, outputs):
        (y,) = out.values()
        with torch.no_grad():
            want = inner(*(torch.from_numpy(feed[n]) for n in names)).numpy()
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(BadRequest, match="disagree on the batch size"):
        server.check({names[0]: np.zeros((2, 4, 8), np.float32), names[1]: np.zeros((1, 4), np.float32)})


class _Embedded(torch.nn.Module):
    """Token ids in: a request's values (an id past the vocabulary) fail only when run."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return self.embed(ids).sum(1)


def test_a_request_that_fails_when_run_fails_alone_and_its_batch_is_answered(tmp_path):
    """The checks before a batch see shapes and dtypes, not values: a token id past the
    vocabulary passed them, joined a batch, and every request of it got HTTP 500 (8 of 9 in
    a probe). Now a call that fails is run again request by request: the bad one gets a
    422 naming the engine's error, the others their answers."""
    from aitune.serve.graph_server import RunFailed

    inner = _Embedded().eval()
    model = ait.Module(inner, "embedded_serve", strategy=cpu_strategy())
    ait.tune(model, [torch.randint(0, 10, (5,)) for _ in range(4)], batch_sizes=[1, 4], disable_external_logging=True,
             ignore_failing_modules=False, performance_validation=False, progress=False)
    ait.save(model, tmp_path / "embedded.ait")
    server = GraphServer(str(tmp_path / "embedded.ait"), device="cpu")
    (name,) = server.input_names(next(iter(server.specs)))
    feeds = [np.array([[1, 2, 3, 4, 5]]), np.array([[1, 2, 3, 4, 99]]), np.array([[9, 8, 7, 6, 5], [0, 0, 0, 0, 0]])]
    outputs = server.run_batch([server.check({name: f}) for f in feeds])
    assert isinstance(outputs[1], RunFailed) and outputs[1].status == 422, outputs[1]
    for i in (0, 2):
        (y,) = outputs[i].values()
        with torch.no_grad():
            np.testing.assert_allclose(y, inner(torch.from_numpy(feeds[i])).numpy(), rtol=1e-5, atol=1e-6)


class _Scaled(torch.nn.Module):
    """A batched input and a scalar without a batch axis (as a diffusion timestep)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, t):
        return self.proj(x) * t


def test_a_scalar_input_is_served_and_requests_with_other_values_of_it_run_apart(tmp_path):
    # was: a 0-d input was made 1-d (np.ascontiguousarray) and refused by the graph; and
    # requests were grouped by shape alone, so a batch of t=1 and t=3 answered both for t=1
    inner = _Scaled().eval()
    model = ait.Module(inner, "scaled_serve", strategy=cpu_strategy())
    ait.tune(lambda x: model(x, torch.tensor(2.0)), [torch.randn(4) for _ in range(4)], batch_sizes=[1, 4],
             disable_external_logging=True, ignore_failing_modules=False, performance_validation=False,
             progress=False)
    ait.save(model, tmp_path / "scaled.ait")
    server = GraphServer(str(tmp_path / "scaled.ait"), device="cpu")
    (key,) = server.specs
    x_name, t_name = server.input_names(key)
    assert server.specs[key].inputs[1].batch_axis is None
    rng = np.random.default_rng(0)
    feeds = [{x_name: rng.standard_normal((b, 4)).astype(np.float32), t_name: np.array(t, np.float32)}
             for b, t in [(1, 1.0), (2, 3.0), (1, 1.0), (1, 3.0)]]
    outputs = server.run_batch([server.check(f) for f in feeds])
    for feed, out in zip(feeds, outputs):
        (y,) = out.values()
        with torch.no_grad():
            want = inner(torch.from_numpy(feed[x_name]), torch.from_numpy(feed[t_name])).numpy()
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_graphs_outside_onnx_runtime_are_named_as_not_served():
    from types import SimpleNamespace

    from aitune.serve.graph_server import unserved_graphs

    # Older checkpoints (metadata format 1 and 2) listed them in the metadata ...
    metadata = {"aitune.torch": {"eager_graphs": [{"key": "g_eager"}], "compiled_graphs": [{"key": "g_compiled"}]}}
    manifest = SimpleNamespace(metadata_json=json.dumps(metadata), graphs=[])
    assert unserved_graphs(manifest) == {"g_eager": "runs eagerly", "g_compiled": "torch.compile"}
    assert unserved_graphs(SimpleNamespace(metadata_json="{}", graphs=[])) == {}
    # ... now they are the manifest's graphs of the eager and torch_compile sections.
    graphs = [SimpleNamespace(key=k, backend=b) for k, b in
              (("g_onnx", "onnxruntime"), ("g_eager", "eager"), ("g_compiled", "torch_compile"))]
    manifest = SimpleNamespace(metadata_json="{}", graphs=graphs)
    assert unserved_graphs(manifest) == {"g_eager": "runs eagerly", "g_compiled": "torch.compile"}


def test_serving_a_checkpoint_with_no_onnx_runtime_graph_is_refused_before_ray_starts(tmp_path, capsys):
    # was: the plan was printed and the config written (or Ray started), and every
    # replica then failed on 'no ONNX Runtime graph to serve'
    from aitune.torch.backend import TorchEagerBackend

    class Holder:
        def __init__(self):
            self.body = ait.Module(MLP().eval(), "onnx_body_serve", strategy=cpu_strategy(tune_provider_options=False))
            self.head = ait.Module(MLP().eval(), "eager_head_serve", strategy=ait.OneBackendStrategy(TorchEagerBackend()))

    holder = Holder()
    ait.tune(lambda x: (holder.body(x), holder.head(x)), [torch.randn(16)], batch_sizes=[1], progress=False)
    path = ait.save(holder, tmp_path / "eager.ait") / "modules" / "head"  # a pipeline's section: eager only
    config = tmp_path / "serve.yaml"
    assert serve_cli.serve_main([str(path), "--write-config", str(config)]) == 2
    assert "no ONNX Runtime graph to serve" in capsys.readouterr().err and not config.exists()


def test_bad_serve_and_loadtest_arguments_exit_2_before_ray_starts(checkpoint, tmp_path, capsys, monkeypatch):
    """Each was a traceback (exit 1), the first two after a local Ray instance had started
    (Ray's ValueError for 0 replicas, OverflowError binding port 99999), or was accepted:
    --autoscale 3:1 wrote a config that Serve refuses at deploy time."""
    path, _ = checkpoint
    started = []
    monkeypatch.setattr(ray_instance, "start", lambda *a, **k: started.append(a))
    config = tmp_path / "serve.yaml"
    for argv, says in [(["--replicas", "0"], "--replicas"), (["--port", "99999"], "--port"),
                       (["--autoscale", "3:1"], "--autoscale"), (["--autoscale", "0:0"], "--autoscale"),
                       (["--num-cpus", "-1"], "--num-cpus"), (["--threads", "-2"], "--threads"),
                       (["--max-batch-size", "0"], "--max-batch-size"),
                       (["--batch-wait-timeout-s", "-1"], "--batch-wait-timeout-s"),
                       (["--ray-metrics-port", "70000"], "--ray-metrics-port")]:
        with pytest.raises(SystemExit) as exited:
            serve_cli.serve_main([path, *argv, "--write-config", str(config)])
        assert exited.value.code == 2, argv
        assert says in capsys.readouterr().err, argv
        with pytest.raises(SystemExit):
            serve_cli.serve_main([path, *argv])
    assert not started and not config.exists()
    # a config file that cannot be written: exit 2 naming it, no traceback
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert serve_cli.serve_main([path, "--write-config", str(blocker / "serve.yaml")]) == 2
    assert str(blocker / "serve.yaml") in capsys.readouterr().err
    # loadtest: a checkpoint that is not one, concurrency that is no list of counts
    assert serve_cli.loadtest_main(["http://127.0.0.1:1/", "--checkpoint", str(tmp_path / "none.ait")]) == 2
    assert "none.ait" in capsys.readouterr().err
    for argv in (["--concurrency", "1,x"], ["--concurrency", "0"], ["--requests-per-client", "0"]):
        with pytest.raises(SystemExit) as exited:
            serve_cli.loadtest_main(["http://127.0.0.1:1/", "--checkpoint", path, *argv])
        assert exited.value.code == 2, argv
    # nothing listening: every request fails, which fails the load test (was exit 0, "p50 nan")
    assert serve_cli.loadtest_main(["http://127.0.0.1:1/", "--checkpoint", path, "--concurrency", "1",
                                    "--requests-per-client", "2"]) == 1
    err = capsys.readouterr().err
    assert "2 of 2 requests at concurrency 1 got no answer; the first: no answer: ConnectionRefusedError" in err, err


def test_loadtest_refuses_a_url_it_cannot_send_to_before_any_request(checkpoint, capsys, monkeypatch):
    """`aitune loadtest notaurl` printed one TypeError traceback per client thread (no host
    to connect to), a table of 0 requests with nan latencies, and exited 0. A URL that is not
    http(s)://HOST[:PORT]/ROUTE is a bad argument: exit 2 naming it, no request sent."""
    path, _ = checkpoint
    send, sent = loadtest.send, []
    monkeypatch.setattr(loadtest, "send", lambda *a, **k: sent.append(a))
    for url in ("notaurl", "127.0.0.1:8000/", "localhost:8000", "ftp://127.0.0.1/", "http://", "http:///route",
                "http://127.0.0.1:99999/", "http://127.0.0.1:x/", "http://127.0.0.1:0/"):
        with pytest.raises(SystemExit) as exited:
            serve_cli.loadtest_main([url, "--checkpoint", path, "--concurrency", "1,2", "--requests-per-client", "1"])
        assert exited.value.code == 2, url
        err = capsys.readouterr().err
        assert f"URL '{url}'" in err and "http(s)://HOST[:PORT]/ROUTE" in err and "Traceback" not in err, (url, err)
    assert not sent
    # an accepted https URL is sent over TLS, to port 443 unless one is given (was plain HTTP to port 80)
    connections = []

    def connection(kind):
        def make(host, port, timeout):
            connections.append((kind, host, port))
            raise ConnectionRefusedError("none here")
        return make

    monkeypatch.setattr(loadtest.http.client, "HTTPSConnection", connection("https"))
    monkeypatch.setattr(loadtest.http.client, "HTTPConnection", connection("http"))
    for url in ("https://example.test/x", "https://example.test:8443/x", "http://example.test/x"):
        with pytest.raises(ConnectionRefusedError):
            send(url, b"", {})
    assert connections == [("https", "example.test", 443), ("https", "example.test", 8443),
                           ("http", "example.test", 80)]


def test_bad_bodies_are_refused_with_a_reason(checkpoint):
    path, _ = checkpoint
    server = GraphServer(path, device="cpu")
    name = server.single_input()
    with pytest.raises(BadRequest, match="not JSON"):
        codec.decode(b"\x00junk", codec.JSON, {}, name)
    with pytest.raises(BadRequest, match="rectangular"):
        codec.decode(json.dumps({"inputs": {name: [[1, 2], [3]]}}).encode(), codec.JSON, {}, name)
    with pytest.raises(BadRequest, match="query parameters dtype and shape"):
        codec.decode(b"\0" * 64, codec.RAW, {}, name)
    with pytest.raises(BadRequest, match="do not make"):
        codec.decode(b"\0" * 60, codec.RAW, {"dtype": "float32", "shape": "1,16"}, name)
    with pytest.raises(BadRequest) as unsupported:
        codec.decode(b"x", "text/plain", {}, name)
    assert unsupported.value.status == 415
    for inputs, status, message in [({name: np.zeros((1, 15), np.float32)}, 422, "has shape"),
                                    ({name: np.zeros((1, 16), np.float64)}, 422, "float64"),
                                    ({}, 400, "missing input"),
                                    ({name: np.zeros((1, 16), np.float32), "extra": np.zeros(1)}, 400, "unknown input")]:
        with pytest.raises(BadRequest, match=message) as refused:
            server.check(inputs)
        assert refused.value.status == status
    # the JSON dtype hint only for a JSON body (an .npy or a handle carries its dtype)
    wrong = {name: np.zeros((1, 16), np.float64)}
    with pytest.raises(BadRequest) as not_json:
        server.check(wrong)
    assert "JSON body" not in str(not_json.value)
    # naming the input and the dtype the graph takes (it said "float32" whatever the graph took)
    with pytest.raises(BadRequest, match=f'a JSON body states it: "dtypes": {{"{name}": "float32"}}'):
        server.check(wrong, from_json=True)
    # an input given twice is refused, not answered with one of its two values (a new-user probe)
    twice = b'{"inputs": {"%s": [[0]], "%s": [[1]]}}' % (name.encode(), name.encode())
    with pytest.raises(BadRequest, match=f"gives '{name}' twice") as repeated:
        codec.decode(twice, codec.JSON, {}, name)
    assert repeated.value.status == 400
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for value in (0.0, 1.0):
            array = io.BytesIO()
            np.save(array, np.full((1, 16), value, np.float32))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name"
                z.writestr(f"{name}.npy", array.getvalue())
    with pytest.raises(BadRequest, match=f"input '{name}' is given twice in the .npz archive"):
        codec.decode(archive.getvalue(), codec.NPZ, {}, name)
    # an .npy body sent as .npz: named so (was "'numpy.ndarray' object does not support the
    # context manager protocol")
    one = io.BytesIO()
    np.save(one, np.zeros((1, 16), np.float32))
    with pytest.raises(BadRequest, match=r"not an .npz archive: it is one .npy array; send it as application/x-npy"):
        codec.decode(one.getvalue(), codec.NPZ, {}, name)


def test_bodies_that_expand_or_overflow_are_refused_typed():
    """A 400 or 413 naming why, not an exception out of the codec (Serve's 500), for bodies
    whose size says nothing of what they make: a compressed .npz that inflates past the body
    limit (a 0.3 MB body made a 256 MB array; 256 MB of it, 256 GB), a raw shape whose
    element count overflows 64 bits (it wrapped to 0 and matched an empty body), raw
    object dtype, JSON nested past Python's recursion limit."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.zeros((codec.MAX_BODY_BYTES // 4 + 1,), np.float32))
    assert len(buffer.getvalue()) < codec.MAX_BODY_BYTES // 100
    with pytest.raises(BadRequest, match="'x'.*exceeds") as inflated:
        codec.decode(buffer.getvalue(), codec.NPZ, {}, "x")
    assert inflated.value.status == 413
    with pytest.raises(BadRequest, match="do not make") as overflow:
        codec.decode(b"", codec.RAW, {"dtype": "float32", "shape": "4294967296,4294967296,1"}, "x")
    assert overflow.value.status == 400
    with pytest.raises(BadRequest, match="object") as objects:
        codec.decode(b"\0" * 8, codec.RAW, {"dtype": "O", "shape": "1"}, "x")
    assert objects.value.status == 400
    with pytest.raises(BadRequest, match="nested") as deep:
        codec.decode(b'{"inputs": {"x": ' + b"[" * 100000 + b"]" * 100000 + b"}}", codec.JSON, {}, "x")
    assert deep.value.status == 400
    small = io.BytesIO()
    np.savez_compressed(small, x=np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(codec.decode(small.getvalue(), codec.NPZ, {}, "x")["x"],
                                  np.arange(6, dtype=np.float32).reshape(2, 3))


def test_a_big_endian_request_is_served_and_spoils_no_batch(checkpoint):
    """float32 in big-endian byte order (an .npy written so, ?dtype=>f4, "dtypes": ">f4") is
    float32 to the check, but the session took only native arrays: the batch it joined
    failed with a TypeError, every request in it with it."""
    path, inner = checkpoint
    server = GraphServer(path, device="cpu")
    name = server.single_input()
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    native = server.check({name: x})
    swapped = server.check({name: x[:1].astype(">f4")})
    alone = server.check({name: x[1:].astype(">f4")})
    together, by_itself = server.run_batch([native, swapped]), server.run_batch([alone])
    expected = inner(torch.from_numpy(x)).detach().numpy()
    (out,) = together[0].keys()
    np.testing.assert_allclose(together[0][out], expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(together[1][out], expected[:1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(by_itself[0][out], expected[1:], rtol=1e-4, atol=1e-5)


def test_json_values_that_the_stated_dtype_cannot_hold_are_refused_not_changed():
    # was: 1.5 sent as int64 became 1 silently, and 300 as int8 (or 10**30 as int64) raised
    # OverflowError out of the codec: a 500 instead of a 400 naming the input
    def decode(value, dtype):
        body = json.dumps({"inputs": {"x": value}, "dtypes": {"x": dtype}}).encode()
        return codec.decode(body, codec.JSON, {}, "x")["x"]

    for value, dtype, message in [([1.5], "int64", "not integers"), ([300], "int8", "out of range for int8"),
                                  ([10**30], "int64", "64 bits"), ([-1], "uint8", "out of range for uint8"),
                                  ([2], "bool", "not 0 or 1"), (["NaN"], "int32", "not integers")]:
        with pytest.raises(BadRequest, match=message) as refused:
            decode(value, dtype)
        assert refused.value.status == 400 and "'x'" in str(refused.value)
    assert decode([[1, 2]], "int8").dtype == np.int8 and decode([1.0, 2.0], "int64").tolist() == [1, 2]
    assert decode([0, 1], "bool").tolist() == [False, True] and decode([0.1], "float16").dtype == np.float16
    assert decode(2.5, "float32").shape == ()  # a scalar stays 0-d
    # a "dtypes" key naming no input (a typo) left the dtype meant unapplied, silently
    with pytest.raises(BadRequest, match="'y', which \"inputs\" does not hold") as refused:
        codec.decode(json.dumps({"inputs": {"x": [1]}, "dtypes": {"y": "float32"}}).encode(), codec.JSON, {}, "x")
    assert refused.value.status == 400


def test_json_numbers_out_of_range_and_bare_nan_are_refused_naming_the_input():
    # was: Python's json read 1e400 as infinity and bare NaN / -Infinity (not JSON) as floats,
    # and 1e39 (untyped, so float32) or 70000 as float16 became infinity in the cast: all
    # reached the model silently as values the client never sent as such
    def decode(text, dtype=None):
        body = b'{"inputs": {"x": ' + text.encode() + b"}" + (f', "dtypes": {{"x": "{dtype}"}}'.encode() if dtype else b"") + b"}"
        return codec.decode(body, codec.JSON, {}, "x")["x"]

    for text, dtype, message in [("[1.0, 1e400]", None, "out of range for float64"),
                                 ("[[-1e400]]", "float64", "out of range for float64"),
                                 ("1e400", "float32", "out of range for float64"),
                                 ("[NaN]", None, 'bare NaN is not JSON; send the string "NaN"'),
                                 ("[1, -Infinity]", "float32", "bare -Infinity"),
                                 ("[Infinity]", "int64", "bare Infinity"),
                                 ("[1e39]", None, "out of range for float32"),
                                 ("[1e39]", "float32", "out of range for float32"),
                                 ("[70000]", "float16", "out of range for float16"),
                                 # were "input 'x' is float32; the graph takes int64" (from the check)
                                 ("[9223372036854775808]", None, "integers are out of range for int64"),
                                 ("[-1, 9223372036854775808]", None, "integers are out of range for int64")]:
        with pytest.raises(BadRequest, match=message) as refused:
            decode(text, dtype)
        assert refused.value.status == 400 and "input 'x'" in str(refused.value), text
    with pytest.raises(BadRequest, match=r"input 'x' is an empty array \(shape \[0\]\)") as refused:
        decode("[]")  # was named float32 by the dtype check
    assert refused.value.status == 422
    # the strings answers write stay accepted, as do tiny numbers (rounded to 0, as JSON's
    # decimals always are) and the largest finite values of the dtype
    got = decode('["NaN", "-Infinity", 1e-400, 3e38, 1.7e308]', "float64")
    assert np.isnan(got[0]) and got[1] == -np.inf and got[2] == 0.0 and np.isfinite(got[3:]).all()
    assert decode('["Infinity", 65504]', "float16").tolist() == [np.inf, 65504.0]
    assert decode("[3e38]").dtype == np.float32


def test_json_answers_are_strict_json_with_nan_and_infinity_as_strings():
    # was: json.dumps wrote bare NaN / -Infinity (a masked logit), which is not JSON:
    # JSON.parse and most clients other than Python's refuse the whole answer
    y = np.array([[1.5, np.nan], [np.inf, -np.inf]], np.float32)
    body, media = codec.encode({"y": y, "n": np.arange(3)}, codec.JSON)
    payload = json.loads(body, parse_constant=lambda c: pytest.fail(f"bare {c} in a JSON answer"))
    assert payload["outputs"]["y"] == [[1.5, "NaN"], ["Infinity", "-Infinity"]]
    back = codec.decode_response(body, media)
    np.testing.assert_array_equal(back["y"], y)
    assert back["y"].dtype == np.float32 and back["n"].tolist() == [0, 1, 2]
    assert json.loads(codec.encode({"s": np.array(np.nan, np.float32)}, codec.JSON)[0])["outputs"]["s"] == "NaN"
    # an answer's values are accepted as a request's (a model's outputs fed to the next)
    request = json.dumps({"inputs": {"x": payload["outputs"]["y"]}}).encode()
    np.testing.assert_array_equal(codec.decode(request, codec.JSON, {}, "x")["x"], y)
    with pytest.raises(BadRequest, match="rectangular"):  # other strings are not numbers
        codec.decode(json.dumps({"inputs": {"x": ["1.5"]}}).encode(), codec.JSON, {}, "x")


def test_written_config_is_accepted_by_serves_schema(checkpoint, tmp_path, capsys):
    from ray.serve.schema import ServeDeploySchema
    import yaml

    path, _ = checkpoint
    out = tmp_path / "serve.yaml"
    assert serve_cli.serve_main([path, "--slo-ms", "50", "--replicas", "2", "--num-gpus", "1",
                                 "--write-config", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "batching: max_batch_size=" in printed and "<- chosen" in printed
    # an override is printed with the value in force (it said "(overridden on the command line)")
    assert serve_cli.serve_main([path, "--max-batch-size", "64", "--write-config", str(tmp_path / "64.yaml")]) == 0
    assert "overridden on the command line: max_batch_size=64, batch_wait_timeout_s=" in capsys.readouterr().out
    config = yaml.safe_load(out.read_text())
    schema = ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") \
        else ServeDeploySchema.parse_obj(config)
    (app,) = schema.applications
    assert app.import_path == "aitune.serve.deployment:app_builder"
    (deployment,) = app.deployments
    plan = plan_for(_core.Checkpoint.load(path), slo_ms=50)
    assert deployment.num_replicas == 2
    assert deployment.ray_actor_options.num_gpus == 1
    assert deployment.user_config == {"max_batch_size": plan.max_batch_size,
                                      "batch_wait_timeout_s": plan.batch_wait_timeout_s}
    assert app.args["checkpoint"] == os.path.abspath(path)


# --- on a local Ray instance -------------------------------------------------------------

@pytest.fixture(scope="module")
def served(checkpoint, tmp_path_factory):
    """The checkpoint on two CPU replicas (half a CPU each: this machine has two cores), batching on."""
    from aitune.serve.deployment import build

    path, _ = checkpoint
    ray_instance.start(num_cpus=2, metrics_port=26901, dashboard_port=26902)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": HTTP_PORT})
        serve.run(build(path, device="cpu", intra_op_threads=1, num_replicas=2, num_cpus=0.5, max_batch_size=8,
                        batch_wait_timeout_s=0.03), name="aitune", route_prefix="/")
        yield f"http://127.0.0.1:{HTTP_PORT}/", path
    finally:
        ray_instance.stop("aitune", started_here=True)


def test_concurrent_requests_are_batched_on_both_replicas_and_all_correct(served):
    url, path = served
    pool = loadtest.RequestPool(path, size=16)
    result = loadtest.run_level(url, pool, concurrency=8, requests=96)
    row = result.row()
    assert row["errors"] == 0, [a.error for a in result.answers if a.status != 200][:3]
    assert all(a.correct for a in result.answers)
    assert max(a.batch for a in result.answers) > 1, "no batch of more than one request was formed"
    assert row["replicas"] == 2, {a.replica for a in result.answers}
    for fmt in ("npz", "raw"):  # the binary bodies give the same answers
        level = loadtest.run_level(url, pool, concurrency=2, requests=6, fmt=fmt)
        assert [a.status for a in level.answers] == [200] * 6 and all(a.correct for a in level.answers)


def test_the_loadtest_command_checks_every_answer(served, capsys):
    url, path = served
    assert serve_cli.loadtest_main([url, "--checkpoint", path, "--concurrency", "1,4", "--requests-per-client", "5",
                                    "--format", "npz"]) == 0
    table = capsys.readouterr().out
    assert "| concurrency |" in table and "| 4 | 20 | 0 | 0 |" in table


def test_aitune_serve_joins_a_cluster_deploys_prints_the_url_and_stops_on_ctrl_c(served):
    """`aitune serve --address` in its own process: deploys a second application onto the
    running instance, answers at the URL it prints, and on SIGINT deletes only its own."""
    import signal
    import subprocess
    import sys

    url, path = served
    address = ray.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "aitune.cli", "serve", path, "--address", address, "--app-name", "aitune-cli",
               "--route", "/cli", "--port", str(HTTP_PORT), "--num-cpus", "0.25", "--device", "cpu", "--threads", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if line.startswith("serving "):
                break
        printed = "".join(lines)
        assert f"at http://127.0.0.1:{HTTP_PORT}/cli " in printed, printed
        assert "batching: max_batch_size=" in printed
        pool = loadtest.RequestPool(path, size=2)
        level = loadtest.run_level(f"http://127.0.0.1:{HTTP_PORT}/cli", pool, concurrency=2, requests=4)
        assert [a.status for a in level.answers] == [200] * 4 and all(a.correct for a in level.answers)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0, process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
    assert "aitune-cli" not in serve.status().applications
    assert serve.status().applications["aitune"].status == "RUNNING"  # the other application is left alone


def test_a_deployment_handle_serves_named_arrays(served):
    url, path = served
    pool = loadtest.RequestPool(path, size=2)
    handle = serve.get_app_handle("aitune")
    outputs = handle.infer.remote(pool.inputs[1]).result(timeout_s=30)
    assert pool.matches(1, outputs)


def test_bad_requests_get_4xx_and_the_replicas_keep_serving(served):
    url, path = served
    pool = loadtest.RequestPool(path, size=1)
    (name,) = pool.inputs[0]
    cases = [
        (json.dumps({"inputs": {name: np.zeros((1, 15)).tolist()}}).encode(), codec.JSON, "", 422, "has shape"),
        (json.dumps({"inputs": {name: np.zeros((1, 16)).tolist()}, "dtypes": {name: "int64"}}).encode(), codec.JSON,
         "", 422, "int64"),
        (json.dumps({"inputs": {}}).encode(), codec.JSON, "", 400, "missing input"),
        (b"{not json", codec.JSON, "", 400, "not JSON"),
        (b'{"inputs": {"%s": [[1e400' % name.encode() + b", 0" * 15 + b"]]}}", codec.JSON, "", 400,
         f"input '{name}': a number is out of range for float64"),
        (b"\x93NUMPY junk", codec.NPY, "", 400, ".npy"),
        (b"\0" * 8, codec.RAW, "dtype=float32&shape=1,16", 400, "do not make"),
    ]
    for body, content_type, query, status, message in cases:
        got, headers, payload = _post(url, body, content_type, query)
        assert got == status, (message, got, payload)
        assert message in json.loads(payload)["error"]
        # every answer carries them, a refusal too (it had the replica's alone)
        headers = {k.lower(): v for k, v in headers.items()}  # (HTTP header names are case-insensitive)
        assert headers["x-aitune-batch"] == "0" and float(headers["x-aitune-server-ms"]) >= 0, headers
    # a PUT is no inference call (was 400 "body is not JSON")
    put = urllib.request.Request(url, data=b"", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(put, timeout=30)
    assert refused.value.code == 405 and refused.value.headers["Allow"] == "GET, POST"
    good = loadtest.run_level(url, pool, concurrency=4, requests=8)
    assert [a.status for a in good.answers] == [200] * 8 and all(a.correct for a in good.answers)


def test_a_replica_killed_under_load_is_replaced_and_no_answer_is_wrong(served):
    url, path = served
    pool = loadtest.RequestPool(path, size=16)
    probe = loadtest.run_level(url, pool, concurrency=4, requests=16)
    victim = next(a.replica for a in probe.answers if a.replica)
    results = []
    load = threading.Thread(target=lambda: results.append(loadtest.run_level(url, pool, concurrency=4, requests=400)))
    load.start()
    time.sleep(0.3)
    killed_at = time.perf_counter()
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    load.join(timeout=120)
    (under_load,) = results
    assert any(a.finished > killed_at + 0.2 for a in under_load.answers), "the load ended before the kill"
    answered = under_load.ok()
    assert answered and all(a.correct for a in answered), "a request got a wrong answer"
    failed = [a for a in under_load.answers if a.status != 200]
    assert all(a.status >= 500 or a.status == 0 for a in failed), [(a.status, a.error) for a in failed][:3]
    # Serve replaces the replica: two replicas answer again, the killed one not among them.
    deadline, seen = time.time() + 60, set()
    while time.time() < deadline and len(seen) < 2:
        after = loadtest.run_level(url, pool, concurrency=8, requests=32)
        assert [a.status for a in after.answers] == [200] * 32 and all(a.correct for a in after.answers)
        seen |= {a.replica for a in after.answers}
        time.sleep(0.5)
    assert victim not in seen
    assert len(seen) == 2, f"the killed replica was not replaced: {serve.status().applications['aitune']}"
