"""The capacity plan: before the long load, how many KV tokens a start will have, whether it
will start at all, and which ``server.args`` edit buys what.

Its inputs are read from local files (``opsbook plan --offline``) or over SSH in one probe
(``weight_table``: the config texts and every shard header's tensor bytes); the arithmetic is
:mod:`opsbook.knowledge.capacity`. After a launch, vLLM's own figures are read from its log
(:func:`observed_in_log`) and kept beside the prediction (:func:`record_entry`) in the
capacity record: the non-KV overhead they measure is the next plan's prior.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsbook.core.deployment import Deployment
from opsbook.core.exceptions import DeploymentError
from opsbook.core.results import Finding, Result, Table
from opsbook.knowledge import capacity as cap
from opsbook.knowledge.capacity import Observed, default_utilization, observed_in_log
from opsbook.knowledge.capacity.start_figures import flag_text
from opsbook.knowledge.compat.model_config import ModelFacts, facts_from_texts, parse_json
from opsbook.knowledge.compat.prediction import (
    check_compat,
    normalize_serve_args,
    resolve_kv_cache_dtype,
)
from opsbook.remote.probes import shard_read, weight_table
from opsbook.remote.protocol import RemoteHost

if TYPE_CHECKING:
    from opsbook.steps.host_facts import HostFacts

GIB = cap.GIB
PROBE = "weight_table"
# With more than one GPU NCCL needs memory outside vLLM's share: on 8 x RTX PRO 6000 "NCCL
# error: Failed to CUDA calloc 10485760 bytes" at 0.95, "Reduce to --gpu-memory-utilization
# 0.93" (voipmonitor/rtx6kpro models/kimi-k25.md).
UTILIZATION_CAP_NCCL = 0.93
UTILIZATION_CAP = 0.95
# What DCP costs: GLM-5.2 on 8 x RTX PRO 6000 decoded 39.6 -> 27.0 tok/s from DCP 1 to 8
# (local-inference-lab/rtx6kpro issue 25).
DCP_COST = "slower decode (GLM-5.2 on 8 x RTX PRO 6000: 39.6 -> 27.0 tok/s at DCP 8, rtx6kpro #25)"
WILL_STOP, MAY_STOP, PREEMPTION, FITS = "will stop", "may stop", "preemption", "fits"
# Serve arguments in, what would stop vLLM with them that does not stop it now ("": nothing).
Breaks = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class Checkpoint:
    """What the plan reads of a checkpoint: its config and its tensors' bytes (and whether the
    CPU of the machine it was read on has AMX tiles, which sets vLLM's block on CPU)."""

    model_dir: str
    config: dict[str, Any]
    facts: ModelFacts
    tensors: tuple[tuple[str, int], ...]
    shards: int
    cpu_amx: bool | None = None

    @cached_property
    def multimodal(self) -> bool:
        return any(cap.tensor_kind(name) == "encoder" for name, _ in self.tensors)


@dataclass(frozen=True)
class Gpus:
    """The GPUs of a start: how many, the smallest one's memory in bytes (None: unknown),
    the platform (``cuda`` or ``cpu``) and, on CPU, whether it has AMX tiles."""

    count: int
    memory: int | None
    platform: str = "cuda"
    amx: bool | None = None


@dataclass(frozen=True)
class Knob:
    """One ``server.args`` edit, what it buys and what it costs."""

    edit: Mapping[str, Any]
    gain: str
    cost: str
    tokens: tuple[int, int]
    verdict: str

    @property
    def edit_text(self) -> str:
        return ", ".join(f"server.args.{k}: {_yaml(v)}" for k, v in self.edit.items())


@dataclass(kw_only=True, repr=False)
class CapacityPlan(Result):
    """The plan's verdict (``will stop``, ``may stop``, ``preemption``, ``fits``) and its
    evidence. Token and memory pairs are bands: (low, high)."""

    verdict: str
    shape: cap.KvShape
    weights: cap.Weights | None
    weights_logged: int | None
    budget: int | None
    overhead: tuple[int, int] | None
    overhead_source: str
    kv_memory: tuple[int, int]
    tokens: tuple[int, int]
    concurrency: tuple[float, float]
    max_model_len: int
    max_num_seqs: int
    one_request: int
    flags: Mapping[str, str]
    knobs: list[Knob] = field(default_factory=list)
    observed: Observed | None = None
    vllm_version: str | None = None
    gpu_memory: int | None = None
    utilization: float | None = None  # None: kv-cache-memory-bytes fixes the KV memory

    def table(self) -> Table:
        """The plan's figures, each with where it comes from."""
        rows = [
            ["KV dtype", self.shape.dtype, f"{self.shape.formula}; block {self.shape.block_size}"],
            ["KV bytes per token per GPU", f"{self.shape.token_bytes:,}",
             f"{self.shape.layers} layers, DCP {self.shape.dcp}"],
        ]  # fmt: skip
        if self.weights is not None:
            rows.append(["weights per GPU", _gib(self.weights.per_rank),
                         f"of {_gib(self.weights.total)} in the safetensors headers"])  # fmt: skip
        if self.weights_logged is not None:
            rows.append(["weights per GPU, vLLM's", _gib(self.weights_logged),
                         "'Model loading took' of the earlier starts: used"])  # fmt: skip
        if self.budget is not None and self.overhead is not None:
            rows += [
                ["budget per GPU", _gib(self.budget), "GPU memory x gpu-memory-utilization"],
                ["non-KV overhead", _band(self.overhead, _gib), self.overhead_source],
            ]
        rows += [
            ["KV memory per GPU", _band(self.kv_memory, _gib), "what vLLM will find"],
            ["KV tokens", _band(self.tokens, _count), "vLLM's 'KV cache size: N tokens'"],
            [f"max concurrency at {self.max_model_len:,}",
             _band(self.concurrency, lambda c: f"{c:.2f}x"), f"max-num-seqs {self.max_num_seqs}"],
            ["one full-length request", _gib(self.one_request), "KV memory per GPU, + a block"],
        ]  # fmt: skip
        if self.observed is not None and self.observed.sized:
            rows.append(["observed (last start)", _observed_text(self.observed), "its log"])
        return Table(["figure", "value", "from"], rows)

    def knobs_table(self) -> Table:
        """The knobs, best first, each as the exact edit of the deployment file."""
        rows = [
            [k.edit_text, _band(k.tokens, _count), k.verdict, k.gain, k.cost] for k in self.knobs
        ]
        return Table(["edit", "KV tokens", "then", "buys", "costs"], rows)


def plan_capacity(
    checkpoint: Checkpoint,
    serve_args: Mapping[str, Any],
    gpus: Gpus,
    *,
    vllm_version: str | None = None,
    history: Sequence[Mapping[str, Any]] = (),
    observed: Observed | None = None,
    knobs: bool = True,
    breaks: Breaks | None = None,
) -> CapacityPlan:
    """The plan for a start with ``serve_args`` on ``gpus``.

    The KV memory is ``kv-cache-memory-bytes`` when set (exact), else ``GPU memory x
    gpu-memory-utilization - weights per GPU - overhead``, the overhead learned from
    ``history`` (capacity-record entries of this host) for the same vLLM version and
    :data:`OVERHEAD_FLAGS`, else the default band.

    Raises:
        DeploymentError: an input the plan needs is missing or wrong (named, with the remedy).
    """
    args = normalize_serve_args(serve_args)
    parallel = cap.Parallel.from_args(args)
    facts = checkpoint.facts
    shape = kv_shape_for(checkpoint, args, gpus, parallel)
    max_model_len = _max_model_len(args, checkpoint.config)
    max_num_seqs = int(
        args.get("max-num-seqs")
        or cap.default_max_num_seqs(gpus.platform, gpus.memory, parallel.tp * parallel.pp)
    )
    flags = cap.overhead_flags(args)
    weights = budget = overhead = logged = utilization = None
    source = ""
    if args.get("kv-cache-memory-bytes"):
        exact = _memory_bytes(args["kv-cache-memory-bytes"])
        kv_memory = (exact, exact)
    else:
        extensible = cap.extensible_kv_cache(vllm_version, gpus.platform, args)
        utilization = float(
            args.get("gpu-memory-utilization") or default_utilization(vllm_version, extensible)
        )
        weights = cap.weights_per_rank(
            checkpoint.tensors,
            parallel,
            facts.num_layers,
            language_only=_true(args.get("language-model-only")),
        )
        memory = _gpu_memory(gpus)
        budget = int(memory * utilization)
        overhead, source, logged = overhead_prior(
            history, vllm_version, flags, checkpoint, args, gpus.memory, extensible
        )
        # With a learned overhead the weights are vLLM's own figure it was measured against.
        held = weights.per_rank if logged is None else logged
        kv_memory = cap.kv_memory_band(memory, utilization, held, overhead)
    low = cap.kv_capacity(kv_memory[0], shape, max_model_len)
    high = cap.kv_capacity(kv_memory[1], shape, max_model_len)
    one = cap.one_request_bytes(shape, max_model_len)
    verdict = _verdict(kv_memory, one, low.tokens, max_num_seqs * max_model_len)
    plan = CapacityPlan(
        verdict not in (WILL_STOP, MAY_STOP),
        "",
        verdict=verdict,
        shape=shape,
        weights=weights,
        weights_logged=logged,
        budget=budget,
        overhead=overhead,
        overhead_source=source,
        kv_memory=kv_memory,
        tokens=(low.tokens, high.tokens),
        concurrency=(low.concurrency, high.concurrency),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        one_request=one,
        flags=flags,
        observed=observed,
        vllm_version=vllm_version,
        gpu_memory=gpus.memory,
        utilization=utilization,
    )
    plan.message = verdict_message(plan)
    plan.findings = _findings(plan)
    if knobs:
        plan.knobs = rank_knobs(checkpoint, args, gpus, plan, vllm_version, history, breaks)
    return plan


def kv_shape_for(
    checkpoint: Checkpoint, args: Mapping[str, Any], gpus: Gpus, parallel: cap.Parallel
) -> cap.KvShape:
    """The KV shape of this start: the KV dtype as compat resolves it (flag, else the
    checkpoint's), stored as the attention backend stores it, and vLLM's block size."""
    facts = checkpoint.facts
    kv_dtype, _ = resolve_kv_cache_dtype(facts, args)
    stored = cap.stored_kv_dtype(facts, kv_dtype, args.get("attention-backend"))
    block = cap.block_size_for(facts, args, gpus.platform, gpus.amx)
    return cap.kv_shape(facts, checkpoint.config, stored, parallel, block)


def verdict_message(plan: CapacityPlan) -> str:
    """One line: the verdict and the figures behind it."""
    tokens = _band(plan.tokens, _count)
    if plan.verdict == WILL_STOP:
        return (
            f"will stop after the load: one {plan.max_model_len:,}-token request needs "
            f"{_gib(plan.one_request)} of KV cache per GPU, has {_band(plan.kv_memory, _gib)}"
        )
    if plan.verdict == MAY_STOP:
        return (
            f"may stop after the load: one {plan.max_model_len:,}-token request needs "
            f"{_gib(plan.one_request)} of KV cache per GPU, has {_band(plan.kv_memory, _gib)} "
            "(the overhead decides)"
        )
    if plan.verdict == PREEMPTION:
        need = plan.max_num_seqs * plan.max_model_len
        return (
            f"starts with {tokens} KV tokens, but {plan.max_num_seqs} full-length requests "
            f"need {need:,}: preemption"
        )
    return f"fits: {tokens} KV tokens, {plan.max_num_seqs} full-length requests at once"


def rank_knobs(
    checkpoint: Checkpoint,
    args: Mapping[str, Any],
    gpus: Gpus,
    plan: CapacityPlan,
    vllm_version: str | None,
    history: Sequence[Mapping[str, Any]],
    breaks: Breaks | None = None,
) -> list[Knob]:
    """The edits worth trying, each planned again: those after which the start does not stop
    first, then by the tokens they give (low end). An edit ``breaks`` says stops vLLM
    otherwise (FP8 KV where no backend of the GPUs takes it) is not offered."""
    found = []
    for edit, cost in candidate_edits(checkpoint, args, plan, vllm_version):
        if breaks is not None and breaks({**args, **edit}):
            continue
        after = plan_capacity(
            checkpoint, {**args, **edit}, gpus, vllm_version=vllm_version, history=history,
            knobs=False,
        )  # fmt: skip
        if after.tokens[0] <= plan.tokens[0] and after.verdict == plan.verdict:
            continue
        gain = _gain(plan, after)
        found.append(Knob(edit, gain, cost, after.tokens, after.verdict))
    return sorted(found, key=lambda k: (k.verdict in (WILL_STOP, MAY_STOP), -k.tokens[0]))


def candidate_edits(
    checkpoint: Checkpoint,
    args: Mapping[str, Any],
    plan: CapacityPlan,
    vllm_version: str | None = None,
) -> list[tuple[dict[str, Any], str]]:
    """The edits the plan tries, with what each costs."""
    shape = plan.shape
    edits: list[tuple[dict[str, Any], str]] = []
    if shape.dtype in ("auto", "bfloat16", "float16", "half", "float32"):
        edits.append(({"kv-cache-dtype": "fp8"}, "accuracy may drop without calibrated scales"))
    tp = int(args.get("tensor-parallel-size") or 1)
    if tp > 1 and shape.dcp == 1 and checkpoint.facts.mla:
        edits.append(({"decode-context-parallel-size": tp}, DCP_COST))
    fitting = _fitting_length(plan)
    if 0 < fitting < plan.max_model_len:
        edits.append(({"max-model-len": fitting}, "shorter requests only"))
    if args.get("kv-cache-memory-bytes"):
        wanted = -(-plan.one_request // 2**20) * 2**20
        if wanted > plan.kv_memory[0]:
            taken = "taken from the memory left to activations: check it is there"
            edits.append(({"kv-cache-memory-bytes": wanted}, taken))
    else:
        utilization = plan.utilization or 1.0
        ceiling = UTILIZATION_CAP_NCCL if plan.shape.dcp > 1 or tp > 1 else UTILIZATION_CAP
        if utilization < ceiling:
            headroom = f"less headroom; capped at {ceiling} where NCCL needs memory"
            edits.append(({"gpu-memory-utilization": ceiling}, headroom))
    if plan.verdict == PREEMPTION and plan.concurrency[0] >= 1:
        edits.append(({"max-num-seqs": max(1, int(plan.concurrency[0]))}, "fewer requests at once"))
    return edits


def overhead_prior(
    history: Sequence[Mapping[str, Any]],
    vllm_version: str | None,
    flags: Mapping[str, str],
    checkpoint: Checkpoint,
    args: Mapping[str, Any],
    gpu_memory: int | None,
    extensible: bool = False,
) -> tuple[tuple[int, int], str, int | None]:
    """The non-KV overhead band, where it comes from, and the weights per GPU it was measured
    against (vLLM's "Model loading took", None with the default band): the median of this
    host's earlier starts with the same vLLM version, flags and GPU memory."""
    alike = [
        entry
        for entry in history
        if entry.get("overhead") is not None
        and cap.same_release(entry.get("vllm_version"), vllm_version)
        and dict(entry.get("flags") or {}) == dict(flags)
        and entry.get("gpu_memory") == gpu_memory
    ]
    if alike:
        band = cap.learned_overhead([int(entry["overhead"]) for entry in alike])
        weights = sorted(int(entry["observed"]["weights"]) for entry in alike)
        told = f"learned: median of {len(alike)} earlier start(s) here, vLLM {vllm_version}"
        return band, told, weights[len(weights) // 2]
    band = cap.default_overhead(
        checkpoint.multimodal and not _true(args.get("language-model-only")),
        str(args.get("load-format", "")) == "fastsafetensors",
        extensible,
    )
    return band, "default band (no earlier start here with this vLLM and these flags)", None


# -- reading the inputs ------------------------------------------------------------------------


def checkpoint_of(answer: Mapping[str, Any]) -> Checkpoint:
    """The :class:`Checkpoint` from the ``weight_table`` probe's answer.

    Raises:
        DeploymentError: the folder is missing or holds no config.json.
    """
    folder = str(answer.get("model_dir") or "")
    if answer.get("error"):
        raise DeploymentError(
            f"the model folder cannot be read: {answer['error']}",
            remedy="set model.path to the checkpoint folder (the one holding config.json)",
        )
    texts = {k: v for k, v in dict(answer.get("files") or {}).items() if v}
    if "config.json" not in texts:
        raise DeploymentError(
            f"{folder} holds no config.json: the plan needs the model's sizes",
            remedy="point model.path (or --model-dir) at the checkpoint folder",
        )
    config = parse_json("config.json", texts["config.json"])
    tensors = tuple((str(name), int(size)) for name, size in answer.get("tensors") or ())
    amx = answer.get("amx")
    return Checkpoint(folder, config, facts_from_texts(texts), tensors, int(answer["shards"]), amx)


def read_local_checkpoint(model_dir: str | Path, cache: Path | None = None) -> Checkpoint:
    """The checkpoint from a local folder: the same probe, run here. Its tensor table is kept
    in ``cache`` (default :func:`table_cache`) for the shards as they are (name, size,
    modification time): planning the same copy again, knob after knob, skips parsing a
    quarter-million header entries (0.3 s of a Kimi-K2.5 plan)."""
    answer = weight_table.main({"dir": str(model_dir), "tensors": False})
    if answer["error"]:
        return checkpoint_of(answer)
    folder = answer["model_dir"]
    shards = shard_read.shards_on_disk(shard_read.list_folder(folder))
    stamps = json.dumps([folder, weight_table.shard_stamps(folder, shards)])
    kept = (cache or table_cache()) / f"{hashlib.sha256(stamps.encode()).hexdigest()[:32]}.json"
    try:
        answer["tensors"], answer["unreadable"] = json.loads(kept.read_text())
    except (OSError, ValueError):
        answer["tensors"], answer["unreadable"] = weight_table.tensor_table(folder, shards)
        _keep(kept, [answer["tensors"], answer["unreadable"]])
    return checkpoint_of(answer)


def table_cache() -> Path:
    """Where tensor tables of local copies are kept: ``$XDG_CACHE_HOME/opsbook/plan``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opsbook" / "plan"


def _keep(path: Path, doc: Any) -> None:
    """Write a kept table (a temp file renamed over it); a cache that cannot be written is
    only slower."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(doc))
        temp.replace(path)
    except OSError:
        return


def read_host_checkpoint(
    host: RemoteHost, model_dir: str, configs: Mapping[str, str] | None = None
) -> Checkpoint:
    """The checkpoint on a host, in one round trip; ``configs`` (name to text) stand for the
    host's files of those names (a config as 02's patch will leave it)."""
    answer = host.probe(PROBE, {"dir": model_dir})
    if configs and not answer.get("error"):
        answer = {**answer, "files": {**dict(answer.get("files") or {}), **configs}}
    return checkpoint_of(answer)


def gpus_of(
    gpu_list: Sequence[Any],
    count: int,
    cpu_amx: bool | None = None,
    vllm_version: str | None = None,
) -> Gpus:
    """:class:`Gpus` from preflight's GPU facts (``memory_total_mib``). vLLM's platform is
    the CPU one when its version says ``cpu`` (a CPU build: 0.32.0 vllm/platforms/__init__.py,
    cpu_platform_plugin, ``vllm_version_matches_substr("cpu")``) or there is no GPU."""
    if not gpu_list or "cpu" in (vllm_version or ""):
        return Gpus(count, None, "cpu", cpu_amx)
    totals = [int(g.memory_total_mib) * 2**20 for g in gpu_list if g.memory_total_mib]
    return Gpus(count, min(totals) if totals else None)


def plan_on_host(
    host: RemoteHost,
    deployment: Deployment,
    *,
    found: HostFacts | None = None,
    vllm_version: str | None = None,
    record: Path | None = None,
    runs_dir: Path | None = None,
    configs: Mapping[str, str] | None = None,
) -> CapacityPlan:
    """The plan for the deployment's start on ``host``: its GPUs (``found``, else read now),
    the checkpoint's headers (its configs as ``configs`` give them, when given), and the last
    start's log, whose figures are kept beside their prediction in ``record`` (when given)
    and, with the record's earlier ones and those of the deployment's runs in ``runs_dir``
    (their facts.json), give the overhead."""
    # Imported here: an offline plan (opsbook plan --offline) does not pay for the SSH steps.
    from opsbook.steps import capacity_facts, host_facts

    if found is None:
        found = host_facts.gather_facts(host, deployment, host_facts.PATCH_FACTS)
    checkpoint = read_host_checkpoint(host, deployment.model_path, configs)
    args = deployment.serve_args
    parallel = cap.Parallel.from_args(normalize_serve_args(args))
    version = vllm_version or found.vllm_version
    gpus = gpus_of(found.gpus, parallel.gpus, checkpoint.cpu_amx, found.vllm_version)
    observed = last_start(host, deployment)
    history = read_history(record) if record is not None else []
    if runs_dir is not None:
        history += capacity_facts.run_history(runs_dir, deployment.source, host.name)
    if observed is not None and observed.sized:
        entry = _entry_for(checkpoint, args, gpus, observed, host.name, one_per_start(history))
        if record is None or add_to_history(record, entry):
            history.append(entry)
    return plan_capacity(
        checkpoint,
        args,
        gpus,
        vllm_version=version,
        history=one_per_start(history),
        observed=observed,
        breaks=failures_added(checkpoint.facts, found.gpus, version, args),
    )


def failures_added(
    facts: ModelFacts, gpus: Sequence[Any], vllm_version: str | None, args: Mapping[str, Any]
) -> Breaks:
    """What compat predicts an edit of ``args`` adds to stop vLLM on these GPUs (the knobs'
    check: a problem the start already has is 02's, not the knob's)."""
    before = _stopping(check_compat(facts, gpus, vllm_version, args))

    def breaks(edited: Mapping[str, Any]) -> str:
        after = check_compat(facts, gpus, vllm_version, edited)
        added = _stopping(after) - before
        return "; ".join(f.message for f in after.findings if f.code in added)

    return breaks


def _stopping(prediction: Result) -> set[str]:
    return {f.code for f in prediction.findings if f.severity == "error"}


def one_per_start(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The entries with one per start: a start read by a deploy's record and again by
    ``opsbook plan`` (the same figures, the same flags) counts once in the median."""
    kept: list[Mapping[str, Any]] = []
    for entry in entries:
        if not any(_same_start(entry, other) for other in kept):
            kept.append(entry)
    return kept


def _same_start(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    return one.get("observed") == other.get("observed") and one.get("flags") == other.get("flags")


def plan_offline(
    deployment: Deployment,
    model_dir: str | Path,
    gpu_memory: int | None,
    *,
    platform: str = "cuda",
    vllm_version: str | None = None,
    history: Sequence[Mapping[str, Any]] = (),
) -> CapacityPlan:
    """The plan from a local copy of the checkpoint's config and shards (headers only are
    read) and a GPU memory given by hand."""
    checkpoint = read_local_checkpoint(model_dir)
    args = deployment.serve_args
    parallel = cap.Parallel.from_args(normalize_serve_args(args))
    amx = checkpoint.cpu_amx if platform == "cpu" else None
    gpus = Gpus(parallel.gpus, gpu_memory, platform, amx)
    return plan_capacity(checkpoint, args, gpus, vllm_version=vllm_version, history=history)


def last_start(host: RemoteHost, deployment: Deployment) -> Observed | None:
    """vLLM's figures from the log of the deployment's last launch on the host (the part the
    status probe reads: its last 512 kB), None when there is no such log or it says none."""
    from opsbook.steps import server
    from opsbook.steps.launch_answers import StatusAnswer

    paths = server.resolve_paths(host, deployment)
    answer = host.probe(server.PROBE, paths.probe_args(op="status", port=deployment.server_port))
    log = StatusAnswer.parse(answer).log
    return observed_in_log(log.text) if log.exists and log.text else None


def _entry_for(
    checkpoint: Checkpoint,
    args: Mapping[str, Any],
    gpus: Gpus,
    observed: Observed,
    host: str,
    history: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The record entry of the last start: what the plan predicted for it (planned with the
    record as it stood before), beside what it logged."""
    before = plan_capacity(
        checkpoint, args, gpus, vllm_version=observed.version, history=history, knobs=False
    )
    return record_entry(before, observed, host=host, gpu_memory=gpus.memory)


# -- after a launch: vLLM's figures beside the prediction -------------------------------------


def record_entry(
    plan: CapacityPlan, observed: Observed, *, host: str, gpu_memory: int | None
) -> dict[str, Any]:
    """A capacity-record entry: the prediction beside what vLLM logged, and the overhead the
    start measured (None when its log lacks the weights or the KV memory, its KV size was
    fixed, or the GPU memory is unknown)."""
    overhead = None
    measured = observed.weights is not None and observed.kv_memory is not None
    if gpu_memory and measured and not observed.fixed_kv:
        overhead = cap.measured_overhead(
            gpu_memory, observed.utilization, observed.weights or 0, observed.kv_memory or 0
        )
    return {
        "host": host,
        "vllm_version": observed.version,
        "flags": dict(observed.flags),
        "gpu_memory": gpu_memory,
        "utilization": observed.utilization,
        "predicted": {
            "tokens": list(plan.tokens),
            "kv_memory": list(plan.kv_memory),
            "verdict": plan.verdict,
        },  # fmt: skip
        "observed": {
            "tokens": observed.kv_tokens,
            "concurrency": observed.concurrency,
            "kv_memory": observed.kv_memory,
            "weights": observed.weights,
        },  # fmt: skip
        "overhead": overhead,
    }


def read_history(path: Path) -> list[dict[str, Any]]:
    """The capacity record's entries (none when there is no record yet)."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise DeploymentError(
            f"cannot read the capacity record {path}: {e.strerror}",
            remedy="check the runs folder's permissions",
        ) from None
    return [json.loads(line) for line in lines if line.strip()]


def add_to_history(path: Path, entry: Mapping[str, Any]) -> bool:
    """Append ``entry`` unless the record holds one with the same observation (a plan run
    twice after one launch adds it once); whether it was added."""
    if any(_same_start(old, entry) for old in read_history(path)):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")
    return True


def deployment_history(runs_dir: Path, deployment: str) -> list[dict[str, Any]]:
    """The capacity records of every host of a deployment (an offline plan is for no one
    host in particular)."""
    folder = runs_dir / "capacity" / _slug(deployment)
    return [entry for path in sorted(folder.glob("*.jsonl")) for entry in read_history(path)]


def history_path(runs_dir: Path, deployment: str, host: str) -> Path:
    """Where a host's capacity record lives: ``<runs>/capacity/<deployment>/<host>.jsonl``."""
    return runs_dir / "capacity" / _slug(deployment) / f"{_slug(host)}.jsonl"


# -- small helpers -----------------------------------------------------------------------------


def _verdict(kv_memory: tuple[int, int], one: int, low_tokens: int, wanted: int) -> str:
    if kv_memory[1] < one:
        return WILL_STOP
    if kv_memory[0] < one:
        return MAY_STOP
    return PREEMPTION if low_tokens < wanted else FITS


def _findings(plan: CapacityPlan) -> list[Finding]:
    severity = {WILL_STOP: "error", MAY_STOP: "warning", PREEMPTION: "warning", FITS: "ok"}
    code = "capacity-" + plan.verdict.replace(" ", "-")
    return [Finding(severity[plan.verdict], "capacity", plan.message, code=code)]


def _gain(before: CapacityPlan, after: CapacityPlan) -> str:
    if before.tokens[0] > 0 and after.tokens[0] != before.tokens[0]:
        return f"x{after.tokens[0] / before.tokens[0]:.2f} tokens"
    return f"{after.verdict} instead of {before.verdict}"


def _fitting_length(plan: CapacityPlan) -> int:
    """The longest max-model-len that starts, when the plan stops (rounded down to 1,024);
    0 otherwise: a start that runs keeps the length its users asked for."""
    if plan.verdict not in (WILL_STOP, MAY_STOP):
        return 0
    longest = cap.longest_request(plan.kv_memory[0], plan.shape)
    return longest // 1024 * 1024 if longest >= 1024 else longest


def _max_model_len(args: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """``max-model-len``, else the model's ``max_position_embeddings`` (vLLM's default,
    0.32.0 vllm/config/model.py _get_and_verify_max_len)."""
    asked = args.get("max-model-len")
    if asked not in (None, "", -1, "-1", "auto"):
        return _memory_bytes(asked, name="max-model-len")
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else None
    value = (text or config).get("max_position_embeddings")
    if not value:
        raise DeploymentError(
            "the model's config.json has no max_position_embeddings",
            remedy="set server.args.max-model-len",
        )
    return int(value)


def _memory_bytes(value: Any, name: str = "kv-cache-memory-bytes") -> int:
    """A count as vLLM reads it: plain or with a suffix, ``k``/``m``/``g`` powers of 1000 and
    ``K``/``M``/``G`` of 1024 (0.32.0 vllm/utils/argparse_utils.py, human_readable_int)."""
    text = str(value).strip()
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)", text)
    if not found:
        raise DeploymentError(
            f"server.args.{name} is {value!r}, not a number",
            remedy=f"set server.args.{name} to a whole number (suffixes k, M, G allowed)",
        )
    number, suffix = float(found[1]), found[2]
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]  # fmt: skip
    return int(number * scale)


def _gpu_memory(gpus: Gpus) -> int:
    if gpus.platform == "cpu":
        raise DeploymentError(
            "vLLM's CPU platform sizes its KV cache from kv-cache-memory-bytes (or "
            "VLLM_CPU_KVCACHE_SPACE), which the deployment does not set",
            remedy="set server.args.kv-cache-memory-bytes",
        )
    if gpus.memory is None:
        raise DeploymentError(
            "the GPUs' memory is unknown, so the KV budget cannot be planned",
            remedy="plan over SSH (the host's nvidia-smi says it), give --gpu-memory MIB "
            "offline, or set server.args.kv-cache-memory-bytes",
        )
    return gpus.memory


def _observed_text(observed: Observed) -> str:
    parts = []
    if observed.kv_tokens is not None:
        parts.append(f"{observed.kv_tokens:,} tokens")
    if observed.kv_memory is not None:
        parts.append(f"KV {_gib(observed.kv_memory)}")
    if observed.weights is not None:
        parts.append(f"weights {_gib(observed.weights)}")
    return ", ".join(parts)


def _band(pair: tuple[Any, Any], show: Any) -> str:
    low, high = pair
    return show(low) if low == high else f"{show(low)} - {show(high)}"


def _gib(value: float) -> str:
    if abs(value) >= GIB / 10:
        return f"{value / GIB:.2f} GiB"
    return f"{value / 2**20:.2f} MiB"


def _count(value: int) -> str:
    return f"{value:,}"


def _true(value: Any) -> bool:
    return flag_text(value) in ("true", "1", "yes")


def _yaml(value: Any) -> str:
    return flag_text(value) if isinstance(value, bool) else str(value)


def _slug(text: str) -> str:
    return re.sub(r"[^\w.@-]+", "_", text).strip("_") or "host"
