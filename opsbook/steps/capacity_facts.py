"""The capacity plan in the run's record (``facts.json``'s capacity section): 02 notes what it
predicted for the start, 04 notes beside it what vLLM logged once it sized its KV cache, with
the prediction's error in %, and the overhead that start measured; the next plan on the host
learns from those records (:func:`run_history`) as from ``opsbook plan``'s own.

Nothing here reads the host: 04's figures come from the log lines its record already reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opsbook.core import facts_schema
from opsbook.core.channel import OUTCOME_ENV
from opsbook.knowledge import capacity as cap
from opsbook.knowledge.capacity import Observed
from opsbook.steps import last_good

if TYPE_CHECKING:
    from opsbook.steps.plan import CapacityPlan

SECTION = "capacity"


def prediction_facts(made: CapacityPlan) -> dict[str, Any]:
    """The plan as the record keeps it: the band of tokens and KV memory per GPU, the verdict,
    and what the overhead it will measure depends on (release, flags, GPU memory,
    utilization)."""
    return {
        "vllm": made.vllm_version,
        "flags": dict(made.flags),
        "gpu_memory": made.gpu_memory,
        "utilization": made.utilization,
        "fixed_kv": made.utilization is None,
        "max_model_len": made.max_model_len,
        "verdict": made.verdict,
        "predicted_tokens": list(made.tokens),
        "predicted_kv_memory": list(made.kv_memory),
        "overhead_source": made.overhead_source or None,
    }


def observation_facts(observed: Observed, predicted: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's figures beside ``predicted`` (02's note, empty when this run made none): the
    error of the band's middle in %, and the overhead the start measured (budget less weights
    and KV memory, from vLLM's own lines; None when a figure is missing or the KV memory was
    fixed)."""
    overhead = None
    gpu_memory, utilization = predicted.get("gpu_memory"), predicted.get("utilization")
    if gpu_memory and utilization and observed.weights is not None and observed.kv_memory:
        overhead = cap.measured_overhead(
            int(gpu_memory), float(utilization), observed.weights, observed.kv_memory
        )
    return {
        "observed_tokens": observed.kv_tokens,
        "observed_concurrency": observed.concurrency,
        "observed_kv_memory": observed.kv_memory,
        "observed_weights": observed.weights,
        "tokens_error_pct": error_pct(predicted.get("predicted_tokens"), observed.kv_tokens),
        "kv_memory_error_pct": error_pct(predicted.get("predicted_kv_memory"), observed.kv_memory),
        "overhead": overhead,
    }


def error_pct(band: Sequence[int] | None, observed: int | None) -> float | None:
    """How far the band's middle is from what vLLM said, in % of vLLM's figure (+: the plan
    said more)."""
    if not band or not observed:
        return None
    middle = (band[0] + band[-1]) / 2
    return round((middle - observed) / observed * 100, 2)


def note_prediction(host: str, made: CapacityPlan) -> None:
    """Note the plan in the run's record (02; nothing outside a run)."""
    facts_schema.note(host, SECTION, prediction_facts(made))


def note_start_figures(host: str, observed: Observed | None) -> None:
    """Note what the start's log said of its memory (:func:`observed_in_log` of the lines 04's
    record reads) beside this run's prediction; nothing outside a run or when the log sized no
    KV cache."""
    outcome = os.environ.get(OUTCOME_ENV)
    if not outcome or observed is None or not observed.sized:
        return
    predicted = noted_in_run(Path(outcome).parent, host)
    facts_schema.note(host, SECTION, observation_facts(observed, predicted))


def noted_in_run(folder: Path, host: str) -> dict[str, Any]:
    """The capacity section noted so far for ``host`` by the stages of the run whose outcome
    files are in ``folder`` (a local read: the notes are the run's own files)."""
    paths = sorted(folder.glob(f"*{facts_schema.NOTES_SUFFIX}"))
    return facts_schema.read_notes(paths).get(host, {}).get(SECTION, {})


def run_history(runs_dir: Path, deployment: str | Path, host: str) -> list[dict[str, Any]]:
    """The capacity sections of the deployment's earlier runs on ``host`` that saw the start
    size its cache, newest first, as capacity-record entries (``plan.record_entry``'s
    shape)."""
    key = last_good.deployment_key(deployment)
    entries = []
    for facts in last_good.run_facts(runs_dir):
        found = facts.hosts.get(host) if facts.deployment == key else None
        if found is None or found.capacity.observed_tokens is None:
            continue
        entries.append(_entry_of(found.capacity, host, facts.run))
    return entries


def _entry_of(section: facts_schema.CapacityFacts, host: str, run: str) -> dict[str, Any]:
    return {
        "host": host,
        "run": run,
        "vllm_version": section.vllm,
        "flags": dict(section.flags),
        "gpu_memory": section.gpu_memory,
        "utilization": section.utilization,
        "predicted": {
            "tokens": list(section.predicted_tokens),
            "kv_memory": list(section.predicted_kv_memory),
            "verdict": section.verdict,
        },  # fmt: skip
        "observed": {
            "tokens": section.observed_tokens,
            "concurrency": section.observed_concurrency,
            "kv_memory": section.observed_kv_memory,
            "weights": section.observed_weights,
        },  # fmt: skip
        "overhead": section.overhead,
    }
