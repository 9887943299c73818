"""Ask the installed vLLM on a host which attention backend it chooses, and its answer typed.

The ``backends`` probe (``opsbook/remote/probes/backends.py``) calls the release's own
``_get_backend_priorities`` and each backend's ``validate_configuration``; its answer outranks
every table, since it is what that vLLM will do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opsbook.knowledge.compat.backend_answers import BackendsAnswer
from opsbook.knowledge.compat.model_config import ModelFacts
from opsbook.remote.protocol import RemoteHost


@dataclass(frozen=True)
class ProbedSelection:
    """What the installed vLLM chose for one compute capability, model kind and KV dtype."""

    compute_capability: str
    use_mla: bool
    kv_cache_dtype: str
    chosen: str | None
    order: tuple[str, ...]
    reasons: Mapping[str, list[str]]


@dataclass(frozen=True)
class InstalledVllm(Mapping[str, Sequence[str]]):
    """The answer of the ``backends`` probe: the installed vLLM's own backend selection.

    As a mapping it gives backend name -> ``supported_kv_cache_dtypes`` of the backends it
    imported (what ``probed_backends`` has always been), so it can be passed wherever that is.

    Attributes:
        version: the installed vLLM version (from its distribution metadata).
        kv_dtypes: backend -> its ``supported_kv_cache_dtypes``.
        selections: the selections asked for.
        import_errors: backend -> why it did not import on this host (kept, not dropped).
        priorities_from: where the priority function came from (imported, or compiled from
            the installed ``vllm/platforms/cuda.py`` when that module does not import).
        note: why only KV dtypes were read (an older vLLM, the simulator), or None.
        cached: the answer came from the host's cache.
        seconds: how long the probe took.
    """

    version: str | None
    kv_dtypes: Mapping[str, tuple[str, ...]]
    selections: tuple[ProbedSelection, ...] = ()
    import_errors: Mapping[str, str] = field(default_factory=dict)
    priorities_from: str | None = None
    note: str | None = None
    cached: bool = False
    seconds: float | None = None

    def __getitem__(self, name: str) -> Sequence[str]:
        return self.kv_dtypes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.kv_dtypes)

    def __len__(self) -> int:
        return len(self.kv_dtypes)

    @property
    def source(self) -> str:
        return f"asked the installed vLLM {self.version or '(version unknown)'}"

    def __str__(self) -> str:
        parts = [f"{n} [{', '.join(d)}]" for n, d in self.kv_dtypes.items()]
        for s in self.selections:
            parts.append(f"on {s.compute_capability} with {s.kv_cache_dtype}: {s.chosen or 'none'}")
        if self.import_errors:
            parts.append("not importable: " + ", ".join(self.import_errors))
        return f"{self.source}: " + "; ".join(parts)

    def selection(self, cc: str, mla: bool, kv_cache_dtype: str) -> ProbedSelection | None:
        """The installed vLLM's answer for this case, if it was asked."""
        for s in self.selections:
            if (s.compute_capability, s.use_mla, s.kv_cache_dtype) == (cc, mla, kv_cache_dtype):
                return s
        return None


def probe_backends(
    host: RemoteHost,
    python: str,
    facts: ModelFacts | None = None,
    capabilities: Sequence[str] = (),
    kv_cache_dtypes: Sequence[str] = (),
) -> InstalledVllm | None:
    """Ask the installed vLLM on the host which attention backend it chooses.

    The probe calls the release's own ``_get_backend_priorities`` and each backend's
    ``validate_configuration`` (see ``opsbook/remote/probes/backends.py``) and caches the answer on
    the host. Pass the result to :func:`check_compat` as ``probed_backends``.

    Args:
        host: where vLLM is installed.
        python: the deployment's interpreter.
        facts: the model (MLA or not, head size); without it an MLA model of head size 576.
        capabilities: the GPUs' compute capabilities; without them the host's own GPUs.
        kv_cache_dtypes: the KV dtypes to ask about; without them ``auto`` and ``fp8_e4m3``.

    Returns:
        The :class:`InstalledVllm`, or None when vLLM is not importable there.
    """
    args: dict[str, Any] = {"python": python}
    if facts is not None:
        args["model"] = {
            "use_mla": facts.mla,
            "use_sparse": facts.sparse_mla,
            "head_size": facts.head_size,
        }
    if capabilities:
        args["capabilities"] = list(dict.fromkeys(capabilities))
    if kv_cache_dtypes:
        args["kv_cache_dtypes"] = list(dict.fromkeys(kv_cache_dtypes))
    return installed_vllm(BackendsAnswer.parse(host.probe("backends", args, timeout=240)))


def installed_vllm(answer: BackendsAnswer) -> InstalledVllm | None:
    """The probe's answer as the installed vLLM's own selection (None: vLLM not there)."""
    if not answer.backends and not answer.selections:
        return None
    cases = {case.key: case for case in answer.cases}
    selections = [
        ProbedSelection(
            compute_capability=case.compute_capability,
            use_mla=case.use_mla,
            kv_cache_dtype=case.kv_cache_dtype,
            chosen=raw.chosen,
            order=tuple(raw.order),
            reasons={k: list(v) for k, v in raw.reasons.items()},
        )
        for key, raw in answer.selections.items()
        if (case := cases.get(key)) is not None
    ]
    return InstalledVllm(
        version=answer.vllm_version,
        kv_dtypes={k: tuple(v) for k, v in (answer.backends or {}).items()},
        selections=tuple(selections),
        import_errors=dict(answer.import_errors),
        priorities_from=answer.priorities_from,
        note=answer.note,
        cached=answer.cached,
        seconds=answer.seconds,
    )
