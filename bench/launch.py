"""Benchmark: time from the launch call to a verdict, vs the incident's fixed wait.

Starts a rehearsal host of its own (and takes it down at the end), then launches three ways
with ``start_server`` + ``wait_until_ready`` and times each until the verdict:

- never started: the launch script is missing, then not executable;
- crashed at once: the synthetic Kimi-K2.5-NVFP4 checkpoint as downloaded (its config asks
  for an FP8 KV cache, which TRITON_MLA cannot hold);
- ready: the same checkpoint after the config patch.

The plain way is the incident's: launch, ``sleep 45``, then look by hand (``ls log*; ps aux |
grep vllm``). Its time to any verdict is at least 45 s; the ratio printed for each failure is
45 s over opsbook's time to the verdict (the 45 s are not slept here). For the ready case the
simulator's configured startup time is printed next to the measured time to ready.

Usage: ``.venv/bin/python bench/launch.py [--startup-seconds 3] [--address 127.0.0.6]``
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from opsbook import launch, patch
from opsbook import sandbox as sandboxes
from opsbook.deployment import Deployment, load_deployment
from opsbook.hosts import Host
from opsbook.results import Result
from opsbook.script import render_script, upload_script

PLAIN_WAIT = 45.0
READY_TIMEOUT = 120.0


def time_to_verdict(host: Host, paths: launch.LaunchPaths, port: int) -> tuple[float, Result]:
    """Seconds from the launch call to the verdict, and the verdict."""
    began = time.perf_counter()
    verdict = launch.start_server(host, paths, port)
    if verdict.ok:
        verdict = launch.wait_until_ready(host, paths, port, timeout=READY_TIMEOUT, interval=0.25)
    return time.perf_counter() - began, verdict


def prepare_missing(host: Host, dep: Deployment, paths: launch.LaunchPaths) -> None:
    host.run(f"rm -f -- {shlex.quote(paths.script)}", check=True)


def prepare_not_executable(host: Host, dep: Deployment, paths: launch.LaunchPaths) -> None:
    host.upload(paths.script, render_script(dep), mode=0o644)


def prepare_unpatched(host: Host, dep: Deployment, paths: launch.LaunchPaths) -> None:
    patch.restore_patch(host, dep.model_path)
    upload_script(host, dep, render_script(dep))


def prepare_patched(host: Host, dep: Deployment, paths: launch.LaunchPaths) -> None:
    texts = patch.read_configs(host, dep.model_path)
    plan = patch.plan_patch(texts, patch.fp8_kv_cache_edits(texts))
    applied = patch.apply_patch(host, dep.model_path, plan, apply=True)
    if not applied.ok:
        raise SystemExit(f"the config patch failed: {applied}")
    upload_script(host, dep, render_script(dep))


CASES: list[tuple[str, Callable[[Host, Deployment, launch.LaunchPaths], None]]] = [
    ("never started (script missing)", prepare_missing),
    ("never started (not executable)", prepare_not_executable),
    ("crashed at once (FP8 KV cache)", prepare_unpatched),
    ("ready (after the config patch)", prepare_patched),
]


def run_cases(box: sandboxes.Sandbox) -> list[tuple[str, float, Result]]:
    dep = load_deployment(box.deployment_path)
    rows = []
    with Host.from_deployment(dep) as host:
        paths = launch.resolve_paths(host, dep)
        try:
            for name, prepare in CASES:
                launch.stop_server(host, paths, grace=5)
                prepare(host, dep, paths)
                seconds, verdict = time_to_verdict(host, paths, dep.server_port)
                rows.append((name, seconds, verdict))
        finally:
            launch.stop_server(host, paths, grace=5)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--startup-seconds", type=float, default=3.0)
    parser.add_argument("--address", default="127.0.0.6")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="opsbook-bench-launch-", dir="/tmp"))
    # The test's own folder: the sandbox keeps an existing folder's mode.
    folder.chmod(0o755)
    try:
        began = time.perf_counter()
        box = sandboxes.up(folder, address=options.address)
        settings = box.venv / "opsbook-vllm-sim.json"
        stored = json.loads(settings.read_text()) if settings.exists() else {}
        stored.update({"startup_seconds": options.startup_seconds, "fault": None})
        settings.write_text(json.dumps(stored))
        settings.chmod(0o644)
        print(
            f"rehearsal host up in {time.perf_counter() - began:.1f} s "
            f"(simulated vLLM startup: {options.startup_seconds:g} s)"
        )
        rows = run_cases(box)
    finally:
        sandboxes.down(folder)
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{'case':<32} {'opsbook':>8}  {'plain':>6}  {'ratio':>6}  verdict")
    for name, seconds, verdict in rows:
        if verdict.ok:
            ratio = f"(startup {options.startup_seconds:g} s)"
            print(f"{name:<32} {seconds:7.2f}s  {'':>6}  {'':>6}  {verdict.message} {ratio}")
        else:
            message = verdict.message.replace(str(folder), "<sandbox>")
            print(
                f"{name:<32} {seconds:7.2f}s  {PLAIN_WAIT:5.0f}s  {PLAIN_WAIT / seconds:5.1f}x"
                f"  {message[:100]}"
            )


if __name__ == "__main__":
    main()
