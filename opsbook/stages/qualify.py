"""Qualify on one host: prove the running server serves right and fast, and stays up, against
its last good run on the same hardware; changes nothing on the host.

Pre-checks (idle by ``/metrics``, else skipped as busy; the startup facts from its log), the
performance matrix (:mod:`opsbook.steps.qualify_matrix`), greedy determinism and degenerate
output (:mod:`opsbook.steps.qualify_correctness`), for ``standard`` and ``full`` a soak
(:mod:`opsbook.steps.qualify_soak`), then the verdict (:mod:`opsbook.steps.qualify_gate`) and the
receipt filed in the run folder (:mod:`opsbook.steps.qualify_receipt`).
"""

from __future__ import annotations

import datetime
import json
import os
import posixpath
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

from opsbook.core import channel
from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import ProbeError, RunError
from opsbook.core.results import SERVER_BUSY, Finding, Result, State, Table
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import Note, Report, hook, limited
from opsbook.steps import host_facts, metrics, plots, script, server, triage
from opsbook.steps import qualify_baselines as baselines
from opsbook.steps import qualify_correctness as correctness
from opsbook.steps import qualify_eval as evaluation
from opsbook.steps import qualify_gate as gate
from opsbook.steps import qualify_matrix as matrix
from opsbook.steps import qualify_receipt as receipts
from opsbook.steps import qualify_soak as soak
from opsbook.steps import qualify_tools as tool_calls

PROFILES = tuple(matrix.PROFILES)


@dataclass(frozen=True)
class Options:
    """The qualification's options.

    Args:
        profile: ``quick`` (about a minute: 2 prompt lengths x 2 concurrencies), ``standard``
            (3 x 3 and a 5-minute soak) or ``full`` (4 x 4 and a 30-minute soak).
        decode_band: the drop of output tok/s against the last good run that is a regression.
        ttft_band: the rise of tail TTFT (p99, or p90 where a cell has too few requests for
            one) against the last good run that is a regression.
        eval_file: a JSONL of questions and answers on the host (GSM8K's form) to score by
            exact match, with a 95% Wilson interval, and to pair with the last good run's
            outcomes (exact McNemar); empty: no evaluation.
        record_folder: the run folder the receipt is filed in, and whose siblings hold the
            earlier runs (default: the run's own, where ``opsbook run`` or a JupyterLab session
            records; none outside a run: then nothing is filed nor compared).
    """

    profile: str = limited("quick", choices=PROFILES)
    decode_band: float = limited(gate.DECODE_BAND, low=0.0, high=1.0)
    ttft_band: float = limited(gate.TTFT_BAND, low=0.0)
    eval_file: str = ""
    record_folder: str | None = hook(None)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise RunError(
                f"profile {self.profile!r} is not one of {', '.join(PROFILES)}",
                remedy="-p profile quick (about a minute), standard or full",
            )


def run(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """Ok when every check passes and nothing regressed against the last good run; failed
    otherwise (each problem a finding with its code); skipped when the server is busy."""
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    port = deployment.server_port
    api_key = script.server_api_key(deployment)
    try:
        before = metrics.read_metrics(host, port, api_key=api_key)
    except ProbeError as e:
        message = f"no server to qualify: {e.message}"
        finding = Finding("error", f"port {port}", message, "start it first: 04_launch")
        return Report(State.FAILED, Result(False, message, [finding]), [])
    if not before.idle:
        message = (
            f"busy: {before.running or 0:.0f} request(s) running, {before.waiting or 0:.0f} "
            "waiting; not qualified (the measurement would disturb them and be wrong)"
        )
        finding = Finding("warning", f"port {port}", message, "run it again when idle")
        return Report(State.SKIPPED, Result(True, message, [finding]), [], SERVER_BUSY)
    questions = None
    if options.eval_file:
        try:
            questions = evaluation.read_eval_file(host, options.eval_file)
        except RunError as e:
            finding = Finding("error", "eval_file", e.message, e.remedy or "")
            return Report(State.FAILED, Result(False, e.message, [finding]), [])
    profile = matrix.PROFILES[options.profile]
    paths = server.resolve_paths(host, deployment)
    state = triage.server_state(host, paths, port, notes=(server.RUNNING_SCRIPT,))
    facts = host_facts.gather_facts(host, deployment, ("nvidia_smi", "python"))
    model, max_len = _served_model(host, port, api_key)
    phases = state.diagnosis.phases if state.diagnosis is not None else []
    startup = receipts.startup_of(host, paths.log, phases)
    fingerprint, extra = receipts.fingerprint_of(host, facts)
    digest = server.noted_running_script(host, paths, state.notes)
    software = receipts.software_of(deployment, facts, extra["torch"], model, digest)
    target = matrix.Target(
        port, model, deployment.model_path, deployment.python, max_len,
        startup.kv_cache_tokens, api_key, seed=int(time.time()) % 100_000,
        names=metrics.names_for(facts.vllm_version), stall_seconds=metrics.STALL_SECONDS,
    )  # fmt: skip
    cells, skipped = matrix.plan_cells(profile, target)
    driver = (
        matrix.DRIVER_BENCH
        if matrix.bench_serve_available(host, deployment.python)
        else matrix.DRIVER_CLIENT
    )
    result_dir = posixpath.join(paths.state_dir, "qualify", started_at.replace(":", ""))
    measured = _run_matrix(host, target, profile, cells, driver, result_dir, skipped)
    hung = any(c.hung for c in measured)
    widest = max((c.concurrency for c in cells), default=max(profile.concurrencies))
    checked, evaluated, called, soaked = _checks(
        host, deployment, target, profile, widest, questions, hung
    )
    after = _snapshot(host, port, api_key)
    healthy = server.http_get(host, port, "/health", api_key=api_key).status == 200
    findings = [
        *gate.own_findings(measured),
        *checked.findings(),
        *(evaluation.own_findings(evaluated) if evaluated is not None else []),
        *(tool_calls.own_findings(called) if called is not None else []),
        *(soaked.findings if soaked is not None else []),
        *[
            f
            for f in gate.engine_findings(healthy, before, after)
            if not (hung and f.code == gate.CODE_HUNG)  # the cell's finding said it already
        ],
    ]
    receipt = receipts.Receipt(
        host=host.name, started_at=started_at, profile=profile.name, driver=driver,
        fingerprint=fingerprint, software=software, startup=startup, cells=measured,
        skipped_cells=skipped, greedy_sha256=checked.alone,
        deterministic=checked.deterministic if checked.alone else None,
        degenerate=checked.degenerate,
        evaluation=evaluated.to_dict() if evaluated is not None else None,
        tool_calls=called.to_dict() if called is not None else None,
    )  # fmt: skip
    folder = _record_folder(options)
    verdict_notes, good = _judge(receipt, folder, options, findings)
    compared = good.run_folder if good is not None else ""
    receipt.passed = not any(f.is_problem for f in findings)
    receipt.findings = [_finding_doc(f) for f in findings]
    receipt.compared_with = compared
    filed = ""
    if folder is not None:
        receipts.write_raw(folder, host.name, measured)
        filed = str(receipts.write_receipt(folder, receipt))
    message = _message(receipt, findings, compared)
    shows: list[object] = [
        Note(message),
        *verdict_notes,
        matrix.matrix_table(measured, skipped),
        plots.throughput_by_concurrency(measured, good.cells if good is not None else ()),
        plots.ttft_by_prompt_length(measured, good.cells if good is not None else ()),
        *_published(receipt, measured),
        startup_table(receipt),
        *([Note(evaluation.describe(evaluated))] if evaluated is not None else []),
        Result(receipt.passed, message, findings),
    ]
    if filed:
        shows.append(Note(f"receipt: {filed}"))
    # The /metrics summaries before and after go into the run record (summary.json).
    shows.append(metrics.summary_of("before", before))
    if after is not None:
        shows.append(metrics.summary_of("end", after))
    state_ = State.OK if receipt.passed else State.FAILED
    return Report(state_, Result(receipt.passed, message, findings), shows, "", digest)


class Checks(NamedTuple):
    """The checks after the matrix: each None when it was not run."""

    checked: correctness.Correctness
    evaluated: evaluation.Evaluation | None
    called: tool_calls.ToolCalls | None
    soaked: soak.Soak | None


def _checks(
    host: RemoteHost,
    deployment: Deployment,
    target: matrix.Target,
    profile: matrix.Profile,
    widest: int,
    questions: evaluation.EvalFile | None,
    hung: bool,
) -> Checks:
    """Greedy determinism and degenerate output, the evaluation file, the tool calls and the
    soak, those that apply; none once the server hung (it answers nothing more: each would
    only wait out the watch again)."""
    if hung:
        return Checks(correctness.Correctness(widest), None, None, None)
    _progress(host, "greedy determinism and degenerate output")
    checked = correctness.check_correctness(host, target, widest)
    evaluated = None
    if questions is not None:
        _progress(host, f"evaluation {questions.path}")
        evaluated = evaluation.evaluate(host, target, questions, widest)
    parser = tool_calls.parser_of(deployment)
    called = None
    if parser:
        _progress(host, f"tool calls ({parser})")
        called = tool_calls.check_tool_calls(host, target, parser)
    soaked = soak.soak(host, target, profile, deployment) if profile.soak_minutes else None
    return Checks(checked, evaluated, called, soaked)


def _run_matrix(
    host: RemoteHost,
    target: matrix.Target,
    profile: matrix.Profile,
    cells: list[matrix.Cell],
    driver: str,
    result_dir: str,
    skipped: list[matrix.SkippedCell],
) -> list[matrix.CellResult]:
    """Each cell measured, until one finds the server hung: the cells after it are added to
    ``skipped`` with that reason."""
    measured: list[matrix.CellResult] = []
    for n, cell in enumerate(cells):
        _progress(host, f"cell {cell.label} ({driver})")
        result = matrix.run_cell(host, target, profile, cell, driver, result_dir)
        measured.append(result)
        if result.hung:
            reason = f"not run: the server hung in cell {cell.label}"
            skipped += [matrix.SkippedCell(later, reason) for later in cells[n + 1 :]]
            break
    return measured


def _published(receipt: receipts.Receipt, measured: list[matrix.CellResult]) -> list[Table]:
    """The published baselines of this model on this GPU model beside this run, when any."""
    software, hardware = receipt.software, receipt.fingerprint
    found = baselines.matching(f"{software.model} {software.model_path}", hardware.gpu_model)
    return [baselines.baselines_table(found, measured, hardware.gpu_count)] if found else []


def _judge(
    receipt: receipts.Receipt, folder: Path | None, options: Options, findings: list[Finding]
) -> tuple[list[Note], receipts.Receipt | None]:
    """Add the findings against the last good run (and for information against other
    hardware) to ``findings``; notes saying what was compared with, and the last good
    receipt (None when there is none)."""
    if folder is None:
        return [Note("not in a run folder: nothing compared, no receipt filed")], None
    earlier = list(receipts.earlier_receipts(folder))
    good, alike = gate.last_good(receipt, earlier)
    other = gate.other_hardware(receipt, earlier)
    if other is not None:
        findings.append(gate.for_information(receipt, other))
    if good is None:
        return [Note("no earlier passing run on this hardware: judged on its own checks")], None
    bands = gate.learned_bands(alike, gate.Bands(options.decode_band, options.ttft_band))
    findings += gate.against_last_good(receipt, good, bands)
    if receipt.evaluation and good.evaluation:
        now = evaluation.Evaluation.from_dict(receipt.evaluation)
        then = evaluation.Evaluation.from_dict(good.evaluation)
        findings += evaluation.against_last_good(now, then, good.run_folder)
    if receipt.tool_calls and good.tool_calls:
        findings += tool_calls.against_last_good(
            receipt.tool_calls, good.tool_calls, good.run_folder
        )
    note = Note(
        f"compared with the last good run {good.run_folder} ({good.started_at}); noise band "
        f"decode {bands.decode:.0%}, tail TTFT {bands.ttft:.0%}"
    )
    return [note], good


def _message(receipt: receipts.Receipt, findings: list[Finding], compared: str) -> str:
    problems = [f for f in findings if f.is_problem]
    best = max((c.output_tok_s for c in receipt.cells), default=0.0)
    cells = f"{len(receipt.cells)} cell(s), best {best:.1f} tok/s"
    if problems:
        return f"qualification failed: {problems[0].subject}: {problems[0].message}" + (
            f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        )
    against = "against the last good run" if compared else "first run on this hardware"
    return f"qualified ({against}): {cells}, greedy output batch-invariant"


def startup_table(receipt: receipts.Receipt) -> Table:
    """The startup facts and the fingerprint, one row each."""
    s, f = receipt.startup, receipt.fingerprint
    rows: list[list[object]] = [
        ["KV cache (tokens)", s.kv_cache_tokens],
        ["maximum concurrency", s.max_concurrency],
        ["attention backend", s.attention_backend],
        ["KV cache dtype", s.kv_cache_dtype],
        ["phases (s from start)", ", ".join(f"{k} {v}" for k, v in s.phases_s.items())],
        ["GPUs", f"{f.gpu_count} x {f.gpu_model}"],
        ["driver / CUDA", f"{f.driver} / {f.cuda}"],
        ["fingerprint", receipt.fingerprint_id],
        ["vLLM / torch", f"{receipt.software.vllm} / {receipt.software.torch}"],
        ["driver of the matrix", receipt.driver],
    ]
    return Table(["fact", "value"], rows)


def _served_model(host: RemoteHost, port: int, api_key: str | None) -> tuple[str, int]:
    """The model the server serves and its max model length (``/v1/models``)."""
    answer = server.http_get(host, port, "/v1/models", api_key=api_key)
    try:
        first = json.loads(answer.body)["data"][0]
        return str(first["id"]), int(first.get("max_model_len") or 0)
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ProbeError(
            f"/v1/models on port {port} did not name a model ({answer.error or answer.status})",
            host=host.name,
            remedy="check the server with 05_diagnose",
        ) from e


def _snapshot(host: RemoteHost, port: int, api_key: str | None) -> metrics.MetricsSnapshot | None:
    try:
        return metrics.read_metrics(host, port, api_key=api_key)
    except ProbeError:
        return None


def _record_folder(options: Options) -> Path | None:
    if options.record_folder:
        return Path(options.record_folder)
    outcome = os.environ.get(channel.OUTCOME_ENV)
    return Path(outcome).parent if outcome else None


def _progress(host: RemoteHost, text: str) -> None:
    channel.record_progress(channel.StageProgress(host.name, "qualify", 0.0, text))


def _finding_doc(finding: Finding) -> dict[str, str]:
    return {k: v for k, v in asdict(finding).items() if v}
