"""A simulated engine core that stops answering (SIGSTOP, or the engine-hang fault): /health
stays 200, requests stay running, the token counter stands still, and opsbook's watch of
/metrics calls it hung; an idle server is not."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from opsbook.knowledge import vllm_facts
from opsbook.remote.testing import LocalHost
from opsbook.steps import metrics
from tests.unit.test_vllm_sim import (  # noqa: F401
    READY,
    Launch,
    fp8_checkpoint,
    get,
    group_pids,
    launches,
    remove_kv_keys,
    serve,
    sim_dir,
)

# The bound: a stopped engine core under load is named within 30 s.
WITHIN_SECONDS = 30.0
# Past the simulated API server's patience with a silent engine core (ENGINE_SILENT_SECONDS):
# the simulation answers at once, so requests sent before would be answered.
SILENCE_NOTICED = 1.0


def started(venv: Path, sim: Path, tmp_path: Path, launches: list[Launch], **env: str) -> int:  # noqa: F811
    model = fp8_checkpoint(tmp_path)
    remove_kv_keys(model)
    args = ("--trust-remote-code", "--served-model-name", "m", "--max-model-len", "4096")
    launch, port = serve(venv, sim, model, launches, *args, **env)
    launch.wait_for(READY)
    return port


def engine_core_pid(launch: Launch) -> int:
    for pid in group_pids(launch.pgid):
        if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"VLLM::EngineCore"):
            return pid
    raise AssertionError("no VLLM::EngineCore process in the server's group")


def complete(port: int) -> None:
    """One completion that waits as long as the engine stalls (the test's bound, not 10 s)."""
    body = json.dumps({"model": "m", "prompt": "a long answer please", "max_tokens": 64})
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body.encode(), method="POST"
    )
    request.add_header("Content-Type", "application/json")
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()


def send_requests(port: int, count: int) -> list[threading.Thread]:
    threads = [threading.Thread(target=complete, args=(port,), daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def until_running(port: int, count: int, timeout: float = 10.0) -> None:
    """Wait until the server counts ``count`` requests in flight."""
    deadline = time.monotonic() + timeout
    while metrics.read_metrics(LocalHost(), port).running != count:
        assert time.monotonic() < deadline, f"{count} requests never ran"
        time.sleep(0.1)


def test_an_idle_server_is_idle_not_hung(
    venv: Path,
    sim_dir: Path,  # noqa: F811
    tmp_path: Path,
    launches: list[Launch],  # noqa: F811
) -> None:
    port = started(venv, sim_dir, tmp_path, launches)
    watch = metrics.watch_generation(LocalHost(), port, stall_seconds=2.0, interval=0.2)
    assert watch.verdict == metrics.IDLE
    assert watch.message == "no request running or waiting (idle)"


def test_a_sigstopped_engine_core_under_load_is_hung_within_30_s_health_200(
    venv: Path,
    sim_dir: Path,  # noqa: F811
    tmp_path: Path,
    launches: list[Launch],  # noqa: F811
) -> None:
    port = started(venv, sim_dir, tmp_path, launches)
    core = engine_core_pid(launches[0])
    os.kill(core, signal.SIGSTOP)
    try:
        time.sleep(SILENCE_NOTICED)
        threads = send_requests(port, 3)
        until_running(port, 3)
        started_at = time.monotonic()
        watch = metrics.watch_generation(LocalHost(), port)
        took = time.monotonic() - started_at
        assert get(port, "/health")[0] == 200
    finally:
        os.kill(core, signal.SIGCONT)
    assert watch.verdict == metrics.HUNG, watch.message
    assert took < WITHIN_SECONDS
    assert watch.last.running == 3.0
    assert watch.last.generation_tokens == watch.first.generation_tokens
    assert "3 request(s) running and 0 waiting" in watch.message
    # Once the engine core answers again the requests finish and the server is idle.
    for thread in threads:
        thread.join(10)
    after = metrics.read_metrics(LocalHost(), port)
    assert after.idle and after.generation_tokens == 3 * 12


def test_the_engine_hang_fault_stalls_generation_without_a_signal(
    venv: Path,
    sim_dir: Path,  # noqa: F811
    tmp_path: Path,
    launches: list[Launch],  # noqa: F811
) -> None:
    port = started(venv, sim_dir, tmp_path, launches, OPSBOOK_SIM_FAULT="engine-hang")
    time.sleep(SILENCE_NOTICED)
    send_requests(port, 2)
    until_running(port, 2)
    watch = metrics.watch_generation(LocalHost(), port, stall_seconds=3.0, interval=0.5)
    assert watch.verdict == metrics.HUNG, watch.message
    assert watch.last.running == 2.0 and watch.last.generation_tokens == 0.0
    assert get(port, "/health")[0] == 200


@pytest.mark.parametrize("version", ["0.10.2", "0.32.0"])
def test_the_sim_exports_the_names_of_the_release_it_plays(
    venv: Path,
    sim_dir: Path,  # noqa: F811
    tmp_path: Path,
    launches: list[Launch],  # noqa: F811
    version: str,
) -> None:
    port = started(venv, sim_dir, tmp_path, launches, OPSBOOK_SIM_VLLM_VERSION=version)
    get(port, "/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 4})
    snapshot = metrics.read_metrics(LocalHost(), port, names=metrics.names_for(version))
    assert snapshot.generation_tokens == 4.0 and snapshot.idle
    exported = {s for m in vllm_facts.load(version).exported_metrics().values() for s in m.samples}
    assert set(snapshot.samples) <= exported
