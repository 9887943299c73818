"""06_qualify's receipt: what was measured on a host, with the hardware and software it ran on;
one schema (:data:`SCHEMA`), filed as ``qualify/receipt.json`` in the run folder, and found
again in earlier run folders to judge the next run against.

The hardware fingerprint (GPU model and count, driver, CUDA, CPU model, the PCIe topology's
hash, the kernel's IOMMU/ACS flags, the GPUs' power limits) decides which receipts are
comparable: only those of the same fingerprint and model are judged against; the software
(vLLM, torch, flags, env, model manifest, launch script) is recorded and said when it differs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opsbook.core.deployment import Deployment
from opsbook.knowledge.capacity.start_figures import Observed, observed_in_log
from opsbook.knowledge.logscan.line_grammar import ENGINE_LINE_MARKS, KV_LINE_MARKS
from opsbook.remote.protocol import RemoteHost
from opsbook.steps.host_facts import HostFacts
from opsbook.steps.host_side import engine_from_log
from opsbook.steps.qualify_matrix import CellResult, SkippedCell

SCHEMA = "opsbook.qualify.receipt/1"
FOLDER = "qualify"
RECEIPT_FILE = "receipt.json"
# Kernel command-line words that change PCIe peer-to-peer (IOMMU, ACS): the topology's
# behaviour depends on them as much as on the slots (local-inference-lab/rtx6kpro issue 25).
KERNEL_FLAGS = ("iommu", "intel_iommu", "amd_iommu", "pcie_acs_override", "pci")
_write_lock = threading.Lock()


@dataclass(frozen=True)
class Fingerprint:
    """The hardware a measurement is only comparable on."""

    gpu_model: str = ""
    gpu_count: int = 0
    driver: str = ""
    cuda: str = ""
    cpu_model: str = ""
    topology_sha256: str = ""
    kernel_flags: tuple[str, ...] = ()
    power_limits_w: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        """A short hash of the fingerprint: receipts with the same id are compared."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def differences(self, other: Fingerprint) -> list[str]:
        """``field: this vs other`` for each field that differs."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{k}: {mine[k]} vs {theirs[k]}" for k in mine if mine[k] != theirs[k]]


@dataclass(frozen=True)
class Software:
    """What served: the engine, its flags and env (secrets left out), the model and script."""

    vllm: str = ""
    torch: str = ""
    python: str = ""
    serve_args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    model_path: str = ""
    model: str = ""
    manifest_sha256: str = ""
    script_sha256: str = ""

    def differences(self, other: Software) -> list[str]:
        mine, theirs = asdict(self), asdict(other)
        return [f"{k}: {mine[k]} vs {theirs[k]}" for k in mine if mine[k] != theirs[k]]


@dataclass(frozen=True)
class Startup:
    """What the server's log said at startup (the existing diagnosis, and its KV lines)."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    attention_backend: str = ""
    kv_cache_dtype: str = ""
    phases_s: dict[str, float] = field(default_factory=dict)


@dataclass
class Receipt:
    """One host's qualification."""

    host: str
    started_at: str
    profile: str
    driver: str
    fingerprint: Fingerprint
    software: Software
    startup: Startup
    cells: list[CellResult] = field(default_factory=list)
    skipped_cells: list[SkippedCell] = field(default_factory=list)
    greedy_sha256: dict[str, str] = field(default_factory=dict)
    deterministic: bool | None = None
    degenerate: dict[str, str] = field(default_factory=dict)
    evaluation: dict[str, Any] | None = None
    tool_calls: dict[str, Any] | None = None
    passed: bool = False
    findings: list[dict[str, str]] = field(default_factory=list)
    compared_with: str = ""
    run_folder: str = ""
    schema: str = SCHEMA

    @property
    def fingerprint_id(self) -> str:
        return self.fingerprint.id

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["fingerprint_id"] = self.fingerprint_id
        return doc

    def cell(self, prompt_tokens: int, concurrency: int) -> CellResult | None:
        return next(
            (
                c
                for c in self.cells
                if c.cell.prompt_tokens == prompt_tokens and c.cell.concurrency == concurrency
            ),
            None,
        )


def receipt_from_dict(doc: dict[str, Any]) -> Receipt:
    """A receipt read back from its JSON (the same schema).

    Raises:
        ValueError: not a receipt of this schema.
    """
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"not a {SCHEMA} receipt: {doc.get('schema')!r}")
    from opsbook.steps import qualify_matrix as matrix

    def cell_of(raw: dict[str, Any]) -> CellResult:
        fields: dict[str, Any] = dict(raw)
        for name in ("ttft_ms", "tpot_ms", "itl_ms"):
            fields[name] = matrix.Spread(**raw[name])
        fields["cell"] = matrix.Cell(**raw["cell"])
        fields["errors"] = tuple(raw.get("errors") or ())
        return CellResult(**fields)

    fingerprint = doc["fingerprint"]
    return Receipt(
        host=doc["host"],
        started_at=doc["started_at"],
        profile=doc["profile"],
        driver=doc["driver"],
        fingerprint=Fingerprint(
            **{
                **fingerprint,
                "kernel_flags": tuple(fingerprint.get("kernel_flags") or ()),
                "power_limits_w": tuple(fingerprint.get("power_limits_w") or ()),
            }
        ),
        software=Software(**doc["software"]),
        startup=Startup(**doc["startup"]),
        cells=[cell_of(c) for c in doc.get("cells") or []],
        skipped_cells=[
            matrix.SkippedCell(matrix.Cell(**s["cell"]), s["reason"])
            for s in doc.get("skipped_cells") or []
        ],
        greedy_sha256=dict(doc.get("greedy_sha256") or {}),
        deterministic=doc.get("deterministic"),
        degenerate=dict(doc.get("degenerate") or {}),
        evaluation=doc.get("evaluation"),
        tool_calls=doc.get("tool_calls"),
        passed=bool(doc.get("passed")),
        findings=list(doc.get("findings") or []),
        compared_with=doc.get("compared_with") or "",
        run_folder=doc.get("run_folder") or "",
    )


def fingerprint_of(host: RemoteHost, facts: HostFacts) -> tuple[Fingerprint, dict[str, str]]:
    """The host's hardware fingerprint (its facts, and one command for the CPU, the kernel's
    flags, the power limits and the topology), and what that command read of the software
    (``torch``)."""
    said = _read_host_extras(host, facts.python.requested)
    gpus = facts.gpus
    topology = facts.topology
    topo = json.dumps(topology.links, sort_keys=True) if topology.links else said.get("topo", "")
    flags = tuple(
        word
        for word in said.get("cmdline", "").split()
        if word.split("=")[0] in KERNEL_FLAGS or word.startswith(("iommu", "pcie_acs"))
    )
    fingerprint = Fingerprint(
        gpu_model=gpus[0].name if gpus else "",
        gpu_count=len(gpus),
        driver=facts.driver or "",
        cuda=facts.cuda or "",
        cpu_model=said.get("cpu", ""),
        topology_sha256=hashlib.sha256(topo.encode()).hexdigest()[:16] if topo else "",
        kernel_flags=flags,
        power_limits_w=tuple(p.strip() for p in said.get("power", "").split(",") if p.strip()),
    )
    return fingerprint, {"torch": said.get("torch", "")}


def _read_host_extras(host: RemoteHost, python: str) -> dict[str, str]:
    """``cpu``, ``cmdline``, ``power`` and ``torch``, one line each, in one command."""
    torch = (
        "import importlib.metadata as m\ntry: print(m.version('torch'))\n"
        "except Exception: print('')"
    )
    command = (
        "printf 'cpu=%s\\n' \"$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- "
        "| sed 's/^ *//')\"; "
        "printf 'cmdline=%s\\n' \"$(cat /proc/cmdline 2>/dev/null)\"; "
        "printf 'power=%s\\n' \"$(nvidia-smi --query-gpu=power.limit --format=csv,noheader "
        '2>/dev/null | paste -sd, -)"; '
        f"printf 'torch=%s\\n' \"$({shlex.quote(python)} -c {shlex.quote(torch)} 2>/dev/null)\""
    )
    done = host.run(command, label="qualify fingerprint")
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("cpu", "cmdline", "power", "torch"):
            found[key] = value.strip()
    return found


def software_of(
    deployment: Deployment, facts: HostFacts, torch: str, model: str, script_sha256: str
) -> Software:
    """The software side, the deployment's secret env variables left out."""
    env = {k: v for k, v in deployment.env.items() if not deployment.is_secret_variable(k)}
    secret_flags = {flag for flag in deployment.secret_args()}
    args = {k: ("***" if k in secret_flags else v) for k, v in deployment.serve_args.items()}
    manifest = json.dumps(
        {"model_path": deployment.model_path, "args": args, "env": env}, sort_keys=True
    )
    return Software(
        vllm=facts.vllm_version or "",
        torch=torch,
        python=facts.python.version or "",
        serve_args=args,
        env=env,
        model_path=deployment.model_path,
        model=model,
        manifest_sha256=hashlib.sha256(manifest.encode()).hexdigest()[:16],
        script_sha256=script_sha256,
    )


def write_receipt(folder: Path, receipt: Receipt) -> Path:
    """Add the host's receipt to ``<folder>/qualify/receipt.json`` (one file for the run's
    hosts, each written whole under a lock: the hosts of a stage finish in threads)."""
    path = folder / FOLDER / RECEIPT_FILE
    with _write_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = {"schema": SCHEMA, "receipts": []}
        kept = [r for r in doc.get("receipts", []) if r.get("host") != receipt.host]
        doc["receipts"] = [*kept, receipt.to_dict()]
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(doc, indent=2, default=_plain))
        temporary.replace(path)
    return path


def write_raw(folder: Path, host: str, cells: Sequence[CellResult]) -> list[Path]:
    """Each cell's raw ``vllm bench serve`` JSON beside the receipt."""
    anchor = "".join(c if c.isalnum() else "-" for c in host)
    written = []
    for cell in cells:
        if cell.raw:
            path = (
                folder
                / FOLDER
                / anchor
                / f"bench-{cell.cell.prompt_tokens}x{cell.cell.concurrency}.json"
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(cell.raw)
            written.append(path)
    return written


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return str(value)


def runs_root(folder: Path) -> Path:
    """The folder the run folders are in (a rolling run's batch folder is one level down)."""
    return folder.parent.parent if folder.name.startswith("batch-") else folder.parent


def earlier_receipts(folder: Path) -> Iterator[Receipt]:
    """The receipts filed by earlier runs beside ``folder``, oldest first; an unreadable or
    other-schema file is passed over."""
    root = runs_root(folder)
    found: list[Receipt] = []
    paths = [
        *root.glob(f"*/{FOLDER}/{RECEIPT_FILE}"),
        *root.glob(f"*/batch-*/{FOLDER}/{RECEIPT_FILE}"),
    ]
    for path in paths:
        if path.parent.parent == folder:
            continue
        for receipt in receipts_in(path):
            receipt.run_folder = receipt.run_folder or str(path.parent.parent)
            found.append(receipt)
    yield from sorted(found, key=lambda r: r.started_at)


def receipts_in(path: Path) -> list[Receipt]:
    """The receipts one ``receipt.json`` holds; an unreadable file or entry counts for none."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    found = []
    for raw in doc.get("receipts", []) if isinstance(doc, dict) else []:
        try:
            found.append(receipt_from_dict(raw))
        except (KeyError, TypeError, ValueError):
            continue
    return found


def startup_of(host: RemoteHost, log_path: str, phases: Sequence[Any]) -> Startup:
    """The startup facts: the KV cache and concurrency lines of the server's log (picked out
    on the host: a log can be hundreds of MB) and the phases the diagnosis found, each with
    the seconds since the first."""
    marks = " ".join(f"-e {shlex.quote(m)}" for m in (*KV_LINE_MARKS, *ENGINE_LINE_MARKS))
    done = host.run(
        f"grep -a -F {marks} -- {shlex.quote(log_path)} | tail -n 40", label="startup facts"
    )
    lines = done.stdout.splitlines()
    said = observed_in_log(done.stdout) or Observed()
    kv_dtype, backend = engine_from_log(lines)
    stamped = [p for p in phases if p.timestamp is not None]
    seconds = {
        p.name: round((p.timestamp - stamped[0].timestamp).total_seconds(), 1) for p in stamped
    }
    return Startup(said.kv_tokens, said.concurrency, backend, kv_dtype, seconds)
