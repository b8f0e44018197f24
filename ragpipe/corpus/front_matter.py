"""YAML front matter of a Markdown/text document, parsed so that nothing ambiguous gets through.

A document has front matter when its first non-blank line, stripped, is ``---``. Then:

- that line must be line 1 and exactly ``---`` (``--- `` with trailing whitespace, or a ``---``
  after blank lines, is refused: other tools would read it differently, and reading it as text
  would publish the declared ``access_scopes`` as document text under the default scope);
- the block ends at the next line that, stripped, is ``---``; that line must be exactly ``---``;
- the YAML between must be a mapping (or empty), with no key given twice at any depth.

A first line ``+++`` (TOML front matter) is refused rather than read as text. Any other document
has no front matter. Problems come back as ``(line, rule)`` with 1-based file lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

# The YAML block starts on file line 2; PyYAML marks are 0-based.
_YAML_LINE_OFFSET = 2


@dataclass(frozen=True)
class FrontMatter:
    meta: dict[Any, Any]
    key_lines: dict[str, int]  # top-level key -> 1-based file line
    body: str


Problems = list[tuple[int, str]]


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: the base constructor reports it
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first + _YAML_LINE_OFFSET})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str) -> tuple[Any, dict[str, int]]:
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        value = loader.construct_document(node) if node is not None else {}
    finally:
        loader.dispose()
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                lines.setdefault(key_node.value, key_node.start_mark.line + _YAML_LINE_OFFSET)
    return value, lines


def _delimiter_problem(line: str, lineno: int) -> tuple[int, str] | None:
    if line == "---":
        return None
    return lineno, f"front matter delimiter {line!r} must be exactly '---' (no surrounding whitespace)"


def split_front_matter(text: str) -> tuple[FrontMatter | None, Problems]:
    """Split normalised text into front matter and body; ``None`` with problems if refused."""
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    none = FrontMatter(meta={}, key_lines={}, body=text)
    if first is None:
        return none, []
    opener = lines[first].strip()
    if opener == "+++":
        return None, [(first + 1, "TOML front matter ('+++') is not supported: use YAML between '---' lines")]
    if opener != "---":
        return none, []
    if first != 0:
        return None, [(first + 1, "front matter must open on line 1 (a '---' line after blank lines is ambiguous)")]
    bad = _delimiter_problem(lines[0], 1)
    if bad:
        return None, [bad]
    close = next((j for j in range(1, len(lines)) if lines[j].strip() == "---"), None)
    if close is None:
        return None, [(1, "front matter opened with '---' is never closed")]
    bad = _delimiter_problem(lines[close], close + 1)
    if bad:
        return None, [bad]
    try:
        meta, key_lines = _load_yaml("\n".join(lines[1:close]))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + _YAML_LINE_OFFSET if mark else 1
        return None, [(line, f"front matter is not valid YAML: {exc.problem or exc.context}")]
    except yaml.YAMLError as exc:
        return None, [(1, f"front matter is not valid YAML: {exc}")]
    if not isinstance(meta, dict):
        return None, [(1, "front matter must be a mapping")]
    return FrontMatter(meta=meta, key_lines=key_lines, body="\n".join(lines[close + 1 :])), []
