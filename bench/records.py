"""Benchmark: ``opsbook records list`` over 1,000 run folders, against ``ls`` and ``jq``.

Writes ``--runs`` run folders as a deploy leaves them for the list to read: ``summary.json``
(a host's six stages with their findings, the recap), ``run.json`` and ``facts.json``, each
folder with its own start time, status and host. Then it times, each in its own process and
taking turns:

* ``opsbook records list --runs-dir D`` (the whole CLI: interpreter start, imports, the read);
* ``opsbook records list --host H --since T`` (the filters read each record too);
* ``ls -1r D | xargs jq`` printing each run's name, status, exit code and message: the plain
  way to list the same folders (when ``jq`` is missing, ``python3 -c`` with json, and the row
  says so).

Goal (issue 35): ``records list`` over 1,000 run folders in under 1 s.

Usage: ``.venv/bin/python bench/records.py [--runs 1000] [--repeat 5] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import benchtable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opsbook.core.facts_schema import (  # noqa: E402
    EngineFacts,
    HostFingerprint,
    HostRunFacts,
    LaunchFacts,
    ModelFacts,
    RunFacts,
    StartupFacts,
)
from opsbook.core.results import Finding, HostResult, State  # noqa: E402
from opsbook.runner import records  # noqa: E402

GOAL = 1.0
OPSBOOK = [sys.executable, "-m", "opsbook"]
STAGES = ("preflight", "download", "config-patch", "launch-script", "launch", "diagnose")
JQ_ROW = "[input_filename, .status, .exit_code, (.message[:100])] | @tsv"
PY_ROW = (
    "import json,sys\n"
    "for p in sys.stdin.read().split():\n"
    " d=json.load(open(p+'/summary.json'))\n"
    " print(p, d['status'], d['exit_code'], d['message'][:100], sep='\\t')"
)


def results_of(host: str) -> list[HostResult]:
    """A deploy's six stages on one host, with findings as the stages write them."""
    findings = tuple(
        Finding(
            "info", f"GPU{i}", "NVIDIA RTX PRO 6000, 97887 MiB, 0 MiB used", source="nvidia-smi"
        )
        for i in range(8)
    )
    return [
        HostResult(host, stage, State.CHANGED if stage == "launch" else State.OK,
                   f"{stage} on {host}: done", findings=findings, duration=1.5)
        for stage in STAGES
    ]  # fmt: skip


def facts_of(name: str, host: str, started: str) -> RunFacts:
    one = HostRunFacts(
        fingerprint=HostFingerprint(gpus=["NVIDIA RTX PRO 6000"] * 8, driver="595.58.03",
                                    cuda="13.2", kernel="6.8.0-60-generic", cpu="64"),
        engine=EngineFacts(vllm="0.15.1", torch="2.9.1", kv_cache_dtype="auto"),
        model=ModelFacts(path="/models/Kimi-K2.5-NVFP4", manifest_digest="fb397be25139e739",
                         shards=119),
        launch=LaunchFacts(flags={"tensor-parallel-size": "8"}, env_names=["NCCL_P2P_LEVEL"]),
        startup=StartupFacts(state="ready", load_s=212.0, compile_s=48.5, ready_s=301.2),
        state="ready",
    )  # fmt: skip
    return RunFacts(run=name, deployment="/etc/opsbook/kimi.yml", started=started,
                    status="ok", hosts={host: one})  # fmt: skip


def write_runs(runs_dir: Path, count: int) -> None:
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    for i in range(count):
        when = start + timedelta(hours=i)
        host = f"ops@gpu-{i % 20:02d}:22"
        name = f"{when:%Y%m%dT%H%M%SZ}-deploy-gpu-{i % 20:02d}"
        folder = runs_dir / name
        folder.mkdir()
        results = results_of(host)
        status = "ok" if i % 7 else "problem found"
        summary = records.RunSummary(
            name="kimi", deployment="/etc/opsbook/kimi.yml", started=when.isoformat(),
            status=status, exit_code=0 if i % 7 else 1, message="all 1 host(s) ok",
            duration=320.0, parameters={"deployment": "/etc/opsbook/kimi.yml", "apply": "True"},
            hosts=[host], stages=list(STAGES), results=results, notebooks=[],
        )  # fmt: skip
        doc = records.summary_doc(summary)
        (folder / records.SUMMARY).write_text(json.dumps(doc, indent=2, default=str) + "\n")
        (folder / "run.json").write_text(json.dumps({"status": status}) + "\n")
        (folder / "facts.json").write_text(facts_of(name, host, when.isoformat()).to_json())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="run folders written")
    parser.add_argument("--repeat", type=int, default=5, help="times per command (median kept)")
    parser.add_argument("--keep", action="store_true", help="keep the folders written")
    args = parser.parse_args()
    benchtable.as_installed()
    where = Path(tempfile.mkdtemp(prefix="opsbook-bench-records-"))
    try:
        runs_dir = where / "runs"
        runs_dir.mkdir()
        write_runs(runs_dir, args.runs)
        listed = [*OPSBOOK, "records", "list", "--runs-dir", str(runs_dir)]
        filtered = [*listed, "--host", "gpu-03", "--since", "2026-01-20"]
        if shutil.which("jq"):
            plain_label = "ls + jq"
            plain = ["sh", "-c", f"cd {runs_dir} && ls -1r | sed 's|$|/summary.json|' | "
                     f"xargs jq -r '{JQ_ROW}'"]  # fmt: skip
        else:
            plain_label = "ls + python3 -c json (jq is not installed)"
            plain = ["sh", "-c", f'cd {runs_dir} && ls -1r | python3 -c "{PY_ROW}"']
        timed = benchtable.interleaved(args.repeat, listed, filtered, plain)
        (ours, code), (ours_filtered, code_f), (base, base_code) = timed
        benchtable.header(f"records list over {args.runs} run folders (medians of {args.repeat})")
        for label, seconds, exit_code in (
            ("`opsbook records list`", ours, code),
            ("`opsbook records list --host gpu-03 --since 2026-01-20`", ours_filtered, code_f),
        ):
            benchtable.row(
                f"{label}, exit {exit_code}",
                benchtable.seconds(seconds),
                f"{plain_label} {benchtable.seconds(base)} (exit {base_code})",
                seconds / base,
                f"< {GOAL:g} s: {benchtable.verdict(seconds < GOAL)}",
            )
        return 0 if code == 0 and code_f == 0 else 1
    finally:
        if args.keep:
            print(f"kept {where}")
        else:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
