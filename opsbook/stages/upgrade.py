"""Upgrade on one host: a new vLLM beside the old one, predicted before anything stops,
switched, qualified against last good, and rolled back by itself when it fails.

1. **The new engine**: the interpreter the operator prepared (``to``), or an env opsbook creates
   there with pip from ``install``; refused when its torch and CUDA packages do not belong
   together (:mod:`opsbook.steps.upgrade_engine`).
2. **Before the stop**: the new release's facts against the deployment (serve flags, ``VLLM_*``
   variables, metric names, the compat rules; :mod:`opsbook.steps.upgrade_predict`) and the
   planned downtime from the last records. A flag or a variable the new release would drop
   refuses the upgrade with the old server untouched. A dry run stops here, saying what the
   apply would do.
3. **Switch**: the launch script rendered for the new interpreter, then 04's restart (its own
   checks before the stop, stop, start, ready, smoke test), then 06's qualification.
4. **Roll back** on a failed start or a failed gate: the old script put back, the old server
   started, and a quick qualification of it. The record says "rolled back", with the script's
   diff and the failing checks. A pass moves last good (its receipt) and pins the engine in the
   deployment file, a backup of the file kept (:mod:`opsbook.steps.upgrade_pin`).

On one host there is no zero-downtime: the model takes every GPU, so the old server stops
before the new one starts.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from opsbook.core import channel, facts_schema
from opsbook.core.deployment import Deployment, load_deployment
from opsbook.core.diffs import Diff
from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Result, State
from opsbook.knowledge import compat
from opsbook.remote.protocol import RemoteHost
from opsbook.stages import launch_server, qualify
from opsbook.stages.base import Note, Report, concurrently, hook, limited
from opsbook.steps import host_facts, patch, qualify_gate, script, server, triage
from opsbook.steps import upgrade_engine as engines
from opsbook.steps import upgrade_pin as pins
from opsbook.steps import upgrade_predict as predicting

UPGRADED, ROLLED_BACK, REFUSED, PLANNED = "upgraded", "rolled back", "refused", "planned"
ROLLBACK_FOLDER = "rollback"
# A requirement naming one version (vllm==0.18.0): what a dry run predicts with before the env
# exists.
PINNED_REQUIREMENT = re.compile(r"^vllm\s*==\s*([0-9][0-9a-z.+]*)$", re.I)


@dataclass(frozen=True)
class Options:
    """The upgrade's options.

    Args:
        to: the new engine's interpreter on the host (``/opt/vllm-0.18.0/bin/python``).
        install: what ``pip install`` installs into a new env at ``to`` when there is none
            yet (``vllm==0.18.0``, a wheel's path on the host); "": the env must exist.
        apply: create the env, stop, switch, qualify, roll back on failure (a dry run
            otherwise: it predicts and says what the apply would do, and stops nothing).
        profile: the qualification of the new engine (``quick``, ``standard``, ``full``).
        decode_band: the drop of output tok/s against the last good run that fails the gate.
        ttft_band: the rise of tail TTFT (as 06_qualify's) against the last good run that
            fails the gate.
        ready_timeout: seconds each start may take to answer ``/health``.
        stop_grace: seconds a stopped server is given after SIGTERM, before SIGKILL.
        pin: on a pass, pin the engine in the deployment file (``engine:``, with a backup).
        record_folder: the run folder receipts are filed in (default: the run's own).
    """

    to: str = ""
    install: str = ""
    apply: bool = False
    profile: str = limited("quick", choices=qualify.PROFILES)
    decode_band: float = limited(qualify_gate.DECODE_BAND, low=0.0, high=1.0)
    ttft_band: float = limited(qualify_gate.TTFT_BAND, low=0.0)
    ready_timeout: int = limited(900, low=1)
    stop_grace: int = limited(10, low=0)
    pin: bool = True
    record_folder: str | None = hook(None)


@dataclass(frozen=True)
class Engines:
    """The engine running and the one to switch to."""

    old_vllm: str | None
    old_python: str
    new_vllm: str | None
    new_python: str


def run(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """Failed when refused before the stop or rolled back (the old server serving again);
    would change in a dry run that found nothing against it; changed when upgraded."""
    if not options.to:
        return _refused_report(
            host,
            [_finding("new engine", "no new engine named", "-p to /path/to/env/bin/python")],
            [], None,
        )  # fmt: skip
    paths = server.resolve_paths(host, deployment)
    # Three reads that do not depend on each other: the server, the old engine, the new one.
    state, found, engine = concurrently(
        lambda: triage.server_state(host, paths, deployment.server_port),
        lambda: host_facts.gather_facts(host, deployment, host_facts.PATCH_FACTS),
        lambda: engines.read_engine(host, options.to),
    )
    shows: list[object] = []
    engine, setup = _new_engine(host, options, engine)
    shows += setup
    new_vllm = engine.vllm if engine else _planned_version(options.install)
    pair = Engines(found.vllm_version, deployment.python, new_vllm, options.to)
    problems = _engine_problems(engine, options, pair, setup)
    if problems:
        return _refused_report(host, problems, shows, pair)
    assert pair.new_vllm is not None
    prediction = predicting.predict(
        deployment.serve_args, deployment.env, pair.old_vllm, pair.new_vllm
    )
    prediction.findings += engines.mixed_install_findings(engine) if engine else []
    said = {f.subject for f in prediction.findings}
    prediction.findings += [
        f
        for f in _compat_findings(host, deployment, found, pair.new_vllm)
        if not _said_already(f, said)
    ]
    prediction.findings += _server_findings(state, deployment)
    prediction.findings += pinned_drift(deployment.engine_version, found.vllm_version)
    folder = _record_folder(options)
    runs_dir = folder.parent if folder is not None else None
    qualify_s = predicting.QUICK_QUALIFY_S
    prediction.downtime = predicting.planned_downtime(
        runs_dir, deployment.source, host.name, float(options.stop_grace), qualify_s
    )
    shows += [
        Note(f"vLLM {pair.old_vllm} ({pair.old_python}) -> {pair.new_vllm} ({pair.new_python})"),
        prediction.table(),
        Note(prediction.downtime.line()),
    ]
    if prediction.refused:
        return _refused_report(host, prediction.refused, shows, pair)
    if not options.apply:
        return _planned(pair, options, prediction, shows, host, creating=engine is None)
    return _switch(host, deployment, options, pair, folder, shows)


def _new_engine(
    host: RemoteHost, options: Options, engine: engines.EngineInstall | None
) -> tuple[engines.EngineInstall | None, list[object]]:
    """The new env's engine (``engine``: as read), created first when there is none and
    ``install`` says how, in an apply; what was done or would be, to show."""
    if engine is not None or not options.install:
        return engine, []
    if not options.apply:
        return None, [Note(f"would create the env of {options.to} and pip install "
                           f"{options.install} (nothing stopped meanwhile)")]  # fmt: skip
    _progress(host, f"creating the env of {options.to}: pip install {options.install}")
    created = engines.create_engine(host, options.to, options.install)
    if not created.ok:
        return None, [created]
    return engines.read_engine(host, options.to), [created]


def _planned_version(install: str) -> str | None:
    named = PINNED_REQUIREMENT.match(install.strip())
    return named.group(1) if named else None


def _engine_problems(
    engine: engines.EngineInstall | None, options: Options, pair: Engines, setup: list[object]
) -> list[Finding]:
    failed = [f for r in setup if isinstance(r, Result) and not r.ok for f in r.findings]
    if failed:
        return failed
    if engine is None and not options.install:
        return [_finding(
            options.to, f"no interpreter runs at {options.to} on the host",
            "prepare the env there (python3 -m venv ENV; ENV/bin/pip install vllm==X), or "
            "give -p install 'vllm==X' to have opsbook create it",
        )]  # fmt: skip
    if engine is not None and not engine.vllm:
        return [_finding(options.to, f"the env of {options.to} has no vLLM installed",
                         f"{options.to} -m pip install vllm==X")]  # fmt: skip
    if pair.new_vllm is None:
        return [_finding(
            options.to, f"the version {options.install!r} installs is known only once installed",
            "give the install as vllm==X for a dry run, or run with -p apply true",
        )]  # fmt: skip
    if engine is not None and pair.new_vllm == pair.old_vllm and options.to == pair.old_python:
        return [_finding(options.to, f"{options.to} is the engine already running "
                         f"(vLLM {pair.old_vllm})", "name the new env's interpreter")]  # fmt: skip
    return []


def _compat_findings(
    host: RemoteHost, deployment: Deployment, found: host_facts.HostFacts, new: str
) -> list[Finding]:
    """The compat rules for the new release on the checkpoint's configs (an error refuses),
    and whether 02's patch is still needed (the rules on the originals 02 backed up)."""
    try:
        state = patch.read_config_state(host, deployment.model_path)
        current = compat.facts_from_texts(state.texts())
    except OpsbookError as e:
        return [Finding("warning", "checkpoint", f"configs not read: {e.message}")]
    prediction = compat.check_compat(current, found.gpus, new, deployment.serve_args)
    findings = [
        dataclasses.replace(f, message=f"on vLLM {new}: {f.message}")
        for f in prediction.findings
        if f.severity == "error"
    ]
    backed_up = sorted(n for n, b in state.backups.items() if b.exists)
    originals = predicting.original_configs(host, deployment.model_path, backed_up)
    if originals:
        stock = compat.facts_from_texts({**state.texts(), **originals})
        ok = compat.check_compat(stock, found.gpus, new, deployment.serve_args).ok
        findings += predicting.patch_findings(sorted(originals), ok, new)
    return findings


def _said_already(finding: Finding, subjects: set[str]) -> bool:
    """A compat rule's finding about a flag or variable the facts already named (the rule
    "--disable-log-requests on a vLLM that removed it" after the flag's own finding)."""
    return any(finding.subject == s or finding.subject.startswith(s + " ") for s in subjects)


def pinned_drift(pinned: str | None, installed: str | None) -> list[Finding]:
    """A warning when the engine the deployment file pins is not the one its interpreter has
    (someone upgraded the env in place since the pin)."""
    if not pinned or not installed or pinned == installed:
        return []
    return [
        Finding(
            "warning",
            "engine pin",
            f"the deployment pins vLLM {pinned} but its interpreter has {installed}",
            "find who changed the env; the upgrade goes on from what is installed",
        )
    ]


def _server_findings(state: triage.ServerState, deployment: Deployment) -> list[Finding]:
    if state.state == "ready":
        return []
    return [_finding(
        f"port {deployment.server_port}",
        f"no server answering ({state.state}): nothing to upgrade from, nor to roll back to",
        "start it with 04_launch first, or launch the new engine directly: set python to it "
        "and run 03 and 04",
    )]  # fmt: skip


def _planned(
    pair: Engines,
    options: Options,
    prediction: predicting.UpgradePrediction,
    shows: list[object],
    host: RemoteHost,
    *,
    creating: bool,
) -> Report:
    _note_upgrade(host, pair, PLANNED, [], None)
    create = f"create the env and pip install {options.install} " if creating else ""
    message = (
        f"would upgrade vLLM {pair.old_vllm} -> {pair.new_vllm}: {create}"
        f"{'then ' if create else ''}write the launch script for "
        f"{pair.new_python}, stop, start, qualify ({options.profile}), roll back by itself on a "
        f"failure; {prediction.downtime.line() if prediction.downtime else ''}"
    )
    warnings = [f for f in prediction.findings if f.severity != "error"]
    return Report(State.WOULD_CHANGE, Result(True, message, warnings), shows)


def _switch(
    host: RemoteHost,
    deployment: Deployment,
    options: Options,
    pair: Engines,
    folder: Path | None,
    shows: list[object],
) -> Report:
    """Stop, start the new, qualify; roll back on a failure."""
    paths = server.resolve_paths(host, deployment)
    try:
        old_text = host.read_text(paths.script)
    except OpsbookError as e:
        why = f"the running server's launch script could not be read: {e.message}"
        remedy = "write it with 03_launch_script (a rollback would have nothing to restore)"
        return _refused_report(host, [_finding(paths.script, why, remedy)], shows, pair)
    new_dep = dataclasses.replace(deployment, python=pair.new_python, engine_version=None)
    written = script.upload_script(host, new_dep, script.render_script(new_dep))
    shows += [written, Diff(written.diff, f"launch script {paths.script}: vLLM {pair.new_vllm}")]
    if not written.ok:
        return _refused_report(host, list(written.findings), shows, pair)
    started_at = time.monotonic()
    _progress(host, f"switching to vLLM {pair.new_vllm}: stop, start, qualify")
    launched = launch_server.run(host, new_dep, _launch_options(options))
    shows += launched.shows
    failing = _problems(launched.verdict)
    if launched.state is State.FAILED and not any(
        s for s in launched.shows if isinstance(s, server.StopResult)
    ):
        # 04's own checks refused before its stop: the old server still runs its script.
        script.upload_script(host, deployment, old_text)
        return _refused_report(host, failing, shows, pair)
    if launched.state is State.CHANGED:
        qualified = qualify.run(host, new_dep, _qualify_options(options, options.profile, folder))
        shows += [Note("qualification of the new engine"), *qualified.shows]
        failing += _problems(qualified.verdict)
        if qualified.state is State.OK:
            filed = folder is not None
            return _upgraded(host, deployment, options, pair, shows, started_at, filed)
    return _roll_back(host, deployment, options, pair, old_text, folder, shows, failing)


def _upgraded(
    host: RemoteHost,
    deployment: Deployment,
    options: Options,
    pair: Engines,
    shows: list[object],
    started_at: float,
    filed: bool,
) -> Report:
    downtime = time.monotonic() - started_at
    _note_upgrade(host, pair, UPGRADED, [], downtime)
    moved = "last good moves to this run" if filed else "not in a run: no receipt filed"
    message = f"upgraded to vLLM {pair.new_vllm}: qualified; {moved}"
    findings: list[Finding] = []
    if options.pin:
        pinned, said = _pin(deployment, pair)
        shows.append(Note(said))
        message += f"; {said}"
        if not pinned:
            findings.append(Finding("warning", "engine pin", said))
    return Report(State.CHANGED, Result(True, message, findings), shows)


def _pin(deployment: Deployment, pair: Engines) -> tuple[bool, str]:
    """Pin the engine in the deployment file, when it is one file of one host."""
    source = Path(deployment.source) if deployment.source else None
    if source is None or not source.is_file():
        return False, "engine not pinned: the deployment has no file"
    try:
        if len(load_deployment(source).hosts) > 1:
            return False, (
                "engine not pinned: the file has several hosts (set engine: once all passed)"
            )
        assert pair.new_vllm is not None
        pinned = pins.pin_engine(source, pair.new_vllm, pair.new_python)
    except OpsbookError as e:
        return False, f"engine not pinned: {e.message}"
    return True, f"engine pinned in {pinned.path} (the file as it was: {pinned.backup})"


def _roll_back(
    host: RemoteHost,
    deployment: Deployment,
    options: Options,
    pair: Engines,
    old_text: str,
    folder: Path | None,
    shows: list[object],
    failing: list[Finding],
) -> Report:
    """The old script put back, the old server started and quick-qualified."""
    _progress(host, f"rolling back to vLLM {pair.old_vllm}")
    restored = script.upload_script(host, deployment, old_text)
    relaunched = launch_server.run(host, deployment, _launch_options(options))
    shows += [Note(f"rolled back to vLLM {pair.old_vllm}"), restored, *relaunched.shows]
    again = None
    if relaunched.state is State.CHANGED:
        rollback_folder = folder / ROLLBACK_FOLDER if folder is not None else None
        again = qualify.run(host, deployment, _qualify_options(options, "quick", rollback_folder))
        shows += [Note("quick qualification of the restored engine"), *again.shows]
    serving = again is not None and again.state is State.OK
    _note_upgrade(host, pair, ROLLED_BACK, failing, None)
    why = "; ".join(f"{f.subject}: {f.message}" for f in failing[:3]) or "the new engine failed"
    restored_said = (
        f"vLLM {pair.old_vllm} serving again and qualified"
        if serving
        else f"vLLM {pair.old_vllm} NOT serving again: {_restored_problem(relaunched, again)}"
    )
    message = f"rolled back to vLLM {pair.old_vllm} ({restored_said}): {why}"
    findings = [*failing, *(again.verdict.findings if again and not serving else [])]
    if not serving:
        findings += relaunched.verdict.findings
    return Report(State.FAILED, Result(False, message, findings), shows)


def _restored_problem(relaunched: Report, again: Report | None) -> str:
    if again is None:
        return relaunched.verdict.message
    return again.verdict.message


def _refused_report(
    host: RemoteHost, problems: list[Finding], shows: list[object], pair: Engines | None
) -> Report:
    if pair is not None:
        _note_upgrade(host, pair, REFUSED, problems, None)
    first = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    message = f"refused before the stop, nothing stopped: {first.subject}: {first.message}{more}"
    return Report(State.FAILED, Result(False, message, problems), shows)


def _note_upgrade(
    host: RemoteHost, pair: Engines, outcome: str, failing: list[Finding], downtime: float | None
) -> None:
    """Note the upgrade's outcome in the run's facts (nothing outside a run)."""
    facts_schema.note(
        host.name,
        "upgrade",
        facts_schema.UpgradeFacts(
            outcome=outcome,
            from_vllm=pair.old_vllm,
            to_vllm=pair.new_vllm,
            from_python=pair.old_python,
            to_python=pair.new_python,
            failing=[f"{f.subject}: {f.message}" for f in failing],
            downtime_s=round(downtime, 1) if downtime is not None else None,
        ).model_dump(),
    )


def _problems(verdict: Result) -> list[Finding]:
    problems = [f for f in verdict.findings if f.is_problem]
    return problems or ([] if verdict.ok else [Finding("error", "new engine", verdict.message)])


def _launch_options(options: Options) -> launch_server.Options:
    return launch_server.Options(
        apply=True,
        restart="always",
        ready_timeout=options.ready_timeout,
        stop_grace=options.stop_grace,
    )


def _qualify_options(options: Options, profile: str, folder: Path | None) -> qualify.Options:
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    return qualify.Options(
        profile=profile,
        decode_band=options.decode_band,
        ttft_band=options.ttft_band,
        record_folder=str(folder) if folder else None,
    )


def _record_folder(options: Options) -> Path | None:
    """The run folder (receipts are filed there; its parent holds the earlier runs), None
    outside a run."""
    if options.record_folder:
        return Path(options.record_folder)
    outcome = os.environ.get(channel.OUTCOME_ENV)
    return Path(outcome).parent if outcome else None


def _finding(subject: str, message: str, remedy: str) -> Finding:
    return Finding("error", subject, message, remedy)


def _progress(host: RemoteHost, text: str) -> None:
    channel.record_progress(channel.StageProgress(host.name, "upgrade", 0.0, text))
