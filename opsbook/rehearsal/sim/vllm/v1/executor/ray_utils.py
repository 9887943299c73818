"""The Ray executor of the simulated vLLM: a real Ray cluster, simulated GPUs.

With ``--distributed-executor-backend ray`` the engine does what vLLM's Ray executor does
(vLLM 0.15.1 ``vllm/v1/executor/ray_utils.py``: ``initialize_ray_cluster``,
``_wait_until_pg_ready``; ``vllm/v1/executor/ray_executor.py``: ``_init_workers_ray``), through
Ray's real API: it joins the running cluster (``ray.init`` with ``RAY_ADDRESS``), reserves a
placement group of one ``{"GPU": 1.0}`` bundle per rank with ``node:<driver ip>`` in the first
(strategy ``PACK``), waits for it with vLLM's messages and timeout, then starts one
:class:`RayWorkerWrapper` actor per bundle. Each actor runs on its node with the GPU Ray gave
it and holds simulated memory in that node's simulated GPUs, so the node's ``nvidia-smi``
shows it. Ray removes the actors when the engine (their owner) exits.

Standard library and Ray only: this runs on the rehearsal host with that host's Ray.
"""

from __future__ import annotations

import os
import site
import time
from pathlib import Path
from typing import Any

from ..._simconfig import at_least
from ..._simlog import Log
from ..._simprocs import gpu_records, load_simgpu, register, release

# vLLM 0.10.2-0.34.0 ray_utils.py: PG_WAIT_TIMEOUT = 1800, first wait_interval 10, doubled.
PG_WAIT_TIMEOUT = 1800.0
FIRST_WAIT_INTERVAL = 10.0
# A knob of the simulation only, for tests that cannot wait half an hour.
ENV_PG_WAIT_TIMEOUT = "OPSBOOK_SIM_PG_WAIT_TIMEOUT"
# The title Ray gives an actor's process: what nvidia-smi lists on a Ray node.
ACTOR_TITLE = "ray::RayWorkerWrapper"
# Releases whose ray_utils.py raises the "requiring N GPUs" message (0.11.2 on; 0.10.2 has
# only the placement_group_specs one).
REQUIRING_MESSAGE_SINCE = "0.11.2"


class RayWorkerWrapper:
    """One rank, as a Ray actor on its node (vLLM's ``RayWorkerWrapper``)."""

    def __init__(self, rpc_rank: int = 0) -> None:
        self.rpc_rank = rpc_rank
        self.sim_dir = str(load_simgpu().sim_dir())

    def get_node_ip(self) -> str:
        # vLLM's get_ip(): VLLM_HOST_IP first (vllm/utils/network_utils.py).
        import ray

        return os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()

    def get_node_and_gpu_ids(self) -> tuple[str, list[int]]:
        import ray

        return ray.get_runtime_context().get_node_id(), [int(g) for g in ray.get_gpu_ids()]

    def describe(self) -> dict[str, Any]:
        """This rank's node, process and simulated GPU (the one Ray assigned it)."""
        gpus = gpu_records(self.sim_dir)
        gpu = gpus[0] if gpus else None
        free = None
        if gpu is not None:
            used = load_simgpu().used_mib(self.sim_dir_path, int(gpu["index"]))
            free = int(gpu["memory_total_mib"]) - int(gpu["memory_reserved_mib"]) - used
        return {"ip": self.get_node_ip(), "pid": os.getpid(), "gpu": gpu, "free_mib": free}

    @property
    def sim_dir_path(self) -> Path:
        return Path(self.sim_dir)

    def hold(self, mib: int) -> int:
        """Hold ``mib`` of this rank's GPU in the node's simulated nvidia-smi."""
        gpus = gpu_records(self.sim_dir)
        if gpus:
            register(self.sim_dir, os.getpid(), ACTOR_TITLE, int(gpus[0]["index"]), mib)
        return os.getpid()

    def load_model(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    def ping(self) -> int:
        return os.getpid()

    def release(self) -> None:
        release(self.sim_dir, os.getpid())


class PlacementGroupTimeout(Exception):
    """The placement group was not ready within the timeout; the message is vLLM's."""


class RayExecutor:
    """The engine's side: the cluster connection, the placement group and the actors."""

    def __init__(self, world: int, version: str, log: Log):
        self.world = world
        self.version = version
        self.log = log
        self.actors: list[Any] = []
        self.ranks: list[dict[str, Any]] = []
        self.placement_group: Any = None

    def start(self) -> list[dict[str, Any]]:
        """Join the cluster, reserve the placement group, start the actors; per rank its
        ``describe()`` answer, driver node first (vLLM's sort_by_driver_then_worker_ip)."""
        # The engine process starts from a made-up argv[0] with its site-packages on PYTHONPATH,
        # where .pth files (the rehearsal host's link to Ray) are not read: read them.
        site.addsitedir(str(Path(__file__).resolve().parents[3]))
        import ray

        ray.init(address=os.environ.get("RAY_ADDRESS") or None, log_to_driver=False)
        driver_ip = os.environ.get("VLLM_HOST_IP") or ray.util.get_node_ip_address()
        self.log.info(
            "ray_utils.py:402", "No current placement group found. Creating a new placement group."
        )
        in_cluster = ray.cluster_resources().get("GPU", 0)
        if self.world > in_cluster:
            self.log.warning(
                "ray_utils.py:408",
                "The number of required GPUs exceeds the total number of available GPUs in the "
                "placement group.",
            )
        specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(self.world)]
        specs[0][f"node:{driver_ip}"] = 0.001
        self.placement_group = ray.util.placement_group(specs, strategy="PACK")
        self._wait_until_ready(specs)
        self._start_actors(driver_ip)
        return self.ranks

    def _wait_until_ready(self, specs: list[dict[str, float]]) -> None:
        import ray

        timeout = float(os.environ.get(ENV_PG_WAIT_TIMEOUT) or PG_WAIT_TIMEOUT)
        started = time.time()
        ready_ref = self.placement_group.ready()
        interval = FIRST_WAIT_INTERVAL
        while time.time() - started < timeout:
            ready, _ = ray.wait([ready_ref], timeout=min(interval, timeout))
            if ready:
                return
            interval *= 2
            self.log.info(
                "ray_utils.py:252",
                f"Waiting for creating a placement group of specs for "
                f"{int(time.time() - started)} seconds. specs={specs}. Check `ray status` and "
                "`ray list nodes` to see if you have enough resources, and make sure the IP "
                "addresses used by ray cluster are the same as VLLM_HOST_IP environment variable "
                "specified in each node if you are running on a multi-node.",
            )
        shown = f"{PG_WAIT_TIMEOUT:.0f}" if timeout == PG_WAIT_TIMEOUT else f"{timeout:g}"
        total = sum(spec.get("GPU", 0) for spec in specs)
        if total > 1 and at_least(self.version, REQUIRING_MESSAGE_SINCE):
            raise PlacementGroupTimeout(
                f"Cannot provide a placement group requiring {total} GPUs "
                f"(placement_group_specs={specs}) within {shown} seconds.\n"
                "Tensor parallel size may exceed available GPUs in your cluster. Check "
                "resources with `ray status` and `ray list nodes`.\n"
                "If running on K8s with limited GPUs, consider reducing --tensor-parallel-size "
                "to match available GPU resources."
            )
        raise PlacementGroupTimeout(
            f"Cannot provide a placement group of placement_group_specs={specs} within "
            f"{shown} seconds. See `ray status` and `ray list nodes` to make sure the cluster "
            "has enough resources."
        )

    def _start_actors(self, driver_ip: str) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actors = []
        for rank in range(self.world):
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group,
                placement_group_capture_child_tasks=True,
                placement_group_bundle_index=rank,
            )
            remote = ray.remote(num_cpus=0, num_gpus=1, scheduling_strategy=strategy)
            actors.append(remote(RayWorkerWrapper).remote(rpc_rank=rank))
        described = ray.get([a.describe.remote() for a in actors])
        counts: dict[str, int] = {}
        for info in described:
            counts[info["ip"]] = counts.get(info["ip"], 0) + 1
        order = sorted(
            range(len(actors)),
            key=lambda i: (
                0 if described[i]["ip"] == driver_ip else 1,
                counts[described[i]["ip"]],
                described[i]["ip"],
            ),
        )
        self.actors = [actors[i] for i in order]
        self.ranks = [described[i] for i in order]

    # What the engine asks of its ranks.

    def hold_all(self, mib: int) -> None:
        import ray

        ray.get([a.hold.remote(mib) for a in self.actors])

    def start_load(self, seconds: float) -> list[Any]:
        return [a.load_model.remote(seconds) for a in self.actors]

    def wait(self, refs: list[Any], timeout: float) -> bool:
        """Wait up to ``timeout`` for ``refs``; True when all are done. A rank whose actor or
        node died raises Ray's own error (``ActorDiedError``...)."""
        import ray

        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for ref in ready:
            ray.get(ref)
        return not pending

    def check_health(self, timeout: float = 10.0) -> None:
        """Raise Ray's error when a rank's actor (or its node) is gone."""
        import ray

        ray.get([a.ping.remote() for a in self.actors], timeout=timeout)

    def shutdown(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.get(actor.release.remote(), timeout=2)
            except Exception:
                pass
            try:
                ray.kill(actor)
            except Exception:
                pass
        try:
            ray.shutdown()
        except Exception:
            pass


def error_name(error: BaseException) -> str:
    """``ray.exceptions.ActorDiedError``: the name a traceback prints."""
    kind = type(error)
    return f"{kind.__module__}.{kind.__name__}" if kind.__module__ != "builtins" else kind.__name__
