"""Probe: the nodes of a Ray cluster, through Ray's own state API (``ray.nodes()``).

Run with the deployment's python (the one whose ``ray`` started the node). Joins the cluster
as a short-lived driver, reads every node's address, liveness and GPUs, and leaves.

Args: ``{"address": "HOST:PORT", "node_ip": str}``.
Answers ``{"ray_version": str, "nodes": [{"address", "alive", "gpus"}]}``, or
``{"error": str}`` when no cluster answers there.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket


def main(args):
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError as e:
        return {"error": f"ray is not installed for this python: {e}"}
    host, _, port = str(args["address"]).rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as e:
        # ray.init would retry for a minute against a head that is not there.
        return {"error": f"no Ray head answers at {args['address']}: {e.strerror or e}"}
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            ray.init(
                address=args["address"],
                _node_ip_address=args.get("node_ip") or None,
                logging_level="ERROR",
                log_to_driver=False,
                configure_logging=False,
            )
            nodes = ray.nodes()
            ray.shutdown()
    except Exception as e:  # no cluster there, or it refused this driver
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"}
    return {
        "ray_version": ray.__version__,
        "nodes": [
            {
                "address": n.get("NodeManagerAddress"),
                "alive": bool(n.get("Alive")),
                "gpus": float((n.get("Resources") or {}).get("GPU", 0)),
            }
            for n in nodes
        ],
    }
