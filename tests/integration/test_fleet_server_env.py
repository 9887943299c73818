"""Each host of a rehearsal fleet on the real-vLLM tier launches with its own server environment:
its own ``VLLM_CACHE_ROOT`` (issue 30: the fleet's hosts shared the first one's).

Two rehearsal hosts at 127.0.1.41-42 on the real-vLLM tier; each host's launch script is
written from the fleet's deployment file and started the way 04_launch starts it, and the
environment of the process that runs is read on the host, then the server is stopped: no wait
for readiness, the real servers of the other tests do that.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsbook.core.deployment import load_deployment
from opsbook.rehearsal import fleet as fleets
from opsbook.rehearsal import real_vllm
from opsbook.rehearsal.fleet import Fleet
from opsbook.remote.hosts import Host
from opsbook.steps import script, server

pytestmark = [pytest.mark.integration, pytest.mark.realvllm]

ADDRESS = "127.0.1.41"


@pytest.fixture(scope="module")
def real_fleet() -> Iterator[Fleet]:
    real_vllm.ensure_tier()
    folder = Path(tempfile.mkdtemp(prefix="opsbook-fleetenv-", dir="/tmp"))
    # The hosts' login users must enter the folder to reach their own.
    folder.chmod(0o755)
    try:
        yield fleets.up(folder, hosts=2, address=ADDRESS, vllm="real")
    finally:
        fleets.down(folder)
        shutil.rmtree(folder, ignore_errors=True)


def launched_env(host: Host, pid: int) -> dict[str, str]:
    done = host.run(f"tr '\\0' '\\n' < /proc/{int(pid)}/environ", label="read the environment")
    assert done.ok, done.stderr
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def test_each_host_launches_with_its_own_vllm_cache_root(real_fleet: Fleet) -> None:
    dep = load_deployment(real_fleet.deployment_path)
    roots = []
    for spec, box in zip(dep.hosts, real_fleet.hosts, strict=True):
        view = dep.for_host(spec)
        with Host(spec, view.secret_values()) as host:
            assert script.upload_script(host, view, script.render_script(view)).ok
            paths = server.resolve_paths(host, view)
            started = server.start_server(host, paths, view.server_port)
            try:
                assert started.ok, started.message
                assert started.record is not None
                env = launched_env(host, started.record.pid)
            finally:
                server.stop_server(host, paths, grace=10)
        # The cache root the host's own sandbox gave it: under that host's folder.
        assert env["VLLM_CACHE_ROOT"].startswith(str(box.dir)), env["VLLM_CACHE_ROOT"]
        roots.append(env["VLLM_CACHE_ROOT"])
    assert len(set(roots)) == 2, roots
