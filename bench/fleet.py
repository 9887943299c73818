"""Benchmark: wall time of a fleet stage on 1, 4 and 16 rehearsal hosts, and the 16:1 ratio.

Starts a rehearsal fleet of 16 hosts of its own (each its own sshd on its own loopback address)
and takes it down at the end. For 1, 4 and 16 of them, it times the product's own path,
``opsbook run 00_preflight`` and ``opsbook run 05_diagnose`` (papermill, one kernel per stage,
the hosts fanned out over ``--forks`` threads in it), and, to show where the time goes, the
stage's fan-out alone (:func:`opsbook.stages.run_stage` in this process). Each figure is the
best of ``--repeat`` runs. Goal: 16 hosts in at most 2.0 x the time of one, for both stages:
the round trip, not the host count, should set the time.

The plain way, measured in the same run on the same hosts: one ``ssh`` per host, all at once
(a shell loop with ``&`` and ``wait``, as ``xargs -P`` would), each running what the stage
reads there: for preflight ``nvidia-smi --query-gpu``, ``df`` and the interpreter's vLLM
version; for diagnose ``pgrep`` of the server and ``curl /health``. Printed: both ways' growth
from 1 to 4 and to 16 hosts (opsbook's on top of its notebook path, which a plain loop has
not: its 1-host time is larger, so the same added time is a smaller growth).

The servers of the fleet are not started, so diagnose answers "never started" on every host,
the same answer for 1 and for 16 hosts. All rehearsal hosts run on this machine: what each one
does on its side (sshd, the probe's python, the simulated nvidia-smi) shares its cores, which
real hosts do not; the CPU-seconds the machine was busy during one fan-out are printed too.

Usage: ``.venv/bin/python bench/fleet.py [--address 127.0.4.101] [--repeat 2] [--forks 16]``
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import benchtable
import plainways

from opsbook import stages
from opsbook.core.deployment import Deployment, HostSpec, load_deployment
from opsbook.rehearsal import fleet as fleets
from opsbook.runner import run

SIZES = (1, 4, 16)
STAGES = ("00_preflight", "05_diagnose")
GOAL = 2.0
# What each stage reads on a host, as an operator would write it (bench/deploy.py's preflight).
PLAIN_READ = {
    "00_preflight": (
        "nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used "
        "--format=csv,noheader; df -h {model} /dev/shm; "
        "{python} -c 'import importlib.metadata as m; print(m.version(\"vllm\"))'"
    ),
    "05_diagnose": (
        "pgrep -u \"$(id -u)\" -f 'vllm serve' >/dev/null && curl -s localhost:{port}/health"
    ),
}


def best_of(repeat: int, timed: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        started = time.monotonic()
        timed()
        times.append(time.monotonic() - started)
    return min(times)


def machine_busy_seconds() -> float:
    """CPU seconds this machine has spent busy, all cores and processes (from /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.4.101", help="the first host's address")
    parser.add_argument("--repeat", type=int, default=2, help="runs per figure (best is kept)")
    parser.add_argument("--forks", type=int, default=16, help="hosts worked on at once")
    args = parser.parse_args()
    benchtable.as_installed()
    work = Path(tempfile.mkdtemp(prefix="opsbook-bench-fleet-", dir="/tmp"))
    work.chmod(0o755)  # the rehearsal hosts' users must enter it
    try:
        started = time.monotonic()
        fleet = fleets.up(work / "fleet", hosts=max(SIZES), address=args.address)
        print(f"{max(SIZES)} rehearsal hosts up in {time.monotonic() - started:.1f} s")
        files = {
            n: fleets.write_deployment(fleet.hosts[:n], work / f"fleet-{n}.yml", name=f"bench-{n}")
            for n in SIZES
        }
        rows = measure(files, work / "runs", args.repeat, args.forks)
        report(rows)
        ratios = [
            rows[(stage, "opsbook run", max(SIZES))] / rows[(stage, "opsbook run", 1)]
            for stage in STAGES
        ]
        return 0 if max(ratios) <= GOAL else 1
    finally:
        fleets.down(work / "fleet")
        shutil.rmtree(work, ignore_errors=True)


def measure(
    files: dict[int, Path], runs: Path, repeat: int, forks: int
) -> dict[tuple[str, str, int], float]:
    rows: dict[tuple[str, str, int], float] = {}
    for stage in STAGES:
        for n, file in files.items():
            rows[(stage, "opsbook run", n)] = best_of(
                repeat, run_cli_path(stage, file, n, runs, forks)
            )
            rows[(stage, "fan-out only", n)] = best_of(repeat, fan_out(stage, file, forks))
            rows[(stage, "plain ssh &", n)] = best_of(repeat, plain_loop(stage, file))
            busy = machine_busy_seconds()
            fan_out(stage, file, forks)()
            rows[(stage, "cpu-s busy", n)] = machine_busy_seconds() - busy
    return rows


def run_cli_path(stage: str, file: Path, hosts: int, runs: Path, forks: int) -> Callable[[], None]:
    def timed() -> None:
        check(run.run_notebook(stage, file, runs_dir=runs, forks=forks), hosts)

    return timed


def fan_out(stage: str, file: Path, forks: int) -> Callable[[], None]:
    dep = load_deployment(file)

    def timed() -> None:
        stages.run_stage(stages.get(stage), dep, forks=forks, on_result=None)

    return timed


def plain_loop(stage: str, file: Path) -> Callable[[], None]:
    """One ssh per host, all at once, in one shell (``&`` and ``wait``)."""
    dep = load_deployment(file)
    lines = [shlex.join(plain_ssh(spec, dep, stage)) + " >/dev/null &" for spec in dep.hosts]
    script = "\n".join([*lines, "wait"])

    def timed() -> None:
        subprocess.run(["bash", "-c", script], check=True)

    return timed


def plain_ssh(spec: HostSpec, dep: Deployment, stage: str) -> list[str]:
    view = dep.for_host(spec)
    read = PLAIN_READ[stage].format(
        model=shlex.quote(view.model_path),
        python=shlex.quote(view.python),
        port=view.server_port,
    )
    return [*plainways.ssh_argv(spec), read]


def check(record: run.RunRecord, hosts: int) -> None:
    if len(record.results) != hosts or any(r.state.value == "unreachable" for r in record.results):
        raise SystemExit(f"{record.notebook}: expected {hosts} reachable hosts: {record.message}")


def report(rows: dict[tuple[str, str, int], float]) -> None:
    print(f"{'stage':<14} {'path':<14} " + " ".join(f"{n:>3} host(s)" for n in SIZES) + "   16:1")
    for stage in STAGES:
        for path in ("opsbook run", "fan-out only", "plain ssh &"):
            times = [rows[(stage, path, n)] for n in SIZES]
            ratio = times[-1] / times[0]
            cells = " ".join(f"{t:9.2f} s" for t in times)
            print(f"{stage:<14} {path:<14} {cells}  {ratio:5.2f}")
    for stage in STAGES:
        busy = [f"{rows[(stage, 'cpu-s busy', n)]:.1f}" for n in SIZES]
        print(
            f"{stage}: one fan-out kept this machine's {os.cpu_count()} cores busy for "
            f"{' / '.join(busy)} CPU-seconds on {' / '.join(map(str, SIZES))} host(s) (every "
            "process, the rehearsal hosts' included: they all share these cores)"
        )
    benchtable.header(f"fleet: a stage on {max(SIZES)} hosts vs on one (the round trip sets it)")
    for stage in STAGES:
        many, one = rows[(stage, "opsbook run", max(SIZES))], rows[(stage, "opsbook run", 1)]
        benchtable.row(
            f"`opsbook run {stage}`, {max(SIZES)} hosts vs 1",
            benchtable.seconds(many),
            f"1 host {benchtable.seconds(one)}",
            many / one,
            f"<= {GOAL}x: {benchtable.verdict(many / one <= GOAL)}",
        )
        for n in SIZES[1:]:
            ours = rows[(stage, "opsbook run", n)] / rows[(stage, "opsbook run", 1)]
            plain = rows[(stage, "plain ssh &", n)] / rows[(stage, "plain ssh &", 1)]
            benchtable.row(
                f"  growth 1 -> {n} hosts, `opsbook run {stage}` vs one ssh per host at once",
                f"{ours:.2f}x",
                f"ssh & + wait {plain:.2f}x",
                None,
                f"(plain 1 host {benchtable.seconds(rows[(stage, 'plain ssh &', 1)])})",
            )


if __name__ == "__main__":
    raise SystemExit(main())
