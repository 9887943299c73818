"""YAML read within bounds: a deployment file's nesting depth, number of values once aliases
are expanded, and size, so that a "billion laughs" document is refused at once instead of
eating the memory; and YAML 1.2's booleans only.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

# Limits on the YAML: a deployment file is a few kB; these leave a wide margin.
# Limits on the YAML: a deployment file is a few kB; these leave a wide margin.
MAX_BYTES = 1_000_000
MAX_DEPTH = 40
MAX_NODES = 100_000


class YamlLimitError(Exception):
    """A YAML document beyond :data:`MAX_DEPTH`, :data:`MAX_NODES` or with duplicate keys."""

    def __init__(self, message: str, remedy: str):
        super().__init__(message)
        self.remedy = remedy


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the nesting depth bounded while composing (before PyYAML's
    own recursion could overflow the stack)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlLimitError(
                    f"YAML nested more than {MAX_DEPTH} levels deep (at {mark.line + 1}:"
                    f"{mark.column + 1})",
                    remedy="a deployment file needs a few levels; remove the nesting",
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# YAML 1.2's booleans only: `yes`, `no`, `on`, `off` stay text (PyYAML reads YAML 1.1, where
# `trust_on_first_use: yes` is true and a country code `NO` is false), so the schema can say so.
_BoundedLoader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


_BoundedLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def load_yaml(text: str) -> Any:
    """A YAML document, bounded: the nesting depth while it is read, then the number of values
    it holds with every alias expanded (counted without expanding them), and no duplicate keys.

    Raises:
        yaml.YAMLError: not YAML.
        YamlLimitError: beyond a limit, or a key written twice in one mapping.
    """
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_nodes(root: yaml.Node) -> None:
    sizes: dict[int, int] = {}
    total = _expanded_size(root, sizes, 0)
    if total > MAX_NODES:
        raise YamlLimitError(
            f"YAML holds {total} values once its aliases (*name) are expanded, more than "
            f"{MAX_NODES}",
            remedy="write the values out instead of nesting aliases of aliases",
        )


def _expanded_size(node: yaml.Node, sizes: dict[int, int], depth: int) -> int:
    """How many values ``node`` stands for with aliases expanded; an aliased node is counted
    once per use, computed once (memo by identity)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    if depth > MAX_DEPTH:
        raise YamlLimitError(
            f"YAML nested more than {MAX_DEPTH} levels deep", remedy="remove the nesting"
        )
    size = 1
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            size += _expanded_size(item, sizes, depth + 1)
            if size > MAX_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if key.value in seen:
                    raise YamlLimitError(
                        f"key {key.value!r} is written twice in one mapping (line "
                        f"{key.start_mark.line + 1})",
                        remedy="keep one of them: YAML would silently use the last",
                    )
                seen.add(key.value)
            size += _expanded_size(key, sizes, depth + 1) + _expanded_size(value, sizes, depth + 1)
            if size > MAX_NODES:
                break
    sizes[id(node)] = size
    return size
