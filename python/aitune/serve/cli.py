"""`aitune serve CHECKPOINT` and `aitune loadtest URL`: the Python commands the C++ command line hands over."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from aitune import _core

from .graph_server import unserved_graphs
from .plan import plan_for

APP_NAME = "aitune"


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aitune serve", description="Serve a tuned checkpoint with Ray Serve.")
    p.add_argument("checkpoint", help="checkpoint directory (ait.save / aitune tune --checkpoint)")
    p.add_argument("--slo-ms", type=float, help="p99 latency objective per request; batching is chosen for it")
    p.add_argument("--overhead-ms", type=float, default=2.0,
                   help="latency outside the model (HTTP, routing) counted against the objective (default 2)")
    p.add_argument("--max-batch-size", type=int, help="override the planned batch size")
    p.add_argument("--batch-wait-timeout-s", type=float, help="override the planned wait")
    p.add_argument("--replicas", type=int, default=1, help="replicas (default 1)")
    p.add_argument("--autoscale", metavar="MIN:MAX", help="autoscaling between MIN and MAX replicas instead of --replicas")
    p.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per replica (default 1)")
    p.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per replica (1: one replica per GPU)")
    p.add_argument("--device", choices=["cpu", "cuda"],
                   help="cpu: serve on the CPU whatever the checkpoint was tuned on; default: as saved")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads per replica (0: as saved)")
    p.add_argument("--address", help="join this Ray cluster instead of starting a local instance")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    p.add_argument("--route", default="/", help="route prefix (default /)")
    p.add_argument("--app-name", default=APP_NAME, help=f"Serve application name (default {APP_NAME})")
    p.add_argument("--ray-temp-dir", help="temp dir of the local Ray instance (default: a fresh one under /tmp)")
    p.add_argument("--ray-dashboard-port", type=int, help="port of the local instance's dashboard head (default: Ray's)")
    p.add_argument("--ray-metrics-port", type=int, help="metrics export port of the local instance (default: Ray's)")
    p.add_argument("--write-config", metavar="FILE",
                   help="write a Ray Serve config file (serve deploy FILE) instead of serving")
    return p


def _autoscaling(parser: argparse.ArgumentParser, value: str | None) -> dict | None:
    if not value:
        return None
    low, _, high = value.partition(":")
    try:
        low_n, high_n = int(low), int(high)
    except ValueError:
        parser.error(f"--autoscale takes MIN:MAX, not '{value}'")
    if not 0 <= low_n <= high_n or high_n < 1:
        parser.error(f"--autoscale {value}: needs 0 <= MIN <= MAX and MAX >= 1")
    return {"min_replicas": low_n, "max_replicas": high_n}


def _check_arguments(parser: argparse.ArgumentParser, args) -> None:
    """Refuses values Ray or Serve would refuse only later (after a local instance started,
    or when a written config is deployed) with a traceback: exit 2 naming the option."""
    def need(ok: bool, option: str, rule: str, value) -> None:
        if not ok:
            parser.error(f"{option} {value}: {rule}")

    need(args.replicas >= 1, "--replicas", "at least 1", args.replicas)
    _autoscaling(parser, args.autoscale)
    need(args.num_cpus >= 0, "--num-cpus", "not negative", args.num_cpus)
    need(args.num_gpus >= 0, "--num-gpus", "not negative", args.num_gpus)
    need(args.threads >= 0, "--threads", "not negative (0: as saved)", args.threads)
    need(args.overhead_ms >= 0, "--overhead-ms", "not negative", args.overhead_ms)
    need(args.max_batch_size is None or args.max_batch_size >= 1, "--max-batch-size", "at least 1",
         args.max_batch_size)
    need(args.batch_wait_timeout_s is None or args.batch_wait_timeout_s >= 0, "--batch-wait-timeout-s",
         "not negative", args.batch_wait_timeout_s)
    for option, value in (("--port", args.port), ("--ray-dashboard-port", args.ray_dashboard_port),
                          ("--ray-metrics-port", args.ray_metrics_port)):
        need(value is None or 1 <= value <= 65535, option, "a TCP port, 1..65535", value)


def _options(args, plan) -> dict:
    """The arguments of deployment.deployment_options for the command line and the plan
    (checked by _check_arguments)."""
    autoscaling = _autoscaling(_serve_parser(), args.autoscale)
    return dict(
        num_replicas=args.replicas, num_cpus=args.num_cpus, num_gpus=args.num_gpus,
        max_batch_size=args.max_batch_size or plan.max_batch_size,
        batch_wait_timeout_s=plan.batch_wait_timeout_s if args.batch_wait_timeout_s is None else args.batch_wait_timeout_s,
        autoscaling=autoscaling)


def serve_config(checkpoint: str, options: dict, device: str | None = None, threads: int = 0, host: str = "0.0.0.0",
                 port: int = 8000, route: str = "/", app_name: str = APP_NAME) -> dict:
    """A Ray Serve config (the schema `serve deploy` reads) for the checkpoint's deployment."""
    from .deployment import DEPLOYMENT_NAME

    deployment = {"name": DEPLOYMENT_NAME, **options}
    args = {"checkpoint": os.path.abspath(checkpoint), "intra_op_threads": threads}
    if device:
        args["device"] = device
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": host, "port": port},
        "applications": [{"name": app_name, "route_prefix": route, "import_path": "aitune.serve.deployment:app_builder",
                          "args": args, "deployments": [deployment]}],
    }


def serve_main(argv: list[str]) -> int:
    parser = _serve_parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    try:
        checkpoint = _core.Checkpoint.load(args.checkpoint)
        if not any(checkpoint.runs_in_engine(key) for key in checkpoint.graph_keys()):
            # refused here, not by every replica after Ray started (or on the cluster a written config reaches)
            unserved = unserved_graphs(checkpoint.manifest)
            raise _core.InvalidArgumentError(
                f"checkpoint '{args.checkpoint}' has no ONNX Runtime graph to serve: its graphs "
                f"({', '.join(f'{k}: {v}' for k, v in unserved.items())}) run only in the Python front end, "
                "with the model's nn.Module (ait.load)"
            )
        plan = plan_for(checkpoint, args.slo_ms, args.overhead_ms)
    except _core.AituneError as error:
        print(f"aitune serve: {error}", file=sys.stderr)
        return 2
    print(plan.explain(), end="")
    options = _options(args, plan)
    if args.max_batch_size or args.batch_wait_timeout_s is not None:
        # the values in force, not the plan's (which the line above shows)
        print(f"  overridden on the command line: max_batch_size={options['max_batch_size']}, "
              f"batch_wait_timeout_s={options['batch_wait_timeout_s']:g}")

    if args.write_config:
        import yaml

        from .deployment import deployment_options

        config = serve_config(args.checkpoint, deployment_options(**options), args.device, args.threads, host=args.host, port=args.port,
                              route=args.route, app_name=args.app_name)
        try:
            with open(args.write_config, "w", encoding="utf-8") as f:
                f.write("# Ray Serve config written by `aitune serve --write-config`; deploy with `serve deploy FILE`.\n")
                f.write("# The checkpoint path must exist on every node that runs a replica.\n")
                yaml.safe_dump(config, f, sort_keys=False)
        except OSError as error:
            print(f"aitune serve: cannot write the config '{args.write_config}': {error.strerror or error}",
                  file=sys.stderr)
            return 2
        print(f"wrote {args.write_config}")
        return 0

    from ray import serve

    from . import ray_instance
    from .deployment import build

    started_here = not args.address
    ray_instance.start(args.address, temp_dir=args.ray_temp_dir, metrics_port=args.ray_metrics_port,
                       dashboard_port=args.ray_dashboard_port)
    done = threading.Event()
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build(args.checkpoint, args.device, args.threads, **options), name=args.app_name,
                  route_prefix=args.route)
        url = f"http://{args.host}:{args.port}{args.route}"
        print(f"serving {args.checkpoint} at {url} (POST JSON, .npy, .npz or raw bytes; GET for its inputs); "
              "Ctrl-C stops", flush=True)
        # Handlers of our own: a shell starts background jobs with SIGINT ignored, and
        # Python then never raises KeyboardInterrupt.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: done.set())
        while not done.wait(0.5):
            pass
        print("stopping", flush=True)
    finally:
        ray_instance.stop(args.app_name, started_here)
    return 0


def loadtest_main(argv: list[str]) -> int:
    from . import loadtest

    p = argparse.ArgumentParser(prog="aitune loadtest", description="Concurrency sweep against a served checkpoint.")
    p.add_argument("url")
    p.add_argument("--checkpoint", required=True, help="the served checkpoint: answers are checked against it here")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated levels (default 1,2,4,8,16)")
    p.add_argument("--requests-per-client", type=int, default=50)
    p.add_argument("--format", choices=["json", "npz", "raw"], default="json", help="request body (default json)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args(argv)
    problem = loadtest.url_problem(args.url)
    if problem:
        p.error(f"URL '{args.url}': {problem}; give the served route as http(s)://HOST[:PORT]/ROUTE, "
                "e.g. http://127.0.0.1:8000/")
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        p.error(f"--concurrency takes comma-separated counts, not '{args.concurrency}'")
    if any(c < 1 for c in levels):
        p.error(f"--concurrency {args.concurrency}: each level at least 1")
    if args.requests_per_client < 1:
        p.error(f"--requests-per-client {args.requests_per_client}: at least 1")
    try:
        pool = loadtest.RequestPool(args.checkpoint)
    except _core.AituneError as error:
        print(f"aitune loadtest: {error}", file=sys.stderr)
        return 2
    rows = loadtest.sweep(args.url, pool, levels, args.requests_per_client, args.format)
    print(loadtest.table(rows))
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    # a request without an answer fails the load test as a wrong answer does: against a server
    # that is down every request failed, and the sweep exited 0 with "p50 nan"
    for r in rows:
        if r["errors"]:
            print(f"aitune loadtest: {r['errors']} of {r['requests']} requests at concurrency {r['concurrency']} got "
                  f"no answer; the first: {r['first_error']}", file=sys.stderr)
        if r["wrong"]:
            print(f"aitune loadtest: {r['wrong']} answers at concurrency {r['concurrency']} differ from the "
                  "checkpoint's own", file=sys.stderr)
    return 1 if any(r["wrong"] or r["errors"] for r in rows) else 0
