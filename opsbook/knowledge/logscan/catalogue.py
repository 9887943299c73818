"""The failure catalogue (``opsbook/knowledge/data/failures.yaml``) loaded into typed entries.

The file holds two things: ``failures``, the failure classes, each with what the decision needs
to know about it as fields (validated here: a bad entry is an error naming the entry and the
field); and ``signals``, the named patterns the generic mechanisms read (startup phases, the
lines that prove a server ready, the records of a dying engine...). No failure id is spelled in
Python: code asks for the entry that plays a role (:func:`entry_with`) or raises a finding
(:func:`failure_for`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from opsbook.core.exceptions import OpsbookError
from opsbook.core.results import SEVERITIES
from opsbook.knowledge.logscan.line_grammar import EXCEPTION_NAME
from opsbook.knowledge.logscan.log_lines import LogLine

KINDS = ("cause", "wrapper", "stall", "generic", "note")

# How far back a pattern's ``after`` context is looked for: a traceback's last frames.
CONTEXT_WINDOW = 12

_REMEDY = "fix opsbook/knowledge/data/failures.yaml (fields are described at its top)"
# The roles an entry plays in the decision: exactly one entry has each.
ROLES = ("fallback", "killed_from_outside", "stop_request", "silent_hang_after")


@dataclass(frozen=True)
class DetailUnder:
    """A marker line under the error, and the line after it that states the detail."""

    marker: re.Pattern[str]
    within: int


@dataclass(frozen=True)
class StageNumbers:
    """The startup stage an error struck in, reported as ``numbers[field]``."""

    field: str
    by_phase: tuple[tuple[str, str], ...]
    # In phase ``after_phase``, once a line holds ``after_pattern``: stage ``after_stage``.
    after_phase: str
    after_pattern: re.Pattern[str]
    after_stage: str

    def stage_of(self, phase: str) -> str:
        """The stage a phase belongs to."""
        return dict(self.by_phase)[phase]


@dataclass(frozen=True)
class RemedyEdit:
    """One remedy of an entry as a tested edit of the deployment (failures.yaml's ``edits``).

    ``args``/``env`` set ``server.args``/``server.env`` keys (None: remove the flag or
    variable); ``config_remove`` names the config.json keys 02_config_patch removes. Values
    and keys may hold ``{group}`` placeholders filled from the diagnosis's numbers. The
    variant holds when every condition it has holds: the release in ``versions``, the platform
    in ``platforms``, ``line`` on the identifying line, ``numbers`` each among its values.
    """

    remedy: str
    source: str
    tested_on: str
    args: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, Any], ...] = ()
    config_remove: tuple[str, ...] = ()
    versions: str | None = None
    platforms: tuple[str, ...] = ()
    line: re.Pattern[str] | None = None
    numbers: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def edit(self) -> dict[str, Any]:
        """The edit as the deployment names it (placeholders not filled)."""
        return edit_as_named(dict(self.args), dict(self.env), self.config_remove)


def edit_as_named(
    args: dict[str, Any], env: dict[str, Any], config_remove: tuple[str, ...]
) -> dict[str, Any]:
    """An edit as the deployment names it: ``server.args``, ``server.env``, ``config``."""
    edit: dict[str, Any] = {}
    if args:
        edit["server.args"] = dict(args)
    if env:
        edit["server.env"] = dict(env)
    if config_remove:
        edit["config"] = {"remove": list(config_remove)}
    return edit


@dataclass(frozen=True)
class CatalogueEntry:
    """One failure class of ``opsbook/knowledge/data/failures.yaml``."""

    id: str
    title: str
    kind: str
    severity: str
    priority: int
    patterns: tuple[re.Pattern[str], ...]
    remedy: str
    source: str
    parse: tuple[re.Pattern[str], ...] = ()
    remedy_parsed: str = ""
    stems: tuple[str, ...] = ()
    # Per pattern: a text that must be on one of the CONTEXT_WINDOW lines before (None: any).
    after: tuple[re.Pattern[str] | None, ...] = ()
    # The shared failure id this class is reported under, when its own id is not one of them.
    family: str | None = None
    # A stall logged on a timer while a normal startup waits too: a hang only when this many
    # end the log in a row, with no other line between them.
    hang_after: int | None = None
    # Roles (see failures.yaml's header): what an unknown error, a kill from outside, a stop
    # asked for, a silent hang in a collective's set-up is reported as.
    fallback: bool = False
    killed_from_outside: bool = False
    signal_lines: tuple[re.Pattern[str], ...] = ()
    stop_request: bool = False
    served_patterns: tuple[int, ...] = ()
    served_record: re.Pattern[str] | None = None
    silent_hang_after: re.Pattern[str] | None = None
    detail_under: DetailUnder | None = None
    stage_numbers: StageNumbers | None = None
    parse_reasons: bool = False
    process_numbers: tuple[re.Pattern[str], ...] = ()
    walks_back: bool = False
    # Seen while the server still runs, the startup cannot go on (vLLM waits on what will not
    # come): a launch fails at once rather than at its timeout.
    stalls: bool = False
    raised_by: tuple[str, ...] = ()
    # The remedy as edits of the deployment, by release and platform (first that holds wins).
    edits: tuple[RemedyEdit, ...] = ()

    @property
    def failure(self) -> str:
        """The failure id a diagnosis of this class reports."""
        return self.family or self.id

    @property
    def error_class(self) -> str | None:
        """The class's own id when it is reported under a family's failure id."""
        return self.id if self.family else None


@dataclass(frozen=True)
class Hit:
    """A catalogue entry found on a log line; ``pattern_index`` says which pattern matched."""

    entry: CatalogueEntry
    line: LogLine
    pattern_index: int


@dataclass(frozen=True)
class Signals:
    """The named patterns of failures.yaml's ``signals``, read by the generic mechanisms (each
    is described where it is defined, in the YAML)."""

    phases: tuple[tuple[str, re.Pattern[str]], ...]
    versions: tuple[re.Pattern[str], ...]
    platform: re.Pattern[str]
    startup_markers: tuple[re.Pattern[str], ...]
    api_server_pid: re.Pattern[str]
    run_error: re.Pattern[str]
    server_start: re.Pattern[str]
    startup_complete: re.Pattern[str]
    routes: re.Pattern[str]
    whole_route: re.Pattern[str]
    server_address: re.Pattern[str]
    stats: re.Pattern[str]
    request_taken: re.Pattern[str]
    access: re.Pattern[str]
    answered: re.Pattern[str]
    generation_finished: re.Pattern[str]
    shutdown: re.Pattern[str]
    exit_warning: re.Pattern[str]
    handled_error_record: re.Pattern[str]
    optional_extension: re.Pattern[str]
    cann_inner_error: re.Pattern[str]
    npu_ops_error: re.Pattern[str]
    cann_coded: re.Pattern[str]
    validation_header: re.Pattern[str]
    validation_detail: re.Pattern[str]
    names_a_value: re.Pattern[str]
    api_server_process: re.Pattern[str]
    state_dump: re.Pattern[str]
    startup_wrapper: re.Pattern[str]
    creation_task: re.Pattern[str]
    ray_task_header: re.Pattern[str]
    engine_loop_death: re.Pattern[str]
    engine_loop_dead: re.Pattern[str]
    death_record: re.Pattern[str]
    status_only: re.Pattern[str]
    quotes_original: re.Pattern[str]
    reasons_opening: re.Pattern[str]
    reasons_item: re.Pattern[str]
    reasons_separator: re.Pattern[str]


def load_catalogue() -> list[CatalogueEntry]:
    """Read the failure catalogue shipped with opsbook.

    Returns:
        The entries in file order.

    Raises:
        OpsbookError: when the catalogue file is malformed.
    """
    return list(_catalogue())


def signals() -> Signals:
    """The catalogue's named signals (phases, readiness, records...).

    Raises:
        OpsbookError: when a signal is missing, unknown or not a valid pattern.
    """
    return _signals()


def entry_with(role: str) -> CatalogueEntry:
    """The entry that plays ``role`` (one of :data:`ROLES`) in the decision."""
    return _roles()[role]


def entry_by_id(entry_id: str) -> CatalogueEntry:
    """The entry whose id is ``entry_id`` (an id read from the catalogue or a diagnosis)."""
    return next(entry for entry in _catalogue() if entry.id == entry_id)


def failure_for(finding: str) -> str:
    """The failure id a stage reports for one of its findings (an entry's ``raised_by``).

    Raises:
        OpsbookError: when no entry names that finding: a stage and the catalogue disagree.
    """
    for entry in _catalogue():
        if finding in entry.raised_by:
            return entry.failure
    raise OpsbookError(
        f"no failure catalogue entry is raised by the finding {finding!r}",
        remedy=f"add {finding!r} to the raised_by of its entry; {_REMEDY}",
    )


@lru_cache(maxsize=1)
def _document() -> dict[str, Any]:
    text = (
        resources.files("opsbook.knowledge")
        .joinpath("data/failures.yaml")
        .read_text(encoding="utf-8")
    )
    # libyaml's parser when PyYAML has it: the pure-Python one takes most of a small log's
    # diagnosis (opsbook diagnose starts in well under half a second).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    document = yaml.load(text, Loader=loader)
    if not isinstance(document, dict) or set(document) != {"signals", "failures"}:
        raise OpsbookError(
            "the failure catalogue holds no 'signals' and 'failures' sections", remedy=_REMEDY
        )
    return document


@lru_cache(maxsize=1)
def _catalogue() -> tuple[CatalogueEntry, ...]:
    entries = tuple(_entry(raw) for raw in _document()["failures"])
    phases = {name for name, _ in _signals().phases}
    for entry in entries:
        named = (
            {phase for phase, _ in entry.stage_numbers.by_phase} if entry.stage_numbers else phases
        )
        if named != phases:
            raise OpsbookError(
                f"failure catalogue entry {entry.id!r}, field 'stage_numbers': by_phase names "
                f"{sorted(named)}, not the phases {sorted(phases)}",
                remedy=_REMEDY,
            )
    return entries


@lru_cache(maxsize=1)
def _roles() -> dict[str, CatalogueEntry]:
    roles = {}
    for role in ROLES:
        playing = [entry for entry in _catalogue() if getattr(entry, role)]
        if len(playing) != 1:
            raise OpsbookError(
                f"failure catalogue: {len(playing)} entries have {role!r} "
                f"({', '.join(entry.id for entry in playing) or 'none'}); exactly one must",
                remedy=_REMEDY,
            )
        roles[role] = playing[0]
    return roles


@lru_cache(maxsize=1)
def _signals() -> Signals:
    raw = _document()["signals"]
    names = {each.name for each in fields(Signals)}
    if not isinstance(raw, dict) or set(raw) != names:
        given = set(raw) if isinstance(raw, dict) else set()
        raise OpsbookError(
            f"failure catalogue signals: missing {sorted(names - given)}, unknown "
            f"{sorted(given - names)}",
            remedy=_REMEDY,
        )
    values: dict[str, Any] = {}
    for name, value in raw.items():
        where = f"failure catalogue signal {name!r}"
        if name == "phases":
            values[name] = tuple(
                (phase, _compiled(pattern, where)) for phase, pattern in value.items()
            )
        elif isinstance(value, list):
            values[name] = tuple(_compiled(pattern, where) for pattern in value)
        else:
            values[name] = _compiled(value, where)
    return Signals(**values)


# Fields an entry may have, each with the function that reads it.
_REQUIRED = ("id", "title", "kind", "severity", "priority", "patterns", "remedy", "source")


def _entry(raw: dict[str, Any]) -> CatalogueEntry:
    name = raw.get("id", repr(raw)[:80]) if isinstance(raw, dict) else repr(raw)[:80]
    if not isinstance(raw, dict):
        raise OpsbookError(f"failure catalogue entry {name} is not a mapping", remedy=_REMEDY)
    known = {each.name for each in fields(CatalogueEntry)} - {"after"}
    for key in raw:
        if key not in known:
            raise OpsbookError(
                f"failure catalogue entry {name!r} has an unknown field {key!r}", remedy=_REMEDY
            )
    for key in _REQUIRED:
        if key not in raw:
            raise OpsbookError(
                f"failure catalogue entry {name!r} lacks the field {key!r}", remedy=_REMEDY
            )
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"failure catalogue entry {name!r}, field {key!r}"
        try:
            values[key] = _READERS.get(key, _plain)(value, where)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise OpsbookError(f"{where} is malformed: {exc}", remedy=_REMEDY) from exc
    values["after"] = tuple(
        _compiled(p["after"], name) if isinstance(p, dict) else None for p in raw["patterns"]
    )
    entry = CatalogueEntry(**values)
    if entry.kind not in KINDS or entry.severity not in SEVERITIES:
        raise OpsbookError(
            f"failure catalogue entry {entry.id!r} has kind {entry.kind!r} / severity "
            f"{entry.severity!r}",
            remedy=f"use a kind of {KINDS} and a severity of {SEVERITIES}",
        )
    return entry


def _compiled(pattern: Any, where: str) -> re.Pattern[str]:
    # "<EXCEPTION>" in a pattern stands for any exception name (EXCEPTION_NAME).
    text = pattern["regex"] if isinstance(pattern, dict) else pattern
    if not isinstance(text, str):
        raise OpsbookError(f"{where}: {text!r} is not a pattern", remedy=_REMEDY)
    try:
        return re.compile(text.replace("<EXCEPTION>", EXCEPTION_NAME))
    except re.error as exc:
        raise OpsbookError(f"{where}: {text!r} is no valid regex: {exc}", remedy=_REMEDY) from exc


def _plain(value: Any, where: str) -> Any:
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{value!r} is not true or false")
    return value


def _patterns(value: Any, where: str) -> tuple[re.Pattern[str], ...]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list of patterns")
    return tuple(_compiled(pattern, where) for pattern in value)


def _texts(value: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list")
    return tuple(value)


def _detail_under(value: Any, where: str) -> DetailUnder:
    return DetailUnder(_compiled(value["marker"], where), int(value["within"]))


def _stage_numbers(value: Any, where: str) -> StageNumbers:
    after = value["after"]
    return StageNumbers(
        field=str(value["field"]),
        by_phase=tuple((str(phase), str(stage)) for phase, stage in value["by_phase"].items()),
        after_phase=str(after["phase"]),
        after_pattern=_compiled(after["pattern"], where),
        after_stage=str(after["stage"]),
    )


_EDIT_FIELDS = {"edit", "remedy", "source", "tested_on", "when"}
_WHEN_FIELDS = {"versions", "platforms", "line", "numbers"}


def _edits(value: Any, where: str) -> tuple[RemedyEdit, ...]:
    if not isinstance(value, list):
        raise TypeError(f"{value!r} is not a list of edits")
    return tuple(_remedy_edit(raw, f"{where}, edit {index + 1}") for index, raw in enumerate(value))


def _remedy_edit(raw: Any, where: str) -> RemedyEdit:
    if not isinstance(raw, dict) or not {"edit", "remedy", "source", "tested_on"} <= set(raw):
        raise TypeError(f"{where}: needs edit, remedy, source and tested_on")
    unknown = set(raw) - _EDIT_FIELDS | set(raw.get("when") or {}) - _WHEN_FIELDS
    edit = raw["edit"]
    unknown |= set(edit) - {"server.args", "server.env", "config"}
    if unknown:
        raise KeyError(f"{where}: unknown fields {sorted(unknown)}")
    when = raw.get("when") or {}
    return RemedyEdit(
        remedy=str(raw["remedy"]),
        source=str(raw["source"]),
        tested_on=str(raw["tested_on"]),
        args=tuple((str(k), v) for k, v in (edit.get("server.args") or {}).items()),
        env=tuple((str(k), v) for k, v in (edit.get("server.env") or {}).items()),
        config_remove=tuple(str(key) for key in (edit.get("config") or {}).get("remove", ())),
        versions=str(when["versions"]) if "versions" in when else None,
        platforms=tuple(str(p) for p in when.get("platforms", ())),
        line=_compiled(when["line"], where) if "line" in when else None,
        numbers=tuple(
            (str(k), tuple(str(v) for v in values)) for k, values in when.get("numbers", {}).items()
        ),
    )


_READERS: dict[str, Any] = {
    "priority": lambda value, where: int(value),
    "patterns": _patterns,
    "parse": _patterns,
    "stems": _texts,
    "hang_after": lambda value, where: int(value),
    "fallback": _flag,
    "killed_from_outside": _flag,
    "signal_lines": _patterns,
    "stop_request": _flag,
    "served_patterns": lambda value, where: tuple(int(index) for index in value),
    "served_record": _compiled,
    "silent_hang_after": _compiled,
    "detail_under": _detail_under,
    "stage_numbers": _stage_numbers,
    "parse_reasons": _flag,
    "process_numbers": _patterns,
    "walks_back": _flag,
    "stalls": _flag,
    "raised_by": _texts,
    "edits": _edits,
}
