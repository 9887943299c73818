"""06_qualify's soak (profiles ``standard`` and ``full``): the configured ``max-num-seqs``
requests at once, at the longest prompt that fits, round after round for the profile's minutes.

It passes when every request completes (no engine death or restart: vllm issues 42363, 32090,
40420), the server keeps making tokens while requests run (no hang with ``/health`` still 200:
vllm issue 51663; the probe watches ``/metrics`` during each round and ends it within
:data:`~opsbook.steps.metrics.STALL_SECONDS` of the counters stopping), preemptions stay under
one per request, and the GPUs' memory high-water (``nvidia-smi``, sampled each round) stays
under their capacity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from opsbook.core.deployment import Deployment
from opsbook.core.results import Finding
from opsbook.remote.protocol import RemoteHost
from opsbook.steps import metrics, qualify_gate
from opsbook.steps.qualify_matrix import Profile, Target, call_client, cell_seed, prompt_of

# vLLM's default max_num_seqs when the deployment sets none (vllm 0.32.0 vllm/engine/
# arg_utils.py, EngineArgs.get_batch_defaults: 256 on GPUs for the OpenAI server).
DEFAULT_MAX_NUM_SEQS = 256
# The share of a GPU's memory whose use is a memory high-water at capacity.
MEMORY_FULL = 0.99
CODE_SOAK_FAILED = "qualify-soak-failed"
CODE_SOAK_MEMORY = "qualify-soak-memory"


@dataclass
class Soak:
    """What the soak saw."""

    concurrency: int
    prompt_tokens: int
    rounds: int = 0
    requests: int = 0
    failed: int = 0
    preemptions: float = 0.0
    memory_high_mib: int = 0
    memory_total_mib: int = 0
    findings: list[Finding] = field(default_factory=list)


def soak_shape(profile: Profile, target: Target, deployment: Deployment) -> tuple[int, int]:
    """The soak's concurrency (``max-num-seqs``, at most what the KV cache holds) and prompt
    length (the profile's longest that fits the model)."""
    asked = int(deployment.serve_args.get("max-num-seqs") or DEFAULT_MAX_NUM_SEQS)
    lengths = [
        n
        for n in profile.prompt_lengths
        if not target.max_model_len or n + profile.output_tokens <= target.max_model_len
    ]
    length = max(lengths, default=min(profile.prompt_lengths))
    per_request = length + profile.output_tokens
    if target.kv_cache_tokens:
        asked = min(asked, max(1, target.kv_cache_tokens // per_request))
    return max(1, asked), length


def soak(host: RemoteHost, target: Target, profile: Profile, deployment: Deployment) -> Soak:
    """Rounds of ``max-num-seqs`` requests for ``profile.soak_minutes``; stops at the first
    round that finds a problem."""
    concurrency, length = soak_shape(profile, target, deployment)
    seen = Soak(concurrency, length)
    seed = cell_seed(target, "soak")  # not the prompts a matrix cell of the same length sent
    deadline = time.monotonic() + profile.soak_minutes * 60
    while time.monotonic() < deadline and not seen.findings:
        before = metrics.read_metrics(host, target.port, api_key=target.api_key)
        requests = [
            {
                "prompt": prompt_of(length, seed * 100_000 + seen.requests + n),
                "max_tokens": profile.output_tokens,
            }
            for n in range(concurrency)
        ]
        answer = call_client(host, target, requests, concurrency)
        answers = answer["answers"]
        seen.rounds += 1
        seen.requests += len(answers)
        # Requests a hang ended are said by its own finding, not counted as failed.
        if not answer.get("hung"):
            seen.failed += sum(1 for a in answers if not a.get("ok"))
        _sample_memory(host, seen)
        try:
            after = metrics.read_metrics(host, target.port, api_key=target.api_key)
        except Exception:
            seen.findings += qualify_gate.engine_findings(False, before, None)
            break
        seen.preemptions += max(0.0, (after.preemptions or 0) - (before.preemptions or 0))
        if answer.get("hung"):
            subject = f"soak {seen.concurrency} x {seen.prompt_tokens}"
            hung = [qualify_gate.hung_during(subject, answer["hung"])]
        else:
            hung = qualify_gate.hang_findings(before, after)
        seen.findings += judge_round(seen, hung)
    return seen


def judge_round(seen: Soak, hung: list[Finding]) -> list[Finding]:
    """The soak's problems so far."""
    found = list(hung)
    subject = f"soak {seen.concurrency} x {seen.prompt_tokens}"
    if seen.failed:
        found.append(
            Finding("error", subject, f"{seen.failed} of {seen.requests} request(s) failed in "
                    f"{seen.rounds} round(s)", "read the server's log (05_diagnose)",
                    code=CODE_SOAK_FAILED)
        )  # fmt: skip
    if seen.preemptions > seen.requests:
        found.append(
            Finding("error", subject, f"{seen.preemptions:.0f} preemptions for {seen.requests} "
                    "requests", "lower max-num-seqs", code=CODE_SOAK_FAILED)
        )  # fmt: skip
    if seen.memory_total_mib and seen.memory_high_mib >= MEMORY_FULL * seen.memory_total_mib:
        found.append(
            Finding("error", subject, f"GPU memory high-water {seen.memory_high_mib} MiB of "
                    f"{seen.memory_total_mib} MiB", "lower gpu-memory-utilization",
                    code=CODE_SOAK_MEMORY)
        )  # fmt: skip
    return found


def _sample_memory(host: RemoteHost, seen: Soak) -> None:
    done = host.run(
        "nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits",
        label="soak GPU memory",
    )
    for line in done.stdout.splitlines() if done.ok else []:
        try:
            used, total = (int(float(v)) for v in line.split(","))
        except ValueError:
            continue
        if used > seen.memory_high_mib:
            seen.memory_high_mib, seen.memory_total_mib = used, total
