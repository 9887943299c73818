"""Benchmark: the whole runbook (``opsbook run deploy``) against the same steps as one shell
script over ssh, on a rehearsal host of its own (127.0.4.60).

The plain script is what a competent operator would write for the same job, run with one
``ssh host bash -s``: preflight (``nvidia-smi``, ``df``, the interpreter and vLLM versions),
the download check (one ``python3 -`` script: sizes against safetensors headers), the config
patch (the FP8 KV-cache keys removed, with a backup, when present), the launch script
(opsbook's own rendering, written and checked with ``bash -n``), the launch (detached, its
log appended), the wait for ``/health``, a completion as smoke test, and a last health check.

Both start from the same state: the server stopped (outside the timing) and the
checkpoint already patched (a first, untimed opsbook deploy does it). Runs take turns;
medians are printed with the ratio and issue 16's goal (at most 2x), and opsbook's own
per-stage times from its record.

Then, the server up and ready (issue 37), each pair taking turns in the same run:

* a deploy with nothing to do (``opsbook run deploy`` on the ready, unchanged host, which the
  last deploy noted as settled: one status of the host, no stage) against ``opsbook check`` of
  the same host: the health check is what an operator runs to learn that nothing needs doing
  (goal: at most 2x);
* a dry-run deploy that runs every stage (``-p apply false -p recheck true``: a settled host
  would otherwise be answered without them) against its remote work: the same six stages run in
  one process over connections kept from stage to stage (``stages.run_stage``, as the
  deploy's shared kernel keeps them), with no kernel, no notebook and no record; the ratio is
  the notebook path's fixed cost (goal: at most 1.5x). The remote commands' own seconds, from
  the dry run's journal, are printed beside it.

Usage: ``.venv/bin/python bench/deploy.py [--runs 5] [--address 127.0.4.60]``
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchtable

from opsbook.core.deployment import Deployment, load_deployment
from opsbook.rehearsal import sandbox as sandboxes
from opsbook.remote.hosts import Host
from opsbook.runner import run
from opsbook.steps import server
from opsbook.steps.script import render_script

GOAL = 2.0
GOAL_NO_OP = 2.0
GOAL_DRY = 1.5
# The deploy's stages in one process, over the connections kept from stage to stage (the
# environment sets that, as the runner does for its kernel) and with the run's facts readings
# passed to the stages that take them: the dry run's remote work, the same reads.
IN_PROCESS = """
import dataclasses, sys
from opsbook import stages
from opsbook.core.deployment import load_deployment
from opsbook.steps.host_facts import RunReadings
stages.import_runbook()
dep = load_deployment(sys.argv[1])
readings = RunReadings()  # preflight's reading serves 02, as in the deploy's kernel
for stage in (*stages.DEPLOY, stages.DIAGNOSE):
    names = {f.name for f in dataclasses.fields(stage.options_type)}
    options = {"apply": False} if "apply" in names else {}
    if "readings" in names:
        options["readings"] = readings
    done = stages.run_stage(stage, dep, on_result=None, **options)
    if any(r.state.value in ("failed", "unreachable") for r in done.results):
        sys.exit(f"{stage.name}: {[r.message for r in done.results]}")
"""
PLAIN_PID = "plain.pid"

PLAIN = r"""
set -euo pipefail
M=@MODEL@; S=@SCRIPT@; L=@LOG@; P=@PORT@; V=@PYTHON@; ST=@STATE@
# preflight
nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used --format=csv,noheader >/dev/null
df -h "$M" /dev/shm >/dev/null
python3 --version >/dev/null
"$V" -c 'import vllm, sys; print(vllm.__version__)' >/dev/null
# download check: every shard's size against its safetensors header
python3 - "$M" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
bad = []
for n in sorted(n for n in os.listdir(d) if n.endswith(".safetensors")):
    p = os.path.join(d, n)
    size = os.stat(p).st_size
    with open(p, "rb") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(length))
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    if size != 8 + length + end:
        bad.append(n)
sys.exit("bad shards: " + " ".join(bad) if bad else 0)
PY
# config patch: no FP8 KV cache (backups kept)
python3 - "$M" <<'PY'
import json, os, shutil, sys
d = sys.argv[1]
for name, paths in (("config.json", [("quantization_config", "kv_cache_scheme"),
                                     ("quantization_config", "kv_cache_quant_algo")]),
                    ("hf_quant_config.json", [("quantization", "kv_cache_quant_algo")])):
    path = os.path.join(d, name)
    doc = json.load(open(path))
    changed = False
    for parent, key in paths:
        section = doc.get(parent) or {}
        if section.get(key) is not None:
            section.pop(key)
            changed = True
    if changed:
        shutil.copy2(path, path + ".bak")
        json.dump(doc, open(path, "w"), indent=2)
PY
# launch script
cat > "$S" <<'SH'
@LAUNCH_SCRIPT@SH
chmod 755 "$S"
bash -n "$S"
# launch, detached
mkdir -p "$ST"
setsid nohup "$S" >> "$L" 2>&1 < /dev/null &
echo $! > "$ST/@PID_FILE@"
for i in $(seq 3000); do
  curl -sf "localhost:$P/health" >/dev/null && break
  kill -0 "$(cat "$ST/@PID_FILE@")" || { echo "the server died" >&2; exit 1; }
  sleep 0.1
done
# smoke test
curl -sf "localhost:$P/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$M\", \"prompt\": \"hello\", \"max_tokens\": 8}" >/dev/null
# diagnose
pgrep -u "$(id -u)" -f 'vllm serve' >/dev/null && curl -sf "localhost:$P/health"
"""


def plain_script(dep: Deployment, paths: server.LaunchPaths) -> str:
    values = {
        "model": dep.model_path,
        "script": paths.script,
        "log": paths.log,
        "port": str(dep.server_port),
        "python": dep.python,
        "state": paths.state_dir,
    }
    text = PLAIN.replace("@LAUNCH_SCRIPT@", render_script(dep)).replace("@PID_FILE@", PLAIN_PID)
    for name, value in values.items():
        text = text.replace(f"@{name.upper()}@", shlex.quote(value))
    return text


def ssh(dep: Deployment) -> list[str]:
    spec = dep.host
    command = ["ssh", "-i", str(spec.key), "-o", f"UserKnownHostsFile={spec.known_hosts}"]
    return [*command, "-o", "BatchMode=yes", "-p", str(spec.port), f"{spec.user}@{spec.address}"]


def stop_all(host: Host, paths: server.LaunchPaths) -> None:
    """Stop opsbook's server (its record) and the plain script's (its PID file), by id."""
    server.stop_server(host, paths, grace=5)
    pid_file = Path(paths.state_dir) / PLAIN_PID
    if pid_file.exists():
        pid = int(pid_file.read_text())
        pid_file.unlink()
        try:
            os.killpg(pid, signal.SIGTERM)  # setsid made the script's PID its group's id
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs each (median kept)")
    parser.add_argument("--address", default="127.0.4.60")
    args = parser.parse_args()
    benchtable.as_installed()
    work = Path(tempfile.mkdtemp(prefix="opsbook-bench-deploy-", dir="/tmp"))
    work.chmod(0o755)
    ours: list[float] = []
    plain: list[float] = []
    stage_times: dict[str, list[float]] = {}
    try:
        box = sandboxes.up(work / "box", address=args.address, port=44160, server_port=44181)
        dep = load_deployment(box.deployment_path)
        first = run.run_deploy(box.deployment_path, work / "runs")
        print(f"rehearsal host up; first deploy (untimed, patches the checkpoint): {first.status}")
        command = [sys.executable, "-m", "opsbook", "run", "deploy", "-f", str(box.deployment_path)]
        command += ["--runs-dir", str(work / "runs")]
        with Host.from_deployment(dep) as host:
            paths = server.resolve_paths(host, dep)
            script = plain_script(dep, paths)
            for _ in range(args.runs):
                stop_all(host, paths)
                started = time.perf_counter()
                done = subprocess.run(command, capture_output=True, text=True)
                ours.append(time.perf_counter() - started)
                if done.returncode != 0:
                    print(done.stdout[-2000:], done.stderr[-2000:])
                    raise SystemExit(f"opsbook run deploy exited {done.returncode}")
                collect_stage_times(done.stdout, stage_times)
                stop_all(host, paths)
                started = time.perf_counter()
                done = subprocess.run(
                    [*ssh(dep), "bash -s"], input=script, capture_output=True, text=True
                )
                plain.append(time.perf_counter() - started)
                if done.returncode != 0:
                    raise SystemExit(f"the plain script failed: {done.stderr[-2000:]}")
            stop_all(host, paths)
            ready = run.run_deploy(box.deployment_path, work / "runs")
            print(f"server started again for the rows below: {ready.status}")
            no_op, dry = with_server_ready(box.deployment_path, work, args.runs)
            stop_all(host, paths)
    finally:
        sandboxes.down(work / "box")
        shutil.rmtree(work, ignore_errors=True)
    mine, theirs = statistics.median(ours), statistics.median(plain)
    benchtable.header("deploy end to end: opsbook run deploy vs the same steps as one ssh script")
    benchtable.row(
        "deploy end to end (6 stages)",
        benchtable.seconds(mine),
        f"one ssh script {benchtable.seconds(theirs)}",
        mine / theirs,
        f"<= {GOAL:g}x: {benchtable.verdict(mine <= GOAL * theirs)}",
    )
    (ours_no_op, check), (ours_dry, in_process, remote) = no_op, dry
    benchtable.row(
        "deploy with nothing to do (ready, unchanged host)",
        benchtable.seconds(ours_no_op),
        f"opsbook check {benchtable.seconds(check)}",
        ours_no_op / check,
        f"<= {GOAL_NO_OP:g}x: {benchtable.verdict(ours_no_op <= GOAL_NO_OP * check)}",
    )
    benchtable.row(
        "dry-run deploy, every stage (-p apply false -p recheck true)",
        benchtable.seconds(ours_dry),
        f"its stages in one process {benchtable.seconds(in_process)}",
        ours_dry / in_process,
        f"<= {GOAL_DRY:g}x: {benchtable.verdict(ours_dry <= GOAL_DRY * in_process)}",
    )
    print(f"the dry run's remote commands (journal, median): {remote:.2f} s")
    shown = ", ".join(f"{k} {statistics.median(v):.1f} s" for k, v in stage_times.items())
    print(f"opsbook's stages (median of the record's durations): {shown}")
    return 0


def with_server_ready(
    deployment: Path, work: Path, runs: int
) -> tuple[tuple[float, float], tuple[float, float, float]]:
    """Medians of a no-op deploy and ``opsbook check``, then of a dry-run deploy, its stages
    in one process, and the remote commands of its journal."""
    deploy = [sys.executable, "-m", "opsbook", "run", "deploy", "-f", str(deployment)]
    deploy += ["--runs-dir", str(work / "runs")]
    check = [sys.executable, "-m", "opsbook", "check", "-f", str(deployment)]
    (no_op, code), (health, _) = benchtable.interleaved(runs, deploy, check)
    if code != 0:
        raise SystemExit(f"the deploy with nothing to do exited {code}")
    journal = work / "in-process.jsonl"
    in_process = ["env", "OPSBOOK_KEEP_CONNECTIONS=1", f"OPSBOOK_JOURNAL={journal}"]
    in_process += [sys.executable, "-c", IN_PROCESS, str(deployment)]
    every_stage = [*deploy, "-p", "apply", "false", "-p", "recheck", "true"]
    (dry, code), (alone, code_alone) = benchtable.interleaved(runs, every_stage, in_process)
    if code != 0 or code_alone != 0:
        raise SystemExit(f"the dry runs exited {code} (opsbook) and {code_alone} (in process)")
    return (no_op, health), (dry, alone, remote_seconds(work / "runs"))


def remote_seconds(runs: Path) -> float:
    """The median over the dry runs' journals of their remote commands' seconds."""
    sums = []
    for summary in runs.glob("*/summary.json"):
        if json.loads(summary.read_text()).get("dry_run"):
            lines = (summary.parent / "journal.jsonl").read_text().splitlines()
            sums.append(sum(json.loads(line)["duration"] for line in lines))
    return statistics.median(sums) if sums else float("nan")


def collect_stage_times(stdout: str, into: dict[str, list[float]]) -> None:
    """The per-stage seconds from the run's summary.json, named in its last lines."""
    folder = next(
        (line.split(": ", 1)[1] for line in stdout.splitlines() if line.startswith("run folder:")),
        None,
    )
    if folder is None:
        return
    summary = json.loads((Path(folder) / "summary.json").read_text())
    for entry in summary.get("notebooks", []):
        into.setdefault(entry["stage"], []).append(float(entry["duration"]))


if __name__ == "__main__":
    sys.exit(main())
