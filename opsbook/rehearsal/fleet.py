"""A rehearsal fleet: N rehearsal hosts, each its own sshd on its own loopback address, with its
own login user, simulated GPUs, python env, checkpoint and simulated vLLM; and one deployment
file listing them all.

``up(DIR, hosts=N)`` starts ``DIR/host-01`` ... ``DIR/host-NN`` with
:func:`opsbook.rehearsal.sandbox.up`
(several at once), on consecutive addresses from ``address``, and writes ``DIR/deployment.yml``:
the first host's values at the top, each host's own paths, interpreter, server port and server
environment (its own cache roots) in its ``vars``. ``down(DIR)`` stops them all. The fault
knobs make one host unreachable (:func:`stop_sshd`), slow (:func:`make_slow`), hold a broken
checkpoint (:func:`truncate_checkpoint`) or have its server crash on start
(:func:`crash_on_start`).
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import signal
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from opsbook.core.exceptions import SandboxError, SandboxRequestRefused
from opsbook.core.results import Finding, Result
from opsbook.rehearsal import ray_tier, sandbox
from opsbook.rehearsal.ports import free_port
from opsbook.rehearsal.sandbox import Sandbox
from opsbook.rehearsal.sim.vllm_install import DEFAULT_VERSION, SETTINGS_NAME

FLEET_FILE = "fleet.json"
DEPLOYMENT = "deployment.yml"
LAST_LOOPBACK = ipaddress.IPv4Address("127.255.255.255")
# Rehearsal hosts started at once: each creates a venv and a checkpoint; two cores are shared.
PARALLEL_UPS = 4
# Tensor parallel size of a multi-node rehearsal: each host's 8 simulated GPUs, one stage.
MULTINODE_TP = 8
RAY_OBJECT_STORE_BYTES = 100 * 1024 * 1024
# What a host's vars carry: the values that differ between rehearsal hosts.
HOST_VARS = (("model", "path"), ("python",), ("server", "port"), ("paths",))
# And the server's environment variables whose values differ from the first host's: each
# real-vLLM host's VLLM_CACHE_ROOT is under its own folder (rehearsal/real_vllm.py
# deployment_fields); shared, the hosts would compile into and read one cache.
HOST_ENV = ("server", "env")


@dataclass
class Fleet:
    """Running rehearsal hosts and the deployment file listing them."""

    dir: Path
    hosts: list[Sandbox]
    deployment_path: Path


def is_fleet(dir: Path) -> bool:
    """Whether ``dir`` holds a rehearsal fleet (rather than one rehearsal host)."""
    return (Path(dir) / FLEET_FILE).is_file()


def up(
    dir: Path,
    *,
    hosts: int,
    address: str = "127.0.0.1",
    shell: str = "zsh",
    gpu_profile: str = "rtxpro6000",
    vllm_version: str = DEFAULT_VERSION,
    vllm: str = "sim",
    multinode: bool = False,
    ray_port: int = 0,
) -> Fleet:
    """Start (or return the running) rehearsal fleet of ``hosts`` hosts in ``dir``.

    Args:
        dir: the fleet's folder; each host gets ``host-NN`` in it.
        hosts: how many hosts.
        address: the first host's loopback address; the others follow it (with
            ``multinode``, from 127.0.0.2 when it is 127.0.0.1: :func:`ray_kept`).
        shell: the login shell of every host.
        gpu_profile: every host's simulated GPU model (``opsbook.rehearsal.sim.simgpu.PROFILES``).
        vllm_version: the vLLM release every host's simulated server plays.
        vllm: ``sim`` or ``real`` (the real-vLLM tier), as for :func:`opsbook.rehearsal.sandbox.up`.
        multinode: serve one model across the hosts on a Ray cluster: the Ray tier
            (``opsbook.rehearsal.ray_tier``) in every host's env, and a ``cluster`` section
            (tensor parallel 8 x pipeline parallel ``hosts``, the head on the first host).
        ray_port: the Ray head's port with ``multinode`` (0: a free one).

    Raises:
        SandboxError: a host could not start (the others that did are left up: ``down``
            stops them), or the addresses run past the end of 127.0.0.0/8.
    """
    folder = Path(dir).resolve()
    if multinode and hosts < 2:
        raise SandboxError(
            f"serving across nodes needs at least 2 hosts, not {hosts}", remedy="use --hosts 2"
        )
    addresses = consecutive(ray_kept(address) if multinode else address, hosts)
    # An existing folder keeps its mode and owner; one holding other files is refused.
    sandbox.claim_folder(folder, ours=(FLEET_FILE,))
    names = [f"host-{i:02d}" for i in range(1, hosts + 1)]
    (folder / FLEET_FILE).write_text(json.dumps({"hosts": names}, indent=2) + "\n")

    def start(pair: tuple[str, str]) -> Sandbox:
        name, where = pair
        return sandbox.up(
            folder / name,
            address=where,
            shell=shell,
            gpu_profile=gpu_profile,
            vllm_version=vllm_version,
            vllm=vllm,
        )

    with ThreadPoolExecutor(max_workers=PARALLEL_UPS) as pool:
        boxes = list(pool.map(start, zip(names, addresses, strict=True)))
    if not multinode:
        path = write_deployment(boxes, folder / DEPLOYMENT, name="rehearsal-fleet")
        return Fleet(folder, boxes, path)
    tier = ray_tier.ensure_tier()
    for box in boxes:
        ray_tier.link_into(tier, box.venv)
    port = ray_port or free_port(addresses[0])
    path = write_multinode_deployment(boxes, folder / DEPLOYMENT, ray_port=port)
    return Fleet(folder, boxes, path)


def down(dir: Path) -> Result:
    """Stop every rehearsal host of the fleet in ``dir`` (only what ``up`` started)."""
    folder = Path(dir).resolve()
    names = _host_names(folder)
    results = [sandbox.down(folder / name) for name in names]
    findings = [f for r in results for f in r.findings]
    findings += [Finding("ok", n, r.message) for n, r in zip(names, results, strict=True) if r.ok]
    ok = all(r.ok for r in results)
    return Result(ok, f"{len(results)} rehearsal host(s) in {folder} stopped", findings=findings)


def status(dir: Path) -> Result:
    """Whether each rehearsal host of the fleet answers SSH."""
    folder = Path(dir).resolve()
    results = [sandbox.status(folder / name) for name in _host_names(folder)]
    up_count = sum(r.ok for r in results)
    findings = [
        Finding("ok" if r.ok else "error", name, r.message)
        for name, r in zip(_host_names(folder), results, strict=True)
    ]
    message = f"{up_count} of {len(results)} rehearsal host(s) in {folder} answer SSH"
    return Result(up_count == len(results), message, findings=findings)


# The addresses ``ray start --node-ip-address`` replaces by the machine's own (ray 2.58.0
# python/ray/scripts/scripts.py ``start``: services.resolve_ip_for_localhost; ray/_raylet.so
# is_localhost: "localhost", "127.0.0.1", "::1").
RAY_REPLACES = ("127.0.0.1",)


def ray_kept(first: str) -> str:
    """The first address of a multi-node fleet: ``first``, or the one after it when Ray would
    register a node there under the machine's own address (on a machine with another
    interface, 192.0.2.2 say), where vLLM asks for ``node:127.0.0.1``, which no node has."""
    if first in RAY_REPLACES:
        return str(ipaddress.IPv4Address(first) + 1)
    return first


def consecutive(first: str, count: int) -> list[str]:
    """``count`` loopback addresses from ``first`` on.

    Raises:
        SandboxRequestRefused: ``count`` is below 1, ``first`` is not an IPv4 address, or the
            addresses leave 127.0.0.0/8.
    """
    if count < 1:
        raise SandboxRequestRefused(f"a fleet needs at least one host, not {count}")
    sandbox.check_fleet_size(count)
    try:
        start = ipaddress.IPv4Address(first)
    except ValueError:
        raise SandboxRequestRefused(
            f"{first!r} is not an IPv4 address",
            remedy="use an address in 127.0.0.0/8, such as 127.0.1.1",
        ) from None
    last = start + (count - 1) if int(start) + count - 1 <= int(LAST_LOOPBACK) else None
    if not start.is_loopback or last is None:
        raise SandboxRequestRefused(
            f"{count} hosts from {first} do not fit in 127.0.0.0/8",
            remedy="start from a lower --address, e.g. 127.0.1.1",
        )
    return [str(start + i) for i in range(count)]


def write_deployment(boxes: Sequence[Sandbox], path: Path, *, name: str) -> Path:
    """One deployment file listing ``boxes``: the first one's values at the top, and in each
    host's ``vars`` its own model path, python, server port and paths, and the server
    environment variables its own deployment sets otherwise than the first one's."""
    docs = [yaml.safe_load(box.deployment_path.read_text()) for box in boxes]
    top = dict(docs[0])
    top["name"] = name
    shared_env = _server_env(top)
    top["hosts"] = [{**doc["hosts"][0], "vars": _host_vars(doc, shared_env)} for doc in docs]
    header = f"# {len(boxes)} rehearsal host(s) started by `opsbook sandbox up --hosts`.\n"
    path.write_text(header + yaml.safe_dump(top, sort_keys=False))
    return path


def write_multinode_deployment(boxes: Sequence[Sandbox], path: Path, *, ray_port: int) -> Path:
    """One deployment serving one model across ``boxes``: the fleet's file with a ``cluster``
    section and each host's own ``VLLM_HOST_IP``."""
    write_deployment(boxes, path, name="rehearsal-multinode")
    doc = yaml.safe_load(path.read_text())
    for entry, box in zip(doc["hosts"], boxes, strict=True):
        entry["vars"].setdefault("server", {}).setdefault("env", {})["VLLM_HOST_IP"] = box.address
    doc["server"]["env"]["VLLM_HOST_IP"] = boxes[0].address
    # The hosts share one machine: one CPU and a small object store per Ray node.
    doc["server"]["env"]["OPSBOOK_RAY_NUM_CPUS"] = "1"
    doc["server"]["env"]["OPSBOOK_RAY_OBJECT_STORE_BYTES"] = str(RAY_OBJECT_STORE_BYTES)
    doc["cluster"] = {
        "head": boxes[0].address,
        "tensor_parallel_size": MULTINODE_TP,
        "pipeline_parallel_size": len(boxes),
        "ray_port": ray_port,
        "interface": None,
    }
    header = (
        f"# {len(boxes)} rehearsal host(s) serving one model on a Ray cluster, started by\n"
        "# `opsbook sandbox up --hosts N --multinode`.\n"
    )
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    return path


def hosts_of(dir: Path) -> list[Sandbox]:
    """The running rehearsal hosts of the fleet in ``dir``, in order."""
    folder = Path(dir).resolve()
    return [sandbox.running(folder / name) for name in _host_names(folder)]


# Fault knobs.


def stop_sshd(box: Sandbox) -> None:
    """Make a host unreachable: stop its sshd (by its recorded PID, checked to be its own).

    Raises:
        SandboxError: the recorded PID is not this host's sshd.
    """
    if not sandbox.is_own_sshd(box):
        raise SandboxError(f"PID {box.sshd_pid} is not the sshd of {box.dir}")
    os.kill(box.sshd_pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while sandbox.is_own_sshd(box) and time.monotonic() < deadline:
        time.sleep(0.05)


def make_slow(box: Sandbox, seconds: float) -> None:
    """Make every command on a host take ``seconds`` longer: zsh reads ``~/.zshenv`` before
    each command an SSH session runs."""
    if box.shell != "zsh":
        raise SandboxError("a slow host needs the zsh login shell", remedy="use --shell zsh")
    zshenv = box.home / ".zshenv"
    zshenv.write_text(
        zshenv.read_text() + f"sleep {float(seconds):g}  # opsbook fault: slow host\n"
    )


def truncate_checkpoint(box: Sandbox, shard: int = 1, missing_bytes: int = 4096) -> Path:
    """Give a host a broken checkpoint: cut the end off one shard, as an interrupted copy does.

    Returns:
        The shard that was cut.
    """
    shards = sorted(box.model_path.glob("*.safetensors"))
    target = shards[shard - 1]
    os.truncate(target, max(0, target.stat().st_size - missing_bytes))
    return target


def crash_on_start(box: Sandbox, fault: str = "oom") -> None:
    """Make a host's simulated vLLM fail on its next start with ``fault`` (see
    ``opsbook/rehearsal/sim/vllm/_simconfig.py``; ``oom`` dies during startup with vLLM's
    message)."""
    settings = box.venv / SETTINGS_NAME
    doc: dict[str, Any] = json.loads(settings.read_text()) if settings.exists() else {}
    doc["fault"] = fault
    settings.write_text(json.dumps(doc, indent=2) + "\n")


def _host_vars(doc: dict[str, Any], shared_env: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key_path in HOST_VARS:
        node: Any = doc
        for key in key_path:
            node = copy.deepcopy(node[key])
        target = found
        for key in key_path[:-1]:
            target = target.setdefault(key, {})
        target[key_path[-1]] = node
    # A host's vars replace single variables of the shared environment (the deployment's
    # per-host merge is leaf by leaf): only those that differ need saying.
    own = {k: v for k, v in _server_env(doc).items() if shared_env.get(k) != v}
    if own:
        found.setdefault(HOST_ENV[0], {})[HOST_ENV[1]] = own
    return found


def _server_env(doc: dict[str, Any]) -> dict[str, Any]:
    env = (doc.get(HOST_ENV[0]) or {}).get(HOST_ENV[1]) or {}
    return copy.deepcopy(dict(env))


def _host_names(folder: Path) -> list[str]:
    try:
        names = json.loads((folder / FLEET_FILE).read_text())["hosts"]
    except (OSError, ValueError, KeyError):
        raise SandboxError(
            f"no rehearsal fleet in {folder}",
            remedy="start one with `opsbook sandbox up --hosts N`",
        ) from None
    return [str(n) for n in names]
