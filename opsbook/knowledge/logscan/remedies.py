"""A diagnosis's remedy by the release and platform it saw, as an edit of the deployment.

An entry's ``edits`` (failures.yaml) are its remedies that are a change of ``server.args``,
``server.env`` or the model's config, each with the releases and platforms it holds for and
the test that applied it and saw the server start. The first variant whose conditions hold
for the diagnosed log replaces the entry's general remedy and is reported as
``LogDiagnosis.edit``; with none, the entry's own remedy (which covers every release) stays.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsbook.knowledge.compat.rules_table import parse_version, version_in
from opsbook.knowledge.logscan.catalogue import RemedyEdit, edit_as_named, entry_by_id, signals
from opsbook.knowledge.logscan.diagnosis import FAILED, HUNG, LogDiagnosis
from opsbook.knowledge.logscan.log_lines import LogLine

_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class FilledEdit:
    """A variant with its placeholders filled from a diagnosis's numbers."""

    remedy: str
    source: str
    args: dict[str, Any]
    env: dict[str, Any]
    config_remove: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        """The edit as the deployment names it (``server.args``, ``server.env``, ``config``)."""
        return edit_as_named(self.args, self.env, self.config_remove)


def platform_of(lines: Sequence[LogLine]) -> str | None:
    """The platform a log names (``cuda``, ``cpu``, ``rocm``...), or None."""
    pattern = signals().platform
    for line in lines:
        found = pattern.search(line.text)
        if found:
            return next(group for group in found.groups() if group).lower()
    return None


def choose_edit(
    variants: Sequence[RemedyEdit],
    numbers: Mapping[str, Any],
    *,
    version: str | None,
    platform: str | None,
    line: str,
) -> FilledEdit | None:
    """The first variant that holds for this release, platform, line and numbers, filled.

    A variant bound to releases or platforms never holds when the log does not say which:
    the entry's general remedy is then the honest answer.
    """
    for variant in variants:
        if _holds(variant, numbers, version, platform, line):
            filled = _filled(variant, numbers)
            if filled is not None:
                return filled
    return None


def with_release_remedy(
    diagnosis: LogDiagnosis,
    lines: Sequence[LogLine],
    platform: str | None = None,
    version: str | None = None,
) -> LogDiagnosis:
    """``diagnosis`` with the remedy of the release and platform it saw, when its class has one.

    Args:
        diagnosis: a finished diagnosis.
        lines: the log it read (for the platform, when ``platform`` is not given).
        platform: the host's platform, when the caller knows it.
        version: the host's vLLM release, for a log that does not state it (argparse exits
            before vLLM logs its version).
    """
    if diagnosis.state not in (FAILED, HUNG) or not diagnosis.failure or diagnosis.line is None:
        return diagnosis
    entry = entry_by_id(diagnosis.error_class or diagnosis.failure)
    if not entry.edits:
        return diagnosis
    filled = choose_edit(
        entry.edits,
        diagnosis.numbers,
        version=diagnosis.version or version,
        platform=platform or platform_of(lines),
        line=diagnosis.line.text,
    )
    if filled is not None:
        diagnosis.remedy = filled.remedy
        diagnosis.source = f"{entry.source}; the remedy: {filled.source}"
        diagnosis.edit = filled.as_dict()
    return diagnosis


def apply_edit(
    edit: Mapping[str, Any], args: Mapping[str, Any], env: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``server.args`` and ``server.env`` with a diagnosis's edit applied (None removes).

    The config part (``config.remove``) is 02_config_patch's: it is not applied here.
    """
    new_args = dict(args)
    new_env = dict(env)
    for target, changes in (
        (new_args, edit.get("server.args", {})),
        (new_env, edit.get("server.env", {})),
    ):
        for key, value in changes.items():
            if value is None:
                target.pop(key, None)
            else:
                target[key] = value
    return new_args, new_env


def _holds(
    variant: RemedyEdit,
    numbers: Mapping[str, Any],
    version: str | None,
    platform: str | None,
    line: str,
) -> bool:
    if variant.versions and not version_in(parse_version(version), variant.versions):
        return False
    if variant.platforms and platform not in variant.platforms:
        return False
    if variant.line is not None and not variant.line.search(line):
        return False
    return all(_text(numbers.get(key)) in allowed for key, allowed in variant.numbers)


def _filled(variant: RemedyEdit, numbers: Mapping[str, Any]) -> FilledEdit | None:
    values = {key: _text(value) for key, value in numbers.items() if value is not None}
    try:
        args: dict[str, Any] = {}
        for key, value in variant.args:
            for flag in _flags(_fill(key, values)):
                args[flag] = _fill_value(value, values)
        return FilledEdit(
            remedy=_fill(variant.remedy, values),
            source=variant.source,
            args=args,
            env={key: _fill_value(value, values) for key, value in variant.env},
            config_remove=variant.config_remove,
        )
    except KeyError:
        return None  # a placeholder the log did not give: not this variant


def _fill(text: str, values: Mapping[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda found: values[found.group(1)], text)


def _fill_value(value: Any, values: Mapping[str, str]) -> Any:
    """A placeholder-only value takes the number's type: ``{derived_max_model_len}`` is 512,
    an integer as vLLM's parser wants it (``--max-model-len 512.0`` is refused)."""
    if not isinstance(value, str):
        return value
    whole = _PLACEHOLDER.fullmatch(value)
    if whole:
        text = values[whole.group(1)]
        return int(text) if text.isdigit() else text
    return _fill(value, values)


def _flags(key: str) -> list[str]:
    """A key names one flag, or (filled from argparse's "unrecognized arguments: --a 1 --b")
    several: the words that are flags, without their dashes and values."""
    words = key.split()
    if len(words) == 1 and not words[0].startswith("-"):
        return words
    return [word.lstrip("-").partition("=")[0] for word in words if word.startswith("-")]


def _text(value: Any) -> str:
    """A parsed number as the log wrote it: 512.0 (a float parse of "512") is ``512``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)
