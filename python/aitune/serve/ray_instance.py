"""Starting (or joining) the Ray instance aitune serves on, isolated, and stopping exactly it."""
from __future__ import annotations

import os
import tempfile


def start(address: str | None = None, num_cpus: float | None = None, num_gpus: int | None = None,
          temp_dir: str | None = None, metrics_port: int = 26901):
    """Joins the cluster at `address`, or starts a local Ray instance of this process on
    127.0.0.1: usage statistics and token auth off, its own temp dir (so nothing of another
    Ray on the host is touched), no dashboard, a metrics port of its own. `stop()` ends it."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if address:
        return ray.init(address=address, logging_level="WARNING")
    # Ray's socket paths must stay short: a temp dir under /tmp, not a long pytest path.
    temp_dir = temp_dir or tempfile.mkdtemp(prefix="aitune-ray-", dir="/tmp")
    return ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, _temp_dir=temp_dir,
                    _node_ip_address="127.0.0.1", _metrics_export_port=metrics_port, logging_level="WARNING")


def stop(app_name: str, started_here: bool) -> None:
    """Removes the application; a Ray instance this process started is shut down with its
    Serve, while on a joined cluster only the connection ends (its other applications stay)."""
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
