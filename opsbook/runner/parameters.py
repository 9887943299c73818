"""A notebook's parameters: which notebook a name means, and the ``-p NAME VALUE`` pairs of
``opsbook run`` as the values it declares.

A stage notebook's parameters are its stage's (:func:`opsbook.stages.base.parameters_of`): the
deployment, the hosts and forks, and the fields of the stage's options class, each with its
type and default. Any other notebook's are read from its ``parameters`` cell by papermill.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsbook.core.exceptions import RunError
from opsbook.runner import runbook
from opsbook.runner.runbook import notebooks_dir

# The runbook: the checkout's notebooks/, or the copy an installed wheel carries.
NOTEBOOKS_DIR = notebooks_dir()
# Parameters the runner sets itself; `-p` may not give them (the deployment comes from -f).
DEPLOYMENT_PARAMETER = "deployment"
RUNNER_PARAMETERS = {DEPLOYMENT_PARAMETER: "-f FILE"}


def find_notebook(name: str) -> Path:
    """A notebook by path, or by stage name (``00_preflight``, ``preflight``) in notebooks/.

    Raises:
        RunError: no such notebook.
    """
    path = Path(name)
    if path.is_file():
        return path
    candidates = sorted(NOTEBOOKS_DIR.glob("*.ipynb")) + sorted(Path("notebooks").glob("*.ipynb"))
    stem = path.stem
    for nb in candidates:
        if nb.stem == stem or nb.stem.split("_", 1)[-1] == stem:
            return nb
    known = ", ".join(sorted({nb.stem for nb in candidates})) or "none found"
    raise RunError(f"no notebook named {name!r}", remedy=f"use a path or one of: {known}")


def declared_parameters(notebook: Path) -> dict[str, Any]:
    """The parameters the notebook declares, with their defaults (None where a default is an
    expression): a stage notebook's are its stage's (the options class the ``parameters`` cell
    is held to by a test), any other notebook's are read from its cell by papermill."""
    from opsbook import stages

    stage = stages.for_notebook(notebook.stem)
    if stage is not None:
        own = {p.name: p.default for p in stages.parameters_of(stage)}
        return {DEPLOYMENT_PARAMETER: None, **own}
    import papermill

    declared = papermill.inspect_notebook(str(notebook))
    return {name: _declared_default(parameter) for name, parameter in declared.items()}


def check_parameters(notebook: Path, parameters: Mapping[str, Any]) -> None:
    """Refuse parameter names the notebook does not declare (papermill only warns), and
    values its stage's options refuse.

    Raises:
        RunError: a name is unknown, or a value not allowed.
    """
    declared = set(declared_parameters(notebook))
    unknown = sorted(set(parameters) - declared)
    if unknown:
        raise RunError(
            f"{notebook.name} has no parameter(s) {', '.join(unknown)}",
            remedy=f"its parameters are: {', '.join(sorted(declared)) or 'none'}",
        )
    check_option_values(notebook, parameters)


TRUE_WORDS = ("true",)
FALSE_WORDS = ("false",)
INTEGER = re.compile(r"[+-]?[0-9]+")
NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def typed_parameters(notebook: Path, raw: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """``-p NAME VALUE`` pairs as the values the notebook declares: each VALUE is converted to
    the type of the parameter's default (:func:`declared_parameters`: bool, int, float, str, or
    a list of strings given comma-separated), never parsed as YAML or Python.

    Raises:
        RunError: a name is unknown or set by the runner, or a value does not fit its type.
    """
    declared = declared_parameters(notebook)
    values = {}
    for name, text in raw:
        if name in RUNNER_PARAMETERS:
            raise RunError(
                f"the parameter {name} is set by opsbook run itself",
                remedy=f"give it as {RUNNER_PARAMETERS[name]}, not -p {name}",
            )
        if name not in declared:
            check_parameters(notebook, {name: text})
        values[name] = plain_value(name, text, declared[name])
    check_option_values(notebook, values)
    return values


def check_option_values(notebook: Path, values: Mapping[str, Any]) -> None:
    """Hold a stage notebook's values to its options class and to the limits its fields
    declare (:class:`opsbook.stages.base.Limits`: ``-p forks 0``, ``-p ready_timeout -5``,
    ``-p gpu_memory_utilization 1.5``, ``-p restart sometimes``, apply with restore), before
    a kernel starts or anything touches a host.

    Raises:
        RunError: a value is refused by the stage's options or outside its limits.
    """
    import dataclasses

    from opsbook import stages
    from opsbook.stages.base import Targets

    stage = stages.for_notebook(notebook.stem)
    if stage is None:
        return
    fields = [*dataclasses.fields(Targets), *dataclasses.fields(stage.options_type)]
    check_limits(fields, values)
    names = {f.name for f in dataclasses.fields(stage.options_type)}
    stage.options({name: value for name, value in values.items() if name in names})


def check_limits(fields: Sequence[Any], values: Mapping[str, Any]) -> None:
    """Refuse a value outside the :class:`~opsbook.stages.base.Limits` of its field.

    Raises:
        RunError: the first value outside its limits, with the range and an example.
    """
    from opsbook.stages.base import LIMITS

    for f in fields:
        limits = f.metadata.get(LIMITS)
        if limits is None or f.name not in values:
            continue
        value = values[f.name]
        refused = _outside(limits, value, values)
        if refused:
            shown = str(value).lower() if isinstance(value, bool) else repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise RunError(
                f"-p {f.name} {shown}: {refused}",
                remedy=_limit_remedy(f.name, f.default, limits),
            )


def _outside(limits: Any, value: Any, values: Mapping[str, Any]) -> str:
    """Why ``value`` is outside ``limits`` ("" when it is inside)."""
    if limits.excludes and value is True:
        clash = [name for name in limits.excludes if values.get(name) is True]
        if clash:
            return f"cannot be given with {' and '.join(clash)} true (they do different things)"
    if limits.choices and value not in limits.choices:
        return f"must be one of {', '.join(limits.choices)}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    if value != value:  # NaN: in no range
        return f"must be {_range_words(limits)}"
    low_ok = limits.low is None or value >= limits.low
    above_ok = limits.above is None or value > limits.above
    high_ok = limits.high is None or value <= limits.high
    return "" if low_ok and above_ok and high_ok else f"must be {_range_words(limits)}"


def _range_words(limits: Any) -> str:
    parts = []
    if limits.low is not None:
        parts.append(f"at least {limits.low:g}")
    if limits.above is not None:
        parts.append(f"above {limits.above:g}")
    if limits.high is not None:
        parts.append(f"at most {limits.high:g}")
    return " and ".join(parts)


def _limit_remedy(name: str, default: Any, limits: Any) -> str:
    if limits.excludes:
        return f"give {name} or {', '.join(limits.excludes)}, in separate runs"
    example = str(default).lower() if isinstance(default, bool) else default
    return f"write e.g. -p {name} {example} (the default)"


def _declared_default(parameter: Mapping[str, Any]) -> Any:
    """The default a parameters cell gives (a Python literal), or None when it is an
    expression."""
    try:
        return ast.literal_eval(str(parameter.get("default", "")))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def plain_value(name: str, text: str, default: Any) -> Any:
    """``text`` as a value of the type of ``default``: ``true``/``false`` (any case) for a bool,
    a whole number for an int, a number for a float, the text itself for a str, the
    comma-separated items for a list.

    Raises:
        RunError: the text does not fit, or the parameter has no literal default.
    """
    if isinstance(default, bool):
        word = text.strip().lower()
        if word in TRUE_WORDS or word in FALSE_WORDS:
            return word in TRUE_WORDS
        raise _misfit(name, text, "true or false", f"-p {name} true")
    if isinstance(default, int):
        if INTEGER.fullmatch(text.strip()):
            return int(text)
        raise _misfit(name, text, "a whole number", f"-p {name} {default}")
    if isinstance(default, float):
        if NUMBER.fullmatch(text.strip()):
            return float(text)
        raise _misfit(name, text, "a number", f"-p {name} {default}")
    if isinstance(default, str):
        return text
    if isinstance(default, list):
        return [item.strip() for item in text.split(",") if item.strip()]
    raise RunError(
        f"the parameter {name} cannot be given on the command line",
        remedy="set it in the deployment file or the notebook",
    )


def _misfit(name: str, text: str, expected: str, example: str) -> RunError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    return RunError(f"-p {name} {shown!r}: expected {expected}", remedy=f"write e.g. {example}")


@dataclass(frozen=True)
class Declared:
    """A parameter as a stage notebook's ``parameters`` cell declares it: its name, default
    (whose type is the parameter's) and the comment beside it."""

    name: str
    default: Any
    comment: str = ""

    @property
    def type_name(self) -> str:
        """Its type as the stage's options class spells it (every list is of text)."""
        kind = type(self.default)
        return "list[str]" if kind is list else kind.__name__


@dataclass(frozen=True)
class StageNotebook:
    """A notebook of the runbook: its name, the title its first cell gives, and the parameters
    ``opsbook run -p`` may set (``deployment`` is ``-f``)."""

    name: str
    title: str
    parameters: list[Declared]


def runbook_parameters() -> list[StageNotebook]:
    """The runbook's notebooks in order, each with its parameters as its ``parameters`` cell
    declares them (a test holds each cell to its stage's options class,
    :func:`opsbook.stages.parameters_of`): read from the notebooks' JSON, so that ``opsbook run
    --help`` imports no stage and starts no kernel."""
    import json

    found = []
    for path in runbook.notebooks():
        cells = json.loads(path.read_text())["cells"]
        heading = "".join(cells[0]["source"]).splitlines()[0] if cells else ""
        title = heading.lstrip("#").split("·", 1)[-1].strip()
        tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        declared = _declared_in("".join(tagged[0]["source"])) if tagged else []
        found.append(StageNotebook(path.stem, title, declared))
    return found


@functools.cache
def parameter_names(notebook: Path) -> frozenset[str]:
    """The names a notebook's ``parameters`` cell declares (the runner's own left out), read
    from its JSON: for a stage notebook the same as its options' fields
    (:func:`opsbook.stages.parameters_of`, held to the cell by a test), without importing the
    stage's module (0.3-0.5 s of a deploy's own process, which runs no stage)."""
    import json

    cells = json.loads(notebook.read_text())["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    return (
        frozenset(d.name for d in _declared_in("".join(tagged[0]["source"])))
        if tagged
        else frozenset()
    )


def _declared_in(cell: str) -> list[Declared]:
    """The literal assignments of a parameters cell, after the runner's own, with the comment
    on the same line."""
    lines = cell.splitlines()
    declared = []
    for node in ast.parse(cell).body:
        if not isinstance(node, ast.Assign) or not isinstance(node.targets[0], ast.Name):
            continue
        name = node.targets[0].id
        if name in RUNNER_PARAMETERS:
            continue
        after = lines[node.lineno - 1][node.end_col_offset or 0 :].strip()
        comment = after[1:].strip() if after.startswith("#") else ""
        declared.append(Declared(name, _literal(node.value), comment))
    return declared


def _literal(value: ast.expr) -> Any:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return None
