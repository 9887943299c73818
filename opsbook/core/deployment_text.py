"""What the deployment schema says to a person: a schema error as one message naming the file,
each key path and what is expected (with the nearest valid key), and the reference table of
every key.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from opsbook.core.deployment_schema import INVALID, DeploymentDoc, VarsDoc, kind_of
from opsbook.core.exceptions import DeploymentError


def schema_error(error: ValidationError, source: str, prefix: str = "") -> DeploymentError:
    """One :class:`DeploymentError` naming every problem: the file, the key path, what was
    found, what is expected, and a remedy."""
    problems = [describe(e) for e in error.errors(include_url=False)]
    lines = [f"{prefix}{path}: {problem}" for path, problem, _ in problems]
    remedies = list(dict.fromkeys(r for _, _, r in problems if r))
    head = f"{source}: " + (
        lines[0] if len(lines) == 1 else f"{len(lines)} problems:\n  " + "\n  ".join(lines)
    )
    return DeploymentError(head, remedy="; ".join(remedies) or None)


def describe(error: Any) -> tuple[str, str, str]:
    """A pydantic error as (key path, what is wrong and expected, remedy)."""
    loc = tuple(error["loc"])
    kind = error["type"]
    value = error.get("input")
    path = key_path(loc)
    field_info = _field_at(loc)
    example = _example(field_info)
    write = f"write e.g. `{_yaml_line(loc, example)}`" if example is not None else ""
    if kind == "extra_forbidden":
        return path, f"unknown key {loc[-1]!r}", _nearest_key(loc)
    if kind == "missing":
        return path, "is required", write
    if kind == "bool_type":
        return (
            path,
            f"expected true or false, got {_shown(value)}",
            (f"write {loc[-1]}: true or {loc[-1]}: false, without quotes"),
        )
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return path, f"expected an integer, got {_shown(value)}", write
    if kind == "finite_number":
        return path, f"expected a finite number, got {value!r}", write
    if kind in ("float_type", "float_parsing"):
        return path, f"expected a number, got {_shown(value)}", write
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return path, f"expected {_range(field_info)}, got {value!r}", write
    if kind == "string_type":
        quotable = _is_scalar(value) and value is not None and isinstance(loc[-1], str)
        remedy = f"quote it: {loc[-1]}: '{value}'" if quotable else write or "write a string"
        return path, f"expected a string, got {_shown(value)}", remedy
    if kind == "list_type":
        remedy = f"write {loc[-1]}: [{value}]" if isinstance(value, str) else write
        return path, f"expected a list, got {_shown(value)}", remedy
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return path, f"expected a mapping (key: value), got {_shown(value)}", write
    if kind == "too_short":
        return path, "expected at least one entry, got none", write
    if kind == "string_too_short":
        return path, "expected a non-empty string", write
    if kind == INVALID:
        context = error.get("ctx") or {}
        return path, str(context.get("problem", error["msg"])), str(context.get("remedy", ""))
    return path, f"{error['msg']} (got {_shown(value)})", write


def key_path(loc: tuple[Any, ...]) -> str:
    """``("hosts", 1, "port")`` -> ``hosts[1].port``; a mapping's key -> ``server.env 'A-B'``."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part == "[key]":
            text += " (a key)"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


def _nearest_key(loc: tuple[Any, ...]) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return ""
    valid = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    where = key_path(loc[:-1])
    place = f"under {where}" if loc[:-1] else "at the top level"
    return f"{hint}valid keys {place}: {', '.join(valid)}"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema model a key path leads to (list indexes skipped)."""
    model: type[BaseModel] | None = DeploymentDoc
    for part in loc:
        if isinstance(part, int):
            continue
        if model is None or part not in model.model_fields:
            return None
        model = _inner_model(model.model_fields[part].annotation)
    return model


def _field_at(loc: tuple[Any, ...]) -> FieldInfo | None:
    names = [p for p in loc if isinstance(p, str) and p != "[key]"]
    if not names:
        return None
    model = _model_at(tuple(names[:-1]))
    return model.model_fields.get(names[-1]) if model is not None else None


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside ``X``, ``X | None``, ``list[X]``, ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _example(info: FieldInfo | None) -> Any:
    return info.examples[0] if info is not None and info.examples else None


def _yaml_line(loc: tuple[Any, ...], example: Any) -> str:
    names = [str(p) for p in loc if isinstance(p, str) and p != "[key]"]
    return f"{names[-1] if names else 'key'}: {example}"


def _range(info: FieldInfo | None) -> str:
    low, high, above = None, None, None
    for item in info.metadata if info is not None else []:
        low = getattr(item, "ge", None) if getattr(item, "ge", None) is not None else low
        high = getattr(item, "le", None) if getattr(item, "le", None) is not None else high
        above = getattr(item, "gt", None) if getattr(item, "gt", None) is not None else above
    if low is not None and high is not None:
        return f"an integer from {low} to {high}"
    if low is not None:
        return f"an integer of at least {low}"
    if above is not None:
        return f"a number greater than {above}"
    return "a value in range"


def _shown(value: Any) -> str:
    if isinstance(value, (dict, list)) or value is None:
        return kind_of(value)
    text = repr(value)
    return f"{kind_of(value)} {text if len(text) <= 60 else text[:57] + '...'}"


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, bool)) or value is None


def reference_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of every key of a deployment file, from the schema."""
    return list(_rows(DeploymentDoc, ""))


def _rows(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, str, str, str]]:
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = _inner_model(info.annotation)
        listed = _is_list(info.annotation)
        yield key, _type_label(info), _default_label(info), info.description or ""
        if inner is not None and inner is not VarsDoc:
            yield from _rows(inner, f"{key}[]." if listed else f"{key}.")


def reference_table() -> str:
    """The deployment file reference as a Markdown table (the README's)."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, kind, default, meaning in reference_rows():
        lines.append(f"| `{key}` | {kind} | {default} | {meaning.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(_strip(annotation)) is list


def _strip(annotation: Any) -> Any:
    """``Annotated[X, ...]`` -> X."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _type_label(info: FieldInfo) -> str:
    label = _annotation_label(info.annotation)
    bounds = _range(info) if info.metadata else ""
    if bounds.startswith("an integer from"):
        label = f"integer {bounds.removeprefix('an integer from ').replace(' to ', '..')}"
    elif bounds.startswith("an integer of at least"):
        label = f"integer ≥ {bounds.removeprefix('an integer of at least ')}"
    elif bounds.startswith("a number greater than"):
        label = f"number > {bounds.removeprefix('a number greater than ')}"
    return label


def _annotation_label(annotation: Any) -> str:
    annotation = _strip(annotation)
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        labels = [_annotation_label(a) for a in typing.get_args(annotation)]
        return " or ".join(labels)
    if origin is list:
        return f"list of {_annotation_label(typing.get_args(annotation)[0])}s"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    names = {str: "string", bool: "true/false", int: "integer", float: "number"}
    names[type(None)] = "null"
    if annotation is Any:
        return "value"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _default_label(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        return "empty"
    default = info.default
    if isinstance(default, BaseModel):
        return "see below"
    if default is None:
        return "null"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    return f"`{default}`"
