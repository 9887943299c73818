"""The ``launch`` probe's answers (opsbook/remote/probes/launch.py), parsed once where they are
read: the server steps (:mod:`opsbook.steps.server`, :mod:`opsbook.steps.triage`) and the
tests that run the probe read these types, never the probe's JSON by key.

The probe runs on the host's own python (3.8+, stdlib only) and answers JSON; a key it leaves
out (an older probe, a test double's short answer) takes the default here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Answer = Mapping[str, Any]


@dataclass(frozen=True)
class ProcessInfo:
    """A process as the probe described it (``describe``); a port holder of another user has
    only its ``uid``."""

    pid: int | None
    ppid: int | None = None
    pgid: int | None = None
    state: str | None = None
    uid: int | None = None
    cmdline: str | None = None

    @classmethod
    def parse(cls, answer: Answer) -> ProcessInfo:
        return cls(
            pid=answer.get("pid"),
            ppid=answer.get("ppid"),
            pgid=answer.get("pgid"),
            state=answer.get("state"),
            uid=answer.get("uid"),
            cmdline=answer.get("cmdline"),
        )


def processes(answers: Any) -> list[ProcessInfo]:
    return [ProcessInfo.parse(p) for p in answers or []]


@dataclass(frozen=True)
class StopMark:
    """When opsbook signalled a launch, and how long its log was then."""

    at: float
    log_size: int | None

    @classmethod
    def parse(cls, answer: Answer | None) -> StopMark | None:
        if not answer:
            return None
        return cls(at=float(answer.get("at") or 0.0), log_size=answer.get("log_size"))


@dataclass(frozen=True)
class LaunchRecord:
    """The launch record opsbook keeps on the host (``<state dir>/launch.json``)."""

    pid: int
    pgid: int
    start: int | None = None  # the process's start time in clock ticks: a reused PID differs
    uid: int | None = None
    script: str | None = None
    log: str | None = None
    log_offset: int = 0
    port: int | None = None
    started_at: float | None = None
    cmdline: str | None = None
    stop: StopMark | None = None

    @classmethod
    def parse(cls, answer: Answer | None) -> LaunchRecord | None:
        if answer is None:
            return None
        return cls(
            pid=int(answer["pid"]),
            pgid=int(answer.get("pgid", answer["pid"])),
            start=answer.get("start"),
            uid=answer.get("uid"),
            script=answer.get("script"),
            log=answer.get("log"),
            log_offset=int(answer.get("log_offset") or 0),
            port=answer.get("port"),
            started_at=answer.get("started_at"),
            cmdline=answer.get("cmdline"),
            stop=StopMark.parse(answer.get("stop")),
        )


@dataclass(frozen=True)
class ShmFile:
    """A stale shared-memory file removed (or, in a dry run, to be removed)."""

    file: str
    bytes: int


@dataclass(frozen=True)
class KeptShm:
    """A shared-memory file left in place, and why."""

    file: str
    why: str
    mine: bool


@dataclass(frozen=True)
class ShmAnswer:
    """The answer of ``clean_shm``."""

    removed: list[ShmFile] = field(default_factory=list)
    kept: list[KeptShm] = field(default_factory=list)
    error: str | None = None

    @classmethod
    def parse(cls, answer: Answer) -> ShmAnswer:
        return cls(
            removed=[ShmFile(str(r["file"]), int(r["bytes"])) for r in answer.get("removed", [])],
            kept=[
                KeptShm(str(k["file"]), str(k["why"]), bool(k.get("mine")))
                for k in answer.get("kept", [])
            ],
            error=answer.get("error"),
        )


@dataclass(frozen=True)
class StopAnswer:
    """The answer of ``stop``: why it did (or did not) signal, and whom."""

    reason: str
    uid: int | None = None
    record: LaunchRecord | None = None
    stopped: list[ProcessInfo] = field(default_factory=list)
    refused: list[ProcessInfo] = field(default_factory=list)
    remaining: list[ProcessInfo] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)
    shm: ShmAnswer | None = None

    @classmethod
    def parse(cls, answer: Answer) -> StopAnswer:
        shm = answer.get("shm")
        return cls(
            reason=str(answer.get("reason")),
            uid=answer.get("uid"),
            record=LaunchRecord.parse(answer.get("record")),
            stopped=processes(answer.get("stopped")),
            refused=processes(answer.get("refused")),
            remaining=processes(answer.get("remaining")),
            signals=list(answer.get("signals") or []),
            shm=ShmAnswer.parse(shm) if shm is not None else None,
        )


@dataclass(frozen=True)
class StartProof:
    """What the first seconds of a start showed: alive and logging, or its exit and last words."""

    alive: bool
    exit_code: int | None
    log_bytes: int
    tail: str
    log_exists: bool = True
    cmdline: str | None = None

    @classmethod
    def parse(cls, answer: Answer) -> StartProof:
        return cls(
            alive=bool(answer["alive"]),
            exit_code=answer.get("exit_code"),
            log_bytes=int(answer.get("log_bytes") or 0),
            tail=str(answer.get("tail") or ""),
            log_exists=bool(answer.get("log_exists", True)),
            cmdline=answer.get("cmdline"),
        )


@dataclass(frozen=True)
class StartAnswer:
    """The answer of ``start``: started with its record and proof, or the reason it did not."""

    started: bool
    reason: str | None = None
    record: LaunchRecord | None = None
    proof: StartProof | None = None
    script: str | None = None
    holders: list[ProcessInfo] = field(default_factory=list)

    @classmethod
    def parse(cls, answer: Answer) -> StartAnswer:
        proof = answer.get("proof")
        return cls(
            started=bool(answer.get("started")),
            reason=answer.get("reason"),
            record=LaunchRecord.parse(answer.get("record")),
            proof=StartProof.parse(proof) if proof is not None else None,
            script=answer.get("script"),
            holders=processes(answer.get("holders")),
        )


@dataclass(frozen=True)
class HttpAnswer:
    """An HTTP request made from the host: its status (None when nothing answered)."""

    status: int | None
    body: str = ""
    seconds: float = 0.0
    error: str | None = None

    @classmethod
    def parse(cls, answer: Answer) -> HttpAnswer:
        return cls(
            status=answer.get("status"),
            body=str(answer.get("body") or ""),
            seconds=float(answer.get("seconds") or 0.0),
            error=answer.get("error"),
        )


@dataclass(frozen=True)
class LogState:
    """The log as a status saw it: its size and age, and the text read from ``offset``."""

    exists: bool
    size: int | None = None
    age: float | None = None
    text: str = ""
    offset: int = 0
    end: int | None = None

    @classmethod
    def parse(cls, answer: Answer) -> LogState:
        if not answer.get("exists"):
            return cls(exists=False)
        return cls(
            exists=True,
            size=answer.get("size"),
            age=answer.get("age"),
            text=str(answer.get("text") or ""),
            offset=int(answer.get("offset") or 0),
            end=answer.get("end"),
        )


@dataclass(frozen=True)
class StatusAnswer:
    """The answer of ``status`` (and of ``watch``, a status after waiting for the log)."""

    record: LaunchRecord | None
    running: bool
    port_open: bool | None
    log: LogState
    group: list[ProcessInfo] = field(default_factory=list)
    others: list[ProcessInfo] = field(default_factory=list)
    log_before_stop: str | None = None
    uid: int | None = None
    record_error: str | None = None
    health: HttpAnswer | None = None
    notes: dict[str, str | None] = field(default_factory=dict)
    watched_steps: int | None = None
    # For each input asked about (what the server runs): "same", "changed" or "unrecorded"
    # since the running launch started; empty when none was asked or nothing runs.
    inputs: dict[str, str] = field(default_factory=dict)
    # The exit code and output of the command asked for beside a ready server's status
    # (``when_healthy``); None when none was asked or the server was not ready.
    side: tuple[int | None, str] | None = None
    # Whether the last complete deploy's note holds (``settled``); None when none was asked
    # or the server was not ready.
    settled: SettledAnswer | None = None

    @classmethod
    def parse(cls, answer: Answer) -> StatusAnswer:
        health = answer.get("health")
        return cls(
            record=LaunchRecord.parse(answer.get("record")),
            running=bool(answer.get("running")),
            port_open=answer.get("port_open"),
            log=LogState.parse(answer.get("log") or {}),
            group=processes(answer.get("group")),
            others=processes(answer.get("others")),
            log_before_stop=answer.get("log_before_stop"),
            uid=answer.get("uid"),
            record_error=answer.get("record_error"),
            health=HttpAnswer.parse(health) if health else None,
            notes=dict(answer.get("notes") or {}),
            watched_steps=answer.get("watched_steps"),
            inputs={str(k): str(v) for k, v in (answer.get("inputs") or {}).items()},
            side=_side(answer.get("side")),
            settled=SettledAnswer.parse(answer["settled"]) if answer.get("settled") else None,
        )


@dataclass(frozen=True)
class SettledAnswer:
    """The status's word on the last complete deploy's note: its run and time (None without a
    readable note), and what differs since ("note", "launch", "deployment", "model")."""

    run: str | None
    at: float | None
    differs: tuple[str, ...]

    @classmethod
    def parse(cls, answer: Answer) -> SettledAnswer:
        since = answer.get("since") or {}
        return cls(
            run=since.get("run"),
            at=since.get("at"),
            differs=tuple(str(name) for name in answer.get("differs") or ()),
        )


@dataclass(frozen=True)
class SettleAnswer:
    """The answer of ``settle``: whether the note was written, and why not."""

    noted: bool
    why: str

    @classmethod
    def parse(cls, answer: Answer) -> SettleAnswer:
        return cls(noted=bool(answer.get("noted")), why=str(answer.get("why") or ""))


def _side(side: Any) -> tuple[int | None, str] | None:
    if not isinstance(side, dict):
        return None
    code = side.get("exit_code")
    return (code if isinstance(code, int) else None), str(side.get("output") or "")


@dataclass(frozen=True)
class SmokeAnswer:
    """The answer of ``smoke``: ``/health``, ``/v1/models`` and one completion."""

    health: HttpAnswer
    models: HttpAnswer
    model: str | None
    completion: HttpAnswer | None

    @classmethod
    def parse(cls, answer: Answer) -> SmokeAnswer:
        completion = answer.get("completion")
        return cls(
            health=HttpAnswer.parse(answer["health"]),
            models=HttpAnswer.parse(answer["models"]),
            model=answer.get("model"),
            completion=HttpAnswer.parse(completion) if completion else None,
        )
