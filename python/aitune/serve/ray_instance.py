"""Starting (or joining) the Ray instance aitune serves on, isolated, and stopping exactly it."""
from __future__ import annotations

import os
import shutil
import tempfile

# The temp dir start() made for a local instance, removed by stop() (Ray leaves its session logs there).
_made_temp_dir: str | None = None


def start(address: str | None = None, num_cpus: float | None = None, num_gpus: int | None = None,
          temp_dir: str | None = None, metrics_port: int | None = None, dashboard_port: int | None = None):
    """Joins the cluster at `address`, or starts a local Ray instance of this process:
    usage statistics and token auth off, its own temp dir (so nothing of another Ray on the
    host is touched), no dashboard UI, the metrics and dashboard-head ports given (None: Ray
    picks free ones). Ray binds its internal services to the node's address (it resolves
    127.0.0.1 to it); the HTTP proxy binds where `serve.start` says. `stop()` ends it."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address:
        return ray.init(address=address, logging_level="WARNING")
    # Ray's socket paths must stay short: a temp dir under /tmp, not a long pytest path.
    global _made_temp_dir
    if temp_dir is None:
        temp_dir = _made_temp_dir = tempfile.mkdtemp(prefix="aitune-ray-", dir="/tmp")
    ports = {"_metrics_export_port": metrics_port} if metrics_port else {}
    if dashboard_port:
        ports["dashboard_port"] = dashboard_port
    return ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, _temp_dir=temp_dir,
                    _node_ip_address="127.0.0.1", logging_level="WARNING", **ports)


def stop(app_name: str, started_here: bool) -> None:
    """Removes the application; a Ray instance this process started is shut down with its
    Serve, while on a joined cluster only the connection ends (its other applications stay)."""
    global _made_temp_dir
    import ray
    from ray import serve

    if not ray.is_initialized():
        return
    try:
        if started_here:
            serve.shutdown()
        else:
            serve.delete(app_name)
    finally:
        ray.shutdown()
        if started_here and _made_temp_dir:
            shutil.rmtree(_made_temp_dir, ignore_errors=True)
            _made_temp_dir = None
