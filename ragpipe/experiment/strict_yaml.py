"""Strict YAML for policy files: duplicate keys refused, non-string keys refused, and the line of
every key path remembered so an error can name it.

PyYAML keeps the last of two equal keys silently; in a gate policy that would let a second
``max:`` quietly replace the first, so ``load_strict`` refuses it with both lines.
"""

from __future__ import annotations

from typing import Any

import yaml


class StrictYamlError(ValueError):
    """``str(e)`` is ``"<line>: <rule>"`` (the caller prefixes the file)."""

    def __init__(self, line: int, rule: str):
        super().__init__(f"{line}: {rule}")
        self.line = line
        self.rule = rule


def _walk(node: yaml.Node, loader: yaml.SafeLoader, path: str, lines: dict[str, int]) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if not isinstance(key, str):
                raise StrictYamlError(line, f"{path or 'top level'}: key {key!r} is not a string")
            child = f"{path}.{key}" if path else key
            if key in seen:
                raise StrictYamlError(line, f"{child}: duplicate key (first at line {seen[key]})")
            seen[key] = line
            lines[child] = line
            out[key] = _walk(value_node, loader, child, lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, loader, f"{path}[{i}]", lines) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_strict(text: str) -> tuple[Any, dict[str, int]]:
    """``(value, {key path: line})`` of one YAML document; raises ``StrictYamlError``."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        lines: dict[str, int] = {}
        return _walk(node, loader, "", lines), lines
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise StrictYamlError(mark.line + 1 if mark else 1, f"invalid YAML: {exc.problem or exc.context}") from None
    finally:
        loader.dispose()
