"""Benchmark: the scheduled health check of a host and of a fleet, against plain ssh + curl.

Starts a rehearsal host of its own (127.0.4.x) with a server deployed and ready, and a
rehearsal fleet of four hosts whose servers were never started; takes both down at the end.
Each command runs in its own process, ``--runs`` times, taking turns; medians are printed:

* ``opsbook check -f D``: the diagnose stage in-process over one SSH connection per host
  (interpreter start, imports, connection, one status probe that also asks ``/health``);
* the plain way: ``ssh host 'pgrep -f "vllm serve" && curl -s localhost:PORT/health'``
  (for the fleet, one such ssh per host, all at once, as ``xargs -P`` or a shell ``&`` would);
* secondary lines: ``opsbook run 05_diagnose`` (the notebook: a kernel, papermill, a run
  folder), as the cron job was before, and ``opsbook check --record``;
* for one host, the plain way over a reused SSH connection (``ssh -o ControlMaster=auto -o
  ControlPath=...``, the master opened before): what an operator with a ControlMaster in
  their ssh config pays. ``opsbook check`` opens its own connection each time (paramiko has
  no ControlMaster; a check is one process), so this line has no goal: it says what the
  handshake costs.

Goal (issue 16): ``opsbook check`` at most 3x the plain way, for one host and for the fleet.

Usage: ``.venv/bin/python bench/health.py [--runs 5] [--address 127.0.4.10]``
"""

from __future__ import annotations

import argparse
import ipaddress
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import benchtable
import plainways

from opsbook.core.deployment import HostSpec, load_deployment
from opsbook.rehearsal import fleet as fleets
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.runner import run

GOAL = 3.0
ROOT = Path(__file__).resolve().parents[1]
OPSBOOK = [sys.executable, "-m", "opsbook"]


def plain_ssh(spec: HostSpec, port: int, control: Path | None = None) -> list[str]:
    remote = f"pgrep -u \"$(id -u)\" -f 'vllm serve' >/dev/null && curl -s localhost:{port}/health"
    return [*plainways.ssh_argv(spec, control), remote]


def reused_connection(spec: HostSpec, deployment: Path, port: int, runs: int, work: Path) -> None:
    """``opsbook check`` against the plain way over a ControlMaster opened beforehand."""
    control = work / "plain.ctl"
    plainways.open_master(spec, control)
    try:
        check = [*OPSBOOK, "check", "-f", str(deployment)]
        (ours, _), (base, _) = benchtable.interleaved(runs, check, plain_ssh(spec, port, control))
    finally:
        plainways.close_master(spec, control)
    benchtable.row(
        "  secondary: health check, 1 host, plain over a reused connection (ControlMaster)",
        benchtable.seconds(ours),
        f"ssh -o ControlPath + pgrep + curl {benchtable.seconds(base)}",
        ours / base,
        "(no goal: opsbook opens a connection per check)",
    )


def plain_fleet(deployment: Path) -> list[str]:
    """One ssh per host, all at once, in one shell: what an operator's cron line would do."""
    dep = load_deployment(deployment)
    lines = [shlex.join(plain_ssh(h, dep.server_port)) + " &" for h in dep.hosts]
    return ["bash", "-c", "\n".join([*lines, "wait"])]


def compare(label: str, deployment: Path, plain: list[str], runs: int, work: Path) -> None:
    check = [*OPSBOOK, "check", "-f", str(deployment)]
    record = [*check, "--record", "--runs-dir", str(work / "runs")]
    notebook = [*OPSBOOK, "run", "05_diagnose", "-f", str(deployment), "--runs-dir"]
    notebook.append(str(work / "runs"))
    (ours, code), (base, _) = benchtable.interleaved(runs, check, plain)
    goal = f"<= {GOAL:g}x: {benchtable.verdict(ours <= GOAL * base)}"
    benchtable.row(
        f"health check, {label} (`opsbook check`, exit {code})",
        benchtable.seconds(ours),
        f"ssh + pgrep + curl {benchtable.seconds(base)}",
        ours / base,
        goal,
    )
    (slow, slow_code), (recorded, _) = benchtable.interleaved(max(1, runs // 2), notebook, record)
    benchtable.row(
        f"  secondary: `opsbook run 05_diagnose`, {label} (exit {slow_code})",
        benchtable.seconds(slow),
        benchtable.seconds(base),
        slow / base,
        "(the notebook: was 18.6x)",
    )
    benchtable.row(
        f"  secondary: `opsbook check --record`, {label}",
        benchtable.seconds(recorded),
        benchtable.seconds(base),
        recorded / base,
        "(a record is asked for)",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per command (median kept)")
    parser.add_argument("--address", default="127.0.4.10", help="the host's loopback address")
    parser.add_argument("--fleet", type=int, default=4, help="hosts in the fleet (0: none)")
    args = parser.parse_args()
    benchtable.as_installed()
    work = Path(tempfile.mkdtemp(prefix="opsbook-bench-health-", dir="/tmp"))
    work.chmod(0o755)  # the rehearsal hosts' users must enter it
    fleet_address = str(ipaddress.ip_address(args.address) + 10)
    try:
        started = time.monotonic()
        box = sandboxes.up(work / "box", address=args.address, port=44110, server_port=44180)
        deployed = run.run_deploy(box.deployment_path, work / "runs")
        print(
            f"rehearsal host up and deployed ({deployed.status}) in "
            f"{time.monotonic() - started:.1f} s"
        )
        benchtable.header("health check: opsbook vs ssh + pgrep + curl (medians, one run)")
        spec = load_deployment(box.deployment_path).host
        compare(
            "1 host, ready", box.deployment_path, plain_ssh(spec, box.server_port), args.runs, work
        )
        reused_connection(spec, box.deployment_path, box.server_port, args.runs, work)
        if args.fleet:
            fleet = fleets.up(work / "fleet", hosts=args.fleet, address=fleet_address)
            compare(
                f"fleet of {args.fleet}, never started",
                fleet.deployment_path,
                plain_fleet(fleet.deployment_path),
                args.runs,
                work,
            )
    finally:
        if (work / "fleet").exists():
            fleets.down(work / "fleet")
        if (work / "box").exists():
            sandboxes.down(work / "box")
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
