"""What a host shows of the facts that hosts serving one model should share
(:class:`opsbook.steps.host_compare.HostSide`), read in one round trip beside what its stage
reads anyway.

The deployment's python answers, without importing torch, Ray or vLLM (each takes seconds):
the versions of their installed distributions (``importlib.metadata``), the launch script's
sha256, the lines of the server's log that say which KV-cache dtype and attention backend the
engine chose, and the checkpoint's config files. Where the log says nothing (no server ran),
the KV-cache dtype and backend are predicted from the configs, the GPUs and the flags
(:func:`opsbook.knowledge.compat.check_compat`, the version table: no question to vLLM).
"""

from __future__ import annotations

import json
import posixpath
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import HostUnreachable, OpsbookError
from opsbook.knowledge import compat
from opsbook.knowledge.logscan.line_grammar import (
    ATTENTION_BACKEND_SAID,
    ENGINE_LINE_MARKS,
    KV_CACHE_DTYPE_SAID,
    KV_LINE_MARKS,
    MEMORY_LINE_MARKS,
)
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import host_facts
from opsbook.steps.host_compare import UNKNOWN, HostSide
from opsbook.steps.host_facts import HostFacts

FROM_LOG = "the server's log"
PREDICTED = "predicted"
# The start of a log read: the lines of the last start-up are near its end, and a log that
# restarted many times is large.
LOG_TAIL_BYTES = 4 << 20
NOT_INSTALLED = "not installed"
# One KV-cache dtype under two names: "CUDA 11.8+ supports fp8 (=fp8_e4m3)" (vllm 0.32.0
# vllm/config/cache.py, CacheConfig.cache_dtype), so a flag's fp8 and a checkpoint's fp8_e4m3
# are no difference.
KV_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}

# Run by the deployment's python (argv: script, log, model folder, the marks, the tail size,
# then the config file names); stdlib only, Python 3.8 compatible: it runs on the host.
# The checkpoint's revision: a Hugging Face cache keeps a commit's files in
# snapshots/<commit>/, and `hf download --local-dir` writes the commit as the first line of
# .cache/huggingface/download/<file>.metadata (huggingface_hub _local_folder.py,
# LocalDownloadFileMetadata: commit hash, etag, timestamp).
SIDE_SCRIPT = r"""
import hashlib, json, os, re, sys
script, log, model = (os.path.expanduser(p) for p in sys.argv[1:4])
marks, tail = sys.argv[4:6]
out = {"versions": {}, "script_sha256": "", "engine_lines": [], "configs": {},
       "freeze_digest": None, "cmdline": None, "revision": None, "revision_source": None}
try:
    import importlib.metadata as m
    for name in ("torch", "ray", "vllm"):
        try:
            out["versions"][name] = m.version(name)
        except Exception:
            out["versions"][name] = None
    seen = {}
    for d in m.distributions():
        name = str(d.metadata["Name"] or "").lower().replace("_", "-")
        if name and name not in seen:
            seen[name] = str(d.version)
    frozen = sorted(n + "==" + v for n, v in seen.items())
    out["freeze_digest"] = hashlib.sha256("\n".join(frozen).encode()).hexdigest()[:16]
except Exception:
    pass
try:
    with open("/proc/cmdline") as f:
        out["cmdline"] = f.read().strip()
except OSError:
    pass
snapshot = os.path.normpath(model).split(os.sep)
meta = os.path.join(model, ".cache", "huggingface", "download", "config.json.metadata")
if len(snapshot) > 1 and snapshot[-2] == "snapshots" and re.match("^[0-9a-f]{40}$", snapshot[-1]):
    out["revision"], out["revision_source"] = snapshot[-1], "Hugging Face cache snapshot"
else:
    try:
        with open(meta) as f:
            first = f.readline().strip()
        if re.match("^[0-9a-f]{40}$", first):
            out["revision"], out["revision_source"] = first, meta
    except OSError:
        pass
try:
    with open(script, "rb") as f:
        out["script_sha256"] = hashlib.sha256(f.read()).hexdigest()
except OSError:
    pass
try:
    with open(log, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - int(tail)))
        text = f.read().decode("utf-8", "replace")
    wanted = json.loads(marks)
    out["engine_lines"] = [l for l in text.splitlines() if any(w in l for w in wanted)][-50:]
except OSError:
    pass
for name in sys.argv[6:]:
    try:
        with open(os.path.join(model, name)) as f:
            out["configs"][name] = f.read(1 << 20)
    except OSError:
        pass
print(json.dumps(out))
"""


@dataclass(frozen=True)
class SideAnswer:
    """What the deployment's python answered (``error``: why it did not)."""

    versions: dict[str, str | None] = field(default_factory=dict)
    script_sha256: str = ""
    engine_lines: list[str] = field(default_factory=list)
    configs: dict[str, str] = field(default_factory=dict)
    # For the record (opsbook.steps.record_facts): the digest of what `pip freeze` lists, the
    # kernel's command line, and the checkpoint's Hugging Face revision with where it was read.
    freeze_digest: str | None = None
    cmdline: str | None = None
    revision: str | None = None
    revision_source: str | None = None
    error: str = ""

    @classmethod
    def parse(cls, text: str) -> SideAnswer:
        doc: dict[str, Any] = json.loads(text)
        return cls(
            versions={str(k): (str(v) if v else None) for k, v in doc["versions"].items()},
            script_sha256=str(doc.get("script_sha256") or ""),
            engine_lines=[str(line) for line in doc.get("engine_lines") or []],
            configs={str(k): str(v) for k, v in (doc.get("configs") or {}).items()},
            freeze_digest=doc.get("freeze_digest"),
            cmdline=doc.get("cmdline"),
            revision=doc.get("revision"),
            revision_source=doc.get("revision_source"),
        )

    def version(self, name: str) -> str:
        """A distribution's version, ``not installed``, or unknown when not read."""
        if self.error:
            return UNKNOWN
        return self.versions.get(name) or NOT_INSTALLED


def facts_for_side(host: RemoteHost, deployment: Deployment) -> HostFacts | None:
    """The GPUs, driver, CUDA and vLLM of the host (the facts probe's light part); None when
    the probe did not answer, which leaves them unknown rather than failing the stage that
    reads them beside its own work (an unreachable host is that stage's result)."""
    try:
        return host_facts.gather_facts(host, deployment, host_facts.PATCH_FACTS)
    except HostUnreachable:
        raise
    except OpsbookError:
        return None


def side_command(deployment: Deployment) -> list[str]:
    """The command line that asks the deployment's python (run in the home folder, where a
    ``~/`` path begins): :func:`read_side` runs it, or a status probe beside a ready server's
    status (:func:`opsbook.steps.triage.server_state`'s ``when_healthy``)."""
    return [
        deployment.python.removeprefix("~/"),
        "-c",
        SIDE_SCRIPT,
        deployment.script_path,
        deployment.log_path,
        deployment.model_path,
        # With the start's memory lines: the capacity figures of 04's record, in this read.
        json.dumps([*ENGINE_LINE_MARKS, *KV_LINE_MARKS, *MEMORY_LINE_MARKS]),
        str(LOG_TAIL_BYTES),
        *compat.CONFIG_FILES,
    ]


def side_answer(exit_code: int | None, output: str) -> SideAnswer:
    """What :func:`side_command` answered (its output and errors together); what it did not
    answer is unknown (``SideAnswer.error``)."""
    if exit_code != 0:
        said = output.strip().splitlines()
        return SideAnswer(error=said[-1] if said else f"exit code {exit_code}")
    try:
        return SideAnswer.parse(output.strip().splitlines()[-1])
    except (ValueError, KeyError, IndexError, TypeError):
        return SideAnswer(error=f"not an answer: {output[:200]!r}")


def read_side(host: RemoteHost, deployment: Deployment) -> SideAnswer:
    """Ask the deployment's python on the host (one command); what it did not answer is
    unknown (``SideAnswer.error``)."""
    try:
        done = host.run(
            f"cd && {shlex.join(side_command(deployment))} 2>&1",
            label="the versions, launch script hash and engine's choices of the deployment's "
            "python",
        )
    except HostUnreachable:
        raise
    except OpsbookError as e:
        return SideAnswer(error=e.message)
    return side_answer(done.exit_code, done.stdout)


def engine_from_log(lines: Sequence[str]) -> tuple[str, str]:
    """The KV-cache dtype and attention backend the last start-up's lines name (unknown when
    they do not)."""
    kv, backend = UNKNOWN, UNKNOWN
    for line in lines:
        said_kv = KV_CACHE_DTYPE_SAID.search(line)
        if said_kv:
            kv, backend = said_kv.group("dtype"), UNKNOWN  # a new start-up begins here
        said_backend = ATTENTION_BACKEND_SAID.search(line)
        if said_backend:
            backend = said_backend.group("backend")
    return kv, backend


def predicted_engine(
    answer: SideAnswer, facts: HostFacts, deployment: Deployment
) -> tuple[str, str]:
    """The KV-cache dtype and attention backend vLLM is predicted to run with here (the
    checkpoint's configs, the GPUs' compute capability, the flags); unknown without configs."""
    if "config.json" not in answer.configs:
        flag = compat.normalize_serve_args(deployment.serve_args).get("kv-cache-dtype")
        return (str(flag) if flag else UNKNOWN), UNKNOWN
    model = compat.facts_from_texts(answer.configs)
    version = facts.vllm_version
    prediction = compat.check_compat(model, facts.gpus, version, deployment.serve_args)
    evidence = prediction.evidence
    names = sorted({c.name or "none fits" for c in evidence.backends.values()})
    return evidence.kv_cache_dtype, ", ".join(names) or UNKNOWN


def side_of(
    host: str,
    deployment: Deployment,
    facts: HostFacts | None,
    answer: SideAnswer,
    *,
    predict: bool = True,
) -> HostSide:
    """The host's side: its facts (from the preflight probe), the python's answer, and the
    engine's choices from the log; predicted when the log names none and ``predict`` (before
    a launch; after it, a host whose log names none runs no engine to compare)."""
    kv, backend = engine_from_log(answer.engine_lines)
    source = FROM_LOG if kv or backend else UNKNOWN
    if predict and not kv and facts is not None:
        kv, backend = predicted_engine(answer, facts, deployment)
        source = PREDICTED if kv or backend else UNKNOWN
    kv = KV_DTYPE_ALIASES.get(kv, kv)
    vllm = answer.version("vllm")
    if facts is not None and facts.python.found:
        vllm = facts.vllm_version or NOT_INSTALLED
    return HostSide(
        host=host,
        model=model_name(deployment),
        gpus=gpu_count_and_model(facts) if facts is not None else UNKNOWN,
        driver=(facts.driver or UNKNOWN) if facts is not None else UNKNOWN,
        cuda=(facts.cuda or UNKNOWN) if facts is not None else UNKNOWN,
        vllm=vllm,
        torch=answer.version("torch"),
        ray=answer.version("ray"),
        kv_cache_dtype=kv,
        attention_backend=backend,
        engine_from=source,
        script_sha256=answer.script_sha256,
    )


def gpu_count_and_model(facts: HostFacts) -> str:
    """``8 × NVIDIA B200`` (``none`` without GPUs)."""
    kinds = Counter(g.name for g in facts.gpus)
    return ", ".join(f"{count} × {name}" for name, count in kinds.items()) or "none"


def model_name(deployment: Deployment) -> str:
    """The model a host serves, as hosts are grouped to be compared: its served name, else
    its checkpoint folder's name (the hosts' folders may differ)."""
    served = compat.normalize_serve_args(deployment.serve_args).get("served-model-name")
    if isinstance(served, list) and served:
        served = served[0]
    return str(served) if served else posixpath.basename(deployment.model_path.rstrip("/"))


__all__ = [
    "FROM_LOG",
    "PREDICTED",
    "SideAnswer",
    "engine_from_log",
    "model_name",
    "predicted_engine",
    "read_side",
    "side_of",
]
