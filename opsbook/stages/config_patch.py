"""Config patch on one host: predict the launch failure from the checkpoint's config, and fix
the config (backup, atomic write, re-check) with ``apply=True``."""

from __future__ import annotations

from dataclasses import dataclass, replace

from opsbook.core.deployment import Deployment
from opsbook.core.diffs import Diff
from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import Finding, Result, State
from opsbook.knowledge import compat
from opsbook.remote.protocol import RemoteHost
from opsbook.stages.base import HostChoice, Note, Report, StageRun, concurrently, hook, limited
from opsbook.steps import capacity_facts, host_facts, last_good, patch, plan
from opsbook.steps.shard_check import format_bytes


@dataclass(frozen=True)
class Options:
    """The config patch's options.

    Args:
        apply: write the patch (a dry run otherwise).
        restore: put the original config back.
        vllm_version: the vLLM to predict for (empty: the version installed in the
            deployment's interpreter).
        gpu_memory_utilization: the share of GPU memory vLLM may use (the KV-cache budget).
        readings: a deploy run's readings: the GPUs and the interpreter's vLLM are taken from
            preflight's reading of the host there (set by
            :func:`opsbook.stages.base.run_stage` in the run's shared kernel).
    """

    apply: bool = False
    restore: bool = limited(False, excludes=("apply",))
    vllm_version: str = ""
    gpu_memory_utilization: float = limited(0.9, above=0, high=1)
    readings: host_facts.RunReadings | None = hook()


@dataclass(kw_only=True)
class ConfigPatchReport(Report):
    """Config patch's report when it planned: the plan (the notebook's restore button looks
    for hosts whose config already carries the patch)."""

    plan: patch.Plan


@dataclass(kw_only=True)
class RestoreReport(Report):
    """A restore's report: what was put back, and the prediction for the config as it is now
    (none when the restore failed), each shown on its own in the notebook."""

    restored: patch.Restored
    prediction: Result | None = None


def patched_hosts(run: StageRun) -> list[str]:
    """The hosts of a run whose config carries opsbook's patch (the originals kept as backups)."""
    return [
        name
        for name, report in run.reports.items()
        if isinstance(report, ConfigPatchReport) and report.plan.already_applied
    ]


def apply_choice(run: StageRun) -> HostChoice:
    """The hosts of a dry run that the notebook's apply button may act on (the reachable
    ones), chosen by default when the dry run would change them."""
    return run.choice(run.hosts_in(State.WOULD_CHANGE))


def restore_choice(run: StageRun) -> HostChoice:
    """The hosts whose config carries opsbook's patch (what the restore button may act on),
    all chosen by default: the confirmation names them before anything is put back."""
    patched = patched_hosts(run)
    return run.choice(patched, offered=patched)


def restore_outcome(run: StageRun) -> Result:
    """A restore over hosts as the notebook's button tells it: ok when every host's originals
    were put back (a restored config that is predicted to fail is still a restore that
    worked), each host's prediction for its restored config a line of its own."""
    findings: list[Finding] = []
    put_back = 0
    for result in run.results:
        report = run.reports.get(result.host)
        if not isinstance(report, RestoreReport) or not report.restored.ok:
            failed = f"{result.state.value}: {result.message}"
            findings.append(Finding("error", result.host, failed))
            continue
        put_back += 1
        findings.append(Finding("ok", result.host, report.restored.message))
        if report.prediction is not None:
            findings.append(_restored_prediction(result.host, report.prediction))
    message = f"restored the original config on {put_back} of {len(run.results)} host(s)"
    return Result(put_back == len(run.results), message, findings=findings)


def _restored_prediction(host: str, prediction: Result) -> Finding:
    if prediction.ok:
        return Finding("ok", host, f"the restored config: {prediction.message}")
    return Finding(
        "warning", host, f"the restored config is predicted to fail: {prediction.message}"
    )


def run(host: RemoteHost, deployment: Deployment, options: Options) -> Report:
    """Predict what vLLM will do with the checkpoint here, plan the edits, and apply them when
    ``apply`` (or put the originals back when ``restore``).

    States: ok when nothing is to change and nothing is predicted to fail; would change when a
    dry run has a plan; changed when the patch was written and its re-check passed; failed
    when a problem is left.
    """
    # The reads that do not depend on each other go at once: the GPUs and the interpreter's
    # vLLM, and the checkpoint's configs (with its weights' size on disk, for the KV budget)
    # followed by the question to the installed vLLM, whose own selection outranks the
    # version table (it reads the GPUs' capabilities itself, while the facts probe reads them).
    found, (checkpoint, model, probed) = concurrently(
        lambda: host_facts.gather_facts(
            host, deployment, host_facts.PATCH_FACTS, readings=options.readings
        ),
        lambda: _model_and_backends(host, deployment),
    )
    texts = checkpoint.texts
    version = options.vllm_version or found.vllm_version
    gpu_memory_utilization = options.gpu_memory_utilization
    capabilities = list(dict.fromkeys(filter(None, map(compat.compute_capability, found.gpus))))
    before = compat.check_compat(
        model, found.gpus, version, deployment.serve_args, probed_backends=probed
    )
    shows: list[object] = [model.table(), before]
    budget = compat.kv_budget_bytes(found.gpus, checkpoint.weight_bytes, gpu_memory_utilization)
    # The patch is planned only when it avoids a failure the prediction names.
    plan = patch.plan_for_prediction(
        texts,
        before,
        found.gpus,
        version,
        deployment.serve_args,
        probed,
        kv_budget_bytes=budget,
    )
    shows += [
        Note(
            f"KV-cache budget per GPU {budget / 2**30:.1f} GiB (first estimate, for the "
            f"{checkpoint.shards} shard(s)' {format_bytes(checkpoint.weight_bytes)} on disk)"
        ),
        *_capacity_shows(host, deployment, found, version, _as_patched(plan, options)),
    ]
    if options.restore:
        restored = patch.restore_patch(host, deployment.model_path)
        if not restored.ok:
            return RestoreReport(State.FAILED, failed_restore(restored), shows, restored=restored)
        after = _predict_restored(host, deployment, found, version, capabilities)
        shows.append(after)
        state = State.CHANGED if after.ok else State.FAILED
        told = restore_verdict(restored, after)
        return RestoreReport(state, told, shows, restored=restored, prediction=after)
    if plan.nothing_planned:
        verdict = patch.patch_verdict(before, None, plan=plan)
        return ConfigPatchReport(State.OK if before.ok else State.FAILED, verdict, shows, plan=plan)
    if plan.already_applied:
        return ConfigPatchReport(State.OK if before.ok else State.FAILED, before, shows, plan=plan)
    shows.append(Diff(plan.diff, f"config patch of {deployment.model_path}"))
    if not options.apply:
        dry = patch.apply_patch(host, deployment.model_path, plan, apply=False)
        predicted = "" if before.ok else f"predicted: {before.message}; "
        verdict = Result(dry.ok, predicted + dry.message, findings=before.findings)
        return ConfigPatchReport(
            State.WOULD_CHANGE if dry.ok else State.FAILED, verdict, shows, plan=plan
        )
    applied = patch.apply_patch(
        host,
        deployment.model_path,
        plan,
        apply=True,
        gpus=found.gpus,
        vllm_version=version,
        serve_args=deployment.serve_args,
        probed_backends=probed,
    )
    verdict = patch.patch_verdict(before, applied, plan=plan)
    return Report(State.CHANGED if verdict.ok else State.FAILED, verdict, shows)


def _capacity_shows(
    host: RemoteHost,
    deployment: Deployment,
    found: host_facts.HostFacts,
    version: str | None,
    patched: dict[str, str],
) -> list[object]:
    """The capacity plan (KV tokens, whether the start fits, the knobs) for the config the
    start will read (``patched``: the patch's new texts), or why it was not made: it is
    advice, and a checkpoint it cannot size is still patched. In a run it goes in the record,
    where 04 puts vLLM's figures beside it; it learns from the earlier runs'."""
    try:
        made = plan.plan_on_host(
            host,
            deployment,
            found=found,
            vllm_version=version,
            runs_dir=last_good.runs_dir_of_run(),
            configs=patched,
        )
    except OpsbookError as e:
        remedy = f" ({e.remedy})" if e.remedy else ""
        return [Note(f"capacity plan not made: {e.message}{remedy}")]
    capacity_facts.note_prediction(host.name, made)
    told = [Note(f"capacity plan for {', '.join(patched)} as patched")] if patched else []
    return [*told, made, made.table(), *([made.knobs_table()] if made.knobs else [])]


def _as_patched(planned: patch.Plan, options: Options) -> dict[str, str]:
    """The files the patch changes, as it will leave them (none for a restore: the plan is
    then of the config on the host)."""
    if options.restore:
        return {}
    return {name: planned.files[name].new for name in planned.changed_files}


def _model_and_backends(
    host: RemoteHost, deployment: Deployment
) -> tuple[patch.Checkpoint, compat.ModelFacts, compat.InstalledVllm | None]:
    """The checkpoint's configs and weights' size, the model they describe, and the
    installed vLLM's answer about that model on this host's GPUs."""
    checkpoint = patch.read_checkpoint(host, deployment.model_path)
    model = compat.facts_from_texts(checkpoint.texts)
    return checkpoint, model, compat.probe_backends(host, deployment.python, model)


def _predict_restored(
    host: RemoteHost,
    deployment: Deployment,
    found: host_facts.HostFacts,
    version: str | None,
    capabilities: list[str],
) -> compat.Prediction:
    """The prediction for the config as it is after a restore (read again from the host, and
    the installed vLLM asked again: the restored file may ask for another KV-cache dtype)."""
    model = compat.facts_from_texts(patch.read_configs(host, deployment.model_path))
    probed = compat.probe_backends(host, deployment.python, model, capabilities)
    return compat.check_compat(
        model, found.gpus, version, deployment.serve_args, probed_backends=probed
    )


def restore_verdict(restored: patch.Restored, after: Result) -> patch.Restored:
    """A restore's verdict: what was put back, and what the prediction says of the config now
    on the host (a restore brings back the original's failure too)."""
    if after.ok:
        message = f"{restored.message}; the restored config: {after.message}"
        return replace(
            restored, ok=True, message=message, findings=[*restored.findings, *after.findings]
        )
    message = f"{restored.message}; the restored config is predicted to fail: {after.message}"
    return replace(
        restored, ok=False, message=message, findings=[*after.findings, *restored.findings]
    )


def failed_restore(restored: patch.Restored) -> patch.Restored:
    """A failed restore's verdict names each file that was not put back and why (a full disk,
    a read-only folder), not only "see the findings"."""
    errors = [f"{f.subject}: {f.message}" for f in restored.findings if f.severity == "error"]
    message = "restore failed: " + ("; ".join(errors) or restored.message)
    return replace(restored, ok=False, message=message)
