"""The ``backends`` probe's answer (opsbook/remote/probes/backends.py) and the source reader's
(``select`` of opsbook/remote/probes/vllm_source.py, which the backends probe carries to the
host and whose answer it passes on), parsed once where they are read:
:mod:`opsbook.knowledge.compat.backend_probe` and the tests that run either read these types,
never the JSON by key.

Both run on the host's own python (3.8+, stdlib only) and answer JSON; a key left out (an
older cached answer, an error answer) takes the default here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Answer = Mapping[str, Any]


def selection_key(compute_capability: str, use_mla: bool, kv_cache_dtype: str) -> str:
    """How both readers key a case's selection: ``"12.0|True|fp8_e4m3"``."""
    return "|".join([str(compute_capability), str(use_mla), kv_cache_dtype])


@dataclass(frozen=True)
class SelectionAnswer:
    """One case's selection: vLLM's priority order, why each backend before the chosen one was
    rejected, and the chosen one (None: every backend was rejected)."""

    chosen: str | None
    order: list[str] = field(default_factory=list)
    reasons: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def parse(cls, answer: Answer) -> SelectionAnswer:
        return cls(
            chosen=answer.get("chosen"),
            order=[str(b) for b in answer.get("order") or []],
            reasons={str(k): [str(r) for r in v] for k, v in (answer.get("reasons") or {}).items()},
        )


@dataclass(frozen=True)
class CaseAsked:
    """A case the probe asked about: a compute capability, MLA or not, a KV cache dtype."""

    compute_capability: str
    use_mla: bool
    kv_cache_dtype: str

    @classmethod
    def parse(cls, answer: Answer) -> CaseAsked:
        return cls(
            str(answer["compute_capability"]),
            bool(answer["use_mla"]),
            str(answer["kv_cache_dtype"]),
        )

    @property
    def key(self) -> str:
        return selection_key(self.compute_capability, self.use_mla, self.kv_cache_dtype)


def _selections(answer: Any) -> dict[str, SelectionAnswer]:
    return {str(key): SelectionAnswer.parse(s) for key, s in (answer or {}).items()}


def _dtypes(answer: Any) -> dict[str, list[str]]:
    return {str(name): [str(d) for d in dtypes] for name, dtypes in (answer or {}).items()}


def _texts(answer: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (answer or {}).items()}


@dataclass(frozen=True)
class BackendsAnswer:
    """The answer of the ``backends`` probe.

    Attributes:
        backends: backend -> its ``supported_kv_cache_dtypes``; None when the probe could not
            ask (``error`` says why: no such interpreter, the reader failed).
        selections: per case key (:func:`selection_key`), the installed vLLM's selection.
        cases: the cases asked about.
        read_from: ``source`` (vLLM's files read) or ``import`` (vLLM imported);
            ``why_not_source`` says why the source did not settle it.
        cached: the answer came from the host's cache; ``seconds``: how long the probe took.
    """

    backends: dict[str, list[str]] | None
    error: str | None = None
    vllm_version: str | None = None
    selections: dict[str, SelectionAnswer] = field(default_factory=dict)
    import_errors: dict[str, str] = field(default_factory=dict)
    cases: list[CaseAsked] = field(default_factory=list)
    priorities_from: str | None = None
    note: str | None = None
    read_from: str | None = None
    why_not_source: str | None = None
    cached: bool = False
    seconds: float | None = None

    @classmethod
    def parse(cls, answer: Answer) -> BackendsAnswer:
        backends = answer.get("backends")
        return cls(
            backends=None if backends is None else _dtypes(backends),
            error=answer.get("error"),
            vllm_version=answer.get("vllm_version"),
            selections=_selections(answer.get("selections")),
            import_errors=_texts(answer.get("import_errors")),
            cases=[CaseAsked.parse(c) for c in answer.get("cases") or []],
            priorities_from=answer.get("priorities_from"),
            note=answer.get("note"),
            read_from=answer.get("read_from"),
            why_not_source=answer.get("why_not_source"),
            cached=bool(answer.get("cached")),
            seconds=answer.get("seconds"),
        )

    def selection(
        self, compute_capability: str, use_mla: bool, kv_cache_dtype: str
    ) -> SelectionAnswer | None:
        """The selection for this case, if it was asked."""
        return self.selections.get(selection_key(compute_capability, use_mla, kv_cache_dtype))


@dataclass(frozen=True)
class SourceReading:
    """The answer of ``vllm_source.select``: the selection read from vLLM's files.

    Attributes:
        kv_dtypes: backend -> its ``supported_kv_cache_dtypes``, as declared in its source.
        unresolved: backend -> the checks its source does not settle (vLLM is then asked).
        note: why no selection was read (no registry or priority function), or None.
    """

    selections: dict[str, SelectionAnswer] = field(default_factory=dict)
    kv_dtypes: dict[str, list[str]] = field(default_factory=dict)
    import_errors: dict[str, str] = field(default_factory=dict)
    unresolved: dict[str, list[str]] = field(default_factory=dict)
    priorities_from: str | None = None
    note: str | None = None
    read_from: str | None = None
    registry_file: str | None = None

    @classmethod
    def parse(cls, answer: Answer) -> SourceReading:
        return cls(
            selections=_selections(answer.get("selections")),
            kv_dtypes=_dtypes(answer.get("kv_dtypes")),
            import_errors=_texts(answer.get("import_errors")),
            unresolved=_dtypes(answer.get("unresolved")),
            priorities_from=answer.get("priorities_from"),
            note=answer.get("note"),
            read_from=answer.get("read_from"),
            registry_file=answer.get("registry_file"),
        )


__all__ = ["BackendsAnswer", "CaseAsked", "SelectionAnswer", "SourceReading", "selection_key"]
