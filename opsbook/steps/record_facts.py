"""The facts a run's record keeps (:mod:`opsbook.core.facts_schema`), from what the stages
already learn: preflight's :class:`~opsbook.steps.host_facts.HostFacts`, the download check's
shard rows, and the launch's log and the deployment's python's answer.

Each ``*_section`` builds a section's values; :func:`note_preflight`, :func:`note_download` and
:func:`note_launch` note them for the run (nothing outside a run).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from opsbook.core import facts_schema
from opsbook.core.deployment import Deployment
from opsbook.core.redact import MASK, Redactor
from opsbook.knowledge import logscan
from opsbook.knowledge.capacity import observed_in_log
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import capacity_facts, host_side, shard_check
from opsbook.steps.host_facts import HostFacts

# The startup phases (failures.yaml's signals.phases) whose length is a figure of the record.
LOAD_PHASE, COMPILE_PHASE, READY_PHASE = "weights", "compile", "ready"
# Kernel command-line words that change PCIe peer-to-peer between GPUs (the IOMMU's mode, the
# ACS override): local-inference-lab/rtx6kpro issue 25, as 06's receipt reads them.
IOMMU_WORDS = ("iommu", "intel_iommu", "amd_iommu")
ACS_WORDS = ("pcie_acs_override",)
NOT_SET = "not set"
NO_REVISION = "unknown: no Hugging Face metadata in the checkpoint folder"


def fingerprint_section(found: HostFacts) -> facts_schema.HostFingerprint:
    """The machine as preflight's probe saw it."""
    links = found.topology.links
    return facts_schema.HostFingerprint(
        gpus=[g.name for g in sorted(found.gpus, key=lambda g: g.index)],
        driver=found.driver,
        cuda=found.cuda,
        kernel=found.os.kernel,
        cpu=str(found.cpu_count) if found.cpu_count else None,
        topology_digest=facts_schema.digest_of(links)[:16] if links else None,
    )


def engine_section(found: HostFacts) -> facts_schema.EngineFacts:
    """The deployment's interpreter and its vLLM, as preflight's probe found them."""
    python = found.python
    return facts_schema.EngineFacts(
        vllm=found.vllm_version,
        interpreter=python.executable,
        python=python.version.split()[0] if python.version else None,
    )


def model_section(
    deployment: Deployment, check: shard_check.CheckResult
) -> facts_schema.ModelFacts:
    """The checkpoint as the download check read it: the digest of its shard manifest (each
    shard's name and size as the index expects it)."""
    manifest = sorted(
        (row.file, row.expected_size if row.expected_size is not None else row.size)
        for row in check.shards
    )
    return facts_schema.ModelFacts(
        path=deployment.model_path,
        manifest_digest=facts_schema.digest_of(manifest)[:16] if manifest else None,
        shards=len(manifest),
    )


def launch_section(deployment: Deployment, script_digest: str) -> facts_schema.LaunchFacts:
    """The serve flags (secret values masked), the names of the env it sets, the script."""
    redactor = Redactor(deployment.secret_values())
    secret = {name for name in deployment.secret_args()}
    flags = {
        str(name): MASK if name in secret else redactor.redact(_flag_text(value))
        for name, value in deployment.serve_args.items()
    }
    return facts_schema.LaunchFacts(
        flags=flags, env_names=sorted(deployment.env), script_digest=script_digest or None
    )


def _flag_text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return " ".join(str(v) for v in value)
    return "" if value is True else str(value)


def startup_section(diagnosis: logscan.LogDiagnosis | None) -> facts_schema.StartupFacts:
    """The start's figures from its log: the weights' and compile's seconds, and the seconds
    from the first phase to ready."""
    if diagnosis is None:
        return facts_schema.StartupFacts()
    lasts = phase_seconds(diagnosis.phases)
    stamped = [p for p in diagnosis.phases if p.timestamp is not None]
    ready = next((p for p in stamped if p.name == READY_PHASE), None)
    ready_s = None
    if ready is not None and ready.timestamp and stamped[0].timestamp:
        ready_s = round((ready.timestamp - stamped[0].timestamp).total_seconds(), 1)
    return facts_schema.StartupFacts(
        state=diagnosis.state,
        load_s=lasts.get(LOAD_PHASE),
        compile_s=lasts.get(COMPILE_PHASE),
        ready_s=ready_s,
    )


def phase_seconds(phases: Sequence[logscan.Phase]) -> dict[str, float]:
    """Each stamped phase's seconds until the next stamped one."""
    stamped = [p for p in phases if p.timestamp is not None]
    return {
        a.name: round((b.timestamp - a.timestamp).total_seconds(), 1)
        for a, b in zip(stamped, stamped[1:], strict=False)
        if a.timestamp is not None and b.timestamp is not None
    }


def side_sections(
    answer: host_side.SideAnswer,
) -> tuple[facts_schema.EngineFacts, dict[str, str]]:
    """What the deployment's python answered: its engine (torch, Ray, and the KV-cache dtype
    and attention backend the server's log names) and each config file's sha256."""
    kv, backend = host_side.engine_from_log(answer.engine_lines)
    engine = facts_schema.EngineFacts(
        vllm=answer.versions.get("vllm"),
        torch=answer.versions.get("torch"),
        ray=answer.versions.get("ray"),
        kv_cache_dtype=host_side.KV_DTYPE_ALIASES.get(kv, kv) or None,
        attention_backend=backend or None,
        engine_from=host_side.FROM_LOG if kv or backend else None,
    )
    configs = {
        name: hashlib.sha256(text.encode()).hexdigest()[:16]
        for name, text in sorted(answer.configs.items())
    }
    return engine, configs


def kernel_flags(cmdline: str | None) -> tuple[str | None, str | None]:
    """The IOMMU and ACS words of a kernel command line (``not set`` when it gives none;
    None when it was not read)."""
    if cmdline is None:
        return None, None
    words = cmdline.split(" -- ")[0].split()
    iommu = [w for w in words if w.split("=")[0].split(".")[0] in IOMMU_WORDS]
    acs = [w for w in words if w.split("=")[0] in ACS_WORDS]
    return " ".join(iommu) or NOT_SET, " ".join(acs) or NOT_SET


def side_extras(answer: host_side.SideAnswer) -> dict[str, dict[str, Any]]:
    """What the launch's side read adds to the record, by section: the kernel's IOMMU and ACS
    flags, the env's `pip freeze` digest, and the checkpoint's revision (or why unknown)."""
    iommu, acs = kernel_flags(answer.cmdline)
    return {
        "fingerprint": {"iommu": iommu, "acs": acs},
        "engine": {"pip_freeze_digest": answer.freeze_digest},
        "model": {
            "revision": answer.revision,
            "revision_source": answer.revision_source if answer.revision else NO_REVISION,
        },
    }


def note_preflight(host: str, found: HostFacts) -> None:
    """Note the host's fingerprint and engine as preflight found them."""
    facts_schema.note(host, "fingerprint", fingerprint_section(found).model_dump())
    facts_schema.note(host, "engine", engine_section(found).model_dump())


def note_download(host: str, deployment: Deployment, check: shard_check.CheckResult) -> None:
    """Note the checkpoint's shard manifest as the download check read it."""
    facts_schema.note(host, "model", model_section(deployment, check).model_dump())


def launch_side_command(deployment: Deployment) -> list[str]:
    """What :func:`note_launch` asks the deployment's python, for the launch's status probe
    to run beside a ready server's status (``triage.server_state(when_healthy=...)``): empty
    outside a run, which notes nothing."""
    return host_side.side_command(deployment) if facts_schema.recording() else []


def note_launch(
    host: RemoteHost,
    deployment: Deployment,
    script_digest: str,
    diagnosis: logscan.LogDiagnosis | None,
    side: tuple[int | None, str] | None = None,
) -> None:
    """Note what the launch left running: its flags, env names and script, the start's
    figures, and the engine and configs the deployment's python answers for (``side``: the
    exit code and output of :func:`launch_side_command` as the status probe ran it; without
    it, one command), only inside a run."""
    if not facts_schema.recording():
        return
    facts_schema.note(host.name, "launch", launch_section(deployment, script_digest).model_dump())
    facts_schema.note(host.name, "startup", startup_section(diagnosis).model_dump())
    if side is not None:
        answer = host_side.side_answer(*side)
    else:
        answer = host_side.read_side(host, deployment)
    if answer.error:
        return
    engine, configs = side_sections(answer)
    facts_schema.note(host.name, "engine", engine.model_dump())
    for section, values in side_extras(answer).items():
        facts_schema.note(host.name, section, values)
    said = observed_in_log(answer.engine_lines)
    facts_schema.note(host.name, "startup", {"kv_tokens": said.kv_tokens if said else None})
    capacity_facts.note_start_figures(host.name, said)
    facts_schema.note(host.name, "model", {"path": deployment.model_path, "configs": configs})
