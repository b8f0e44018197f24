"""Strict reading of YAML and JSON that people write: configuration, suites, specs, policies.

The standard parsers accept what a configuration must not: PyYAML and ``json`` keep the last of two
equal keys silently, both recurse once per nesting level (a few thousand ``[`` end in a
``RecursionError`` and a traceback of hundreds of lines), ``json`` reads ``NaN`` and
``Infinity``, and a YAML alias expands wherever its value is used (a few lines of anchors make
gigabytes: "billion laughs"). Every function here refuses those with ``StrictLoadError``, whose
message is one line, ``<source>:<line>: <rule>``:

- ``<key path>: duplicate key (first at line N)`` — a key given twice in one mapping or object at
  any depth (``judgments.d1``, ``targets.prod.gate_policies``, ``a[2].b``); ``(first at column
  C)`` when both are on one line (always, for a line of JSON Lines);
- ``nesting deeper than 64 levels (column C)`` — the line where the bound is crossed, found before
  anything is built recursively, so even 100,000 nested ``[`` cost a scan and never a
  ``RecursionError``;
- ``invalid YAML: <problem> (column C)`` / ``not valid JSON: <problem> (column C)`` — syntax;
- ``non-finite number NaN is not JSON`` (also ``Infinity``, ``-Infinity``);
- ``YAML alias *name is not allowed …`` and ``YAML merge key '<<' is not allowed …`` — aliases
  (and the merge keys that need them) are refused outright: configuration is small enough to
  write out, and the bound on expansion is then trivially zero.

The error keeps its parts (``line``, ``column``, ``rule``, ``kind``) and, for syntax errors, the
parser's own exception (``original``), so a caller with an established wording for syntax errors
keeps it. Nothing here imports more than PyYAML and the standard library (kernel floor).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

import yaml

__all__ = [
    "ALIAS",
    "DUPLICATE_KEY",
    "KEY_TYPE",
    "MAX_DEPTH",
    "NON_FINITE",
    "SYNTAX",
    "TOO_DEEP",
    "StrictLoadError",
    "load_json",
    "json_depth_rule",
    "load_json_line",
    "load_yaml",
    "load_yaml_lines",
]

MAX_DEPTH = 64  # nested mappings/sequences (objects/arrays); configuration needs a handful

# StrictLoadError.kind
SYNTAX = "syntax"
DUPLICATE_KEY = "duplicate_key"
TOO_DEEP = "too_deep"
NON_FINITE = "non_finite"
ALIAS = "alias"
KEY_TYPE = "key_type"


class StrictLoadError(ValueError):
    """``str(e)`` is one line: ``<source>:<line>: <rule>``. ``line`` is 1-based in the file (line
    offset applied), ``column`` 1-based or None; ``original`` is the parser's exception for a
    syntax error (``yaml.YAMLError``, ``json.JSONDecodeError`` or ``ValueError``), else None."""

    def __init__(
        self,
        source: str,
        line: int,
        rule: str,
        kind: str,
        column: int | None = None,
        original: BaseException | None = None,
    ):
        super().__init__(f"{source}:{line}: {rule}")
        self.source = source
        self.line = line
        self.rule = rule
        self.kind = kind
        self.column = column
        self.original = original

    def __reduce__(self):  # picklable across process boundaries despite the extra arguments
        return (type(self), (self.source, self.line, self.rule, self.kind, self.column, None))


def _too_deep(max_depth: int, column: int) -> str:
    return f"nesting deeper than {max_depth} levels (column {column})"


def _line_column(text: str, pos: int) -> tuple[int, int]:
    """1-based line and column of character offset ``pos``."""
    start = text.rfind("\n", 0, pos) + 1
    return text.count("\n", 0, pos) + 1, pos - start + 1


# ---------------------------------------------------------------------------------------- YAML

_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(Exception):
    def __init__(self, mark: yaml.Mark, rule: str, kind: str):
        self.mark, self.rule, self.kind = mark, rule, kind


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses aliases and counts nesting as it goes: the events are
    produced lazily and iteratively by PyYAML's parser, so the bound stops composition (the only
    recursive step) at the first collection beyond it."""

    def __init__(self, text: str, max_depth: int):
        super().__init__(text)
        self._depth = 0
        self._max_depth = max_depth

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                event.start_mark,
                f"YAML alias *{event.anchor} is not allowed (anchors and aliases are refused in configuration: "
                "write the value out)",
                ALIAS,
            )
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if self._depth >= self._max_depth:
                raise _Refused(event.start_mark, _too_deep(self._max_depth, event.start_mark.column + 1), TOO_DEEP)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)


class _Builder:
    """Values from a composed (depth-bounded) node tree, refusing duplicate keys and remembering
    the line of every key path."""

    def __init__(self, loader: yaml.SafeLoader, offset: int, string_keys: bool):
        self.loader = loader
        self.offset = offset
        self.string_keys = string_keys
        self.lines: dict[str, int] = {}

    def line(self, node: yaml.Node) -> int:
        return node.start_mark.line + 1 + self.offset

    def build(self, node: yaml.Node, path: str) -> Any:
        self.lines.setdefault(path, self.line(node))
        if isinstance(node, yaml.MappingNode) and node.tag == _MAP_TAG:
            return self._mapping(node, path)
        if isinstance(node, yaml.SequenceNode) and node.tag == _SEQ_TAG:
            return [self.build(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
        # A scalar, or a collection under another tag (!!set, !!omap …): SafeLoader's own
        # construction, bounded by the composer's depth check; unknown tags raise its error.
        return self.loader.construct_object(node, deep=True)

    def _mapping(self, node: yaml.MappingNode, path: str) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        seen: dict[Any, tuple[int, int]] = {}  # key -> (line, column)
        for key_node, value_node in node.value:
            line = self.line(key_node)
            if key_node.tag == _MERGE_TAG:
                raise _Refused(
                    key_node.start_mark,
                    f"{path or 'top level'}: YAML merge key '<<' is not allowed (write the keys out)",
                    ALIAS,
                )
            key = self.loader.construct_object(key_node, deep=True)
            if self.string_keys and not isinstance(key, str):
                raise _Refused(key_node.start_mark, f"{path or 'top level'}: key {key!r} is not a string", KEY_TYPE)
            child = f"{path}.{key}" if path else str(key)
            try:
                first = seen.get(key)
            except TypeError:
                raise _Refused(
                    key_node.start_mark, f"{path or 'top level'}: a key must be a scalar, not a collection", KEY_TYPE
                ) from None
            if first is not None:
                at = f"line {first[0]}" if first[0] != line else f"column {first[1]}"
                raise _Refused(key_node.start_mark, f"{child}: duplicate key (first at {at})", DUPLICATE_KEY)
            seen[key] = (line, key_node.start_mark.column + 1)
            self.lines[child] = line
            out[key] = self.build(value_node, child)
        return out


def _yaml_syntax(exc: yaml.YAMLError, text: str, source: str, offset: int) -> StrictLoadError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed"
        context = f" ({exc.context})" if exc.problem and exc.context else ""
        if mark is None:
            return StrictLoadError(source, 1 + offset, f"invalid YAML: {problem}{context}", SYNTAX, None, exc)
        column = mark.column + 1
        rule = f"invalid YAML: {problem}{context} (column {column})"
        return StrictLoadError(source, mark.line + 1 + offset, rule, SYNTAX, column, exc)
    if isinstance(exc, yaml.reader.ReaderError):
        line, column = _line_column(text, exc.position)
        rule = f"invalid YAML: unacceptable character #x{exc.character:04x}: {exc.reason} (column {column})"
        return StrictLoadError(source, line + offset, rule, SYNTAX, column, exc)
    return StrictLoadError(source, 1 + offset, "invalid YAML: " + " ".join(str(exc).split()), SYNTAX, None, exc)


def load_yaml_lines(
    text: str, source: str, *, line_offset: int = 0, max_depth: int = MAX_DEPTH, string_keys: bool = False
) -> tuple[Any, dict[str, int]]:
    """``(value, {key path: line})`` of the single YAML document in ``text`` (``None, {}`` when
    empty). Key paths are dotted with list indexes (``hard.max``, ``keys[0].id``; ``""`` is the
    document). ``line_offset`` is added to every line reported (``text`` starting on file line 2
    takes 1). ``string_keys`` refuses a key that is not a string. Raises ``StrictLoadError``."""
    loader: _BoundedLoader | None = None
    try:
        loader = _BoundedLoader(text, max_depth)  # reads (and checks the characters of) the text
        node = loader.get_single_node()
        if node is None:
            return None, {}
        builder = _Builder(loader, line_offset, string_keys)
        return builder.build(node, ""), builder.lines
    except _Refused as exc:
        column = exc.mark.column + 1
        raise StrictLoadError(source, exc.mark.line + 1 + line_offset, exc.rule, exc.kind, column) from None
    except yaml.YAMLError as exc:
        raise _yaml_syntax(exc, text, source, line_offset) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(text: str, source: str, *, line_offset: int = 0, max_depth: int = MAX_DEPTH) -> Any:
    """The single YAML document in ``text`` (``None`` when empty), read as ``yaml.safe_load``
    reads it but refusing duplicate keys, nesting beyond ``max_depth``, aliases and merge keys
    with ``StrictLoadError`` (``<source>:<line>: <rule>``)."""
    return load_yaml_lines(text, source, line_offset=line_offset, max_depth=max_depth)[0]


# ---------------------------------------------------------------------------------------- JSON

# A JSON string (an unterminated one runs to the end: then the parser reports it), unrolled so
# that the regex engine does not backtrack per character.
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"?'
_STRINGS = re.compile(_STRING, re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}
_TOKEN = re.compile(_STRING + r"|[\[\]{}:,]|-?Infinity|NaN", re.DOTALL)


class _Duplicate(Exception):
    pass


class _NonFinite(Exception):
    def __init__(self, name: str):
        self.name = name


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate
    return obj


def _constant(name: str) -> Any:
    raise _NonFinite(name)


def _depth_ok(text: str, max_depth: int) -> bool:
    """Whether no bracket outside a string nests deeper than ``max_depth`` (C-speed passes: drop
    the strings, keep the brackets, running sum)."""
    if text.count("[") + text.count("{") <= max_depth:
        return True
    brackets = _NOT_BRACKET.sub("", _STRINGS.sub("", text))
    return max(accumulate(map(_DELTA.__getitem__, brackets)), default=0) <= max_depth


class _Frame:
    __slots__ = ("first", "index", "is_object", "key", "want_key")

    def __init__(self, is_object: bool):
        self.is_object = is_object
        self.want_key = is_object
        self.first: dict[str, int] = {}
        self.key: str | None = None
        self.index = 0


def _path(stack: list[_Frame]) -> str:
    out = ""
    for frame in stack:
        if frame.is_object:
            out = f"{out}.{frame.key}" if out else str(frame.key)
        else:
            out += f"[{frame.index}]"
    return out


def _locate(text: str, kind: str, max_depth: int) -> tuple[int, str, int | None] | None:
    """Where the first problem of ``kind`` is, found by a token scan (only once the fast path has
    seen one): ``(offset, detail, first offset)`` — the key path of a duplicate and the offset of
    its first occurrence, the constant's name, or nothing for nesting."""
    stack: list[_Frame] = []
    for match in _TOKEN.finditer(text):
        token = match.group()
        head = token[0]
        if head in "[{":
            if kind == TOO_DEEP and len(stack) >= max_depth:
                return match.start(), "", None
            stack.append(_Frame(head == "{"))
        elif head in "]}":
            if stack:
                stack.pop()
        elif head == ",":
            if stack:
                if stack[-1].is_object:
                    stack[-1].want_key = True
                else:
                    stack[-1].index += 1
        elif head == '"':
            frame = stack[-1] if stack else None
            if frame is not None and frame.is_object and frame.want_key:
                frame.want_key = False
                try:
                    key = json.loads(token)
                except ValueError:
                    continue
                frame.key = key
                if kind == DUPLICATE_KEY and key in frame.first:
                    return match.start(), _path(stack), frame.first[key]
                frame.first.setdefault(key, match.start())
        elif head != ":" and kind == NON_FINITE:
            return match.start(), token, None
    return None


def _json(text: str, source: str, line: int | None, line_offset: int, max_depth: int) -> Any:
    """``line`` set: ``text`` is that one line of a JSON Lines file (columns name places);
    otherwise ``text`` is a document whose first line is file line ``line_offset + 1``."""

    def where(pos: int) -> tuple[int, int]:
        at_line, column = _line_column(text, pos)
        return (line if line is not None else at_line + line_offset), column

    def refuse(pos: int, rule: str, kind: str) -> StrictLoadError:
        at_line, column = where(pos)
        return StrictLoadError(source, at_line, rule, kind, column)

    if not _depth_ok(text, max_depth):
        found = _locate(text, TOO_DEEP, max_depth)
        pos = found[0] if found else 0
        raise refuse(pos, _too_deep(max_depth, where(pos)[1]), TOO_DEEP) from None
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except _Duplicate:
        found = _locate(text, DUPLICATE_KEY, max_depth)
        if found is None:  # not expected: the scan reads keys as the parser does
            raise StrictLoadError(source, line or 1 + line_offset, "duplicate key", DUPLICATE_KEY) from None
        pos, path, first = found
        at_line, _ = where(pos)
        first_line, first_column = where(first if first is not None else pos)
        seen = f"first at line {first_line}" if first_line != at_line else f"first at column {first_column}"
        raise refuse(pos, f"{path}: duplicate key ({seen})", DUPLICATE_KEY) from None
    except _NonFinite as exc:
        found = _locate(text, NON_FINITE, max_depth)
        raise refuse(found[0] if found else 0, f"non-finite number {exc.name} is not JSON", NON_FINITE) from None
    except json.JSONDecodeError as exc:
        at_line = line if line is not None else exc.lineno + line_offset
        if exc.msg == "Extra data":
            rule = f"more than one JSON value{' on the line' if line is not None else ''} (column {exc.colno})"
        else:
            rule = f"not valid JSON: {exc.msg} (column {exc.colno})"
        raise StrictLoadError(source, at_line, rule, SYNTAX, exc.colno, exc) from None
    except RecursionError:  # only with a max_depth beyond the interpreter's stack
        raise StrictLoadError(source, line or 1 + line_offset, "nesting too deep", TOO_DEEP) from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        rule = "not valid JSON: " + " ".join(str(exc).split())
        raise StrictLoadError(source, line or 1 + line_offset, rule, SYNTAX, None, exc) from None


def load_json(text: str, source: str, *, line_offset: int = 0, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON document in ``text``, refusing a key given twice in one object (at any depth),
    nesting beyond ``max_depth``, ``NaN``/``Infinity`` and syntax errors with ``StrictLoadError``
    (``<source>:<line>: <rule>``; ``line_offset`` is added to every line)."""
    return _json(text, source, None, line_offset, max_depth)


def json_depth_rule(text: str, max_depth: int = MAX_DEPTH) -> str | None:
    """``nesting deeper than N levels (column C)`` when JSON ``text`` nests beyond ``max_depth``,
    else None — the check ``load_json`` makes first, for a parser with rules of its own (a
    corpus line) that must never reach ``json``'s recursion limit."""
    if _depth_ok(text, max_depth):
        return None
    found = _locate(text, TOO_DEEP, max_depth)
    pos = found[0] if found else 0
    return _too_deep(max_depth, _line_column(text, pos)[1])


def load_json_line(text: str, source: str, line: int, *, max_depth: int = MAX_DEPTH) -> Any:
    """One line (``line``, 1-based) of a JSON Lines file, with ``load_json``'s rules; places on the
    line are named by column (``judgments.d1: duplicate key (first at column 60)``)."""
    return _json(text, source, line, 0, max_depth)
