"""YAML front matter of a Markdown/text document, parsed so that nothing ambiguous gets through.

Lines are compared on what a reader can see: a line is *blank* when nothing is left of it once
whitespace and invisible characters (Unicode categories Cf and Zs: zero-width spaces, joiners, a
second BOM, no-break spaces …) are removed. A line *looks like a fence* when, with Cf/Zs characters
removed and NFKC applied (fullwidth ``－`` becomes ``-``), it holds no letter or digit and either a
run of three or more ``-`` or any typographic dash (Unicode Pd or U+2212: ``—`` is what "smart
punctuation" makes of ``---``). A document has front matter when its first non-blank line looks
like a fence. Then:

- that line must be line 1 and exactly ``---`` (``--- ``, ``----``, ``\\u200b---``, ``—`` or a
  ``---`` after blank lines is refused: other tools would read it differently, and reading it as
  text would publish the declared ``access_scopes`` as document text under the default scope);
- the block ends at the next line that looks like a fence; that line must be exactly ``---``;
- the YAML between must be a mapping (or empty), with no key given twice at any depth, nesting
  at most 64 levels and no aliases (``ragpipe.kernel.strict_load``).

A first non-blank line with no letter or digit and a run of three or more ``+`` (``+++``, TOML
front matter) is refused rather than read as text. Any other document has no front matter.
Problems come back as ``(line, rule)`` with 1-based file lines.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import yaml

from ragpipe.kernel.strict_load import ALIAS, MAX_DEPTH, TOO_DEEP, StrictLoadError, load_yaml

# The YAML block starts on file line 2; PyYAML marks are 0-based.
_YAML_LINE_OFFSET = 2
_INVISIBLE = frozenset({"Cf", "Zs"})
_NO_WORD = re.compile(r"[\W_]*\Z")
_HYPHEN_RUN = re.compile(r"-{3,}")
_PLUS_RUN = re.compile(r"\+{3,}")
_MINUS_SIGN = "\u2212"
_SHOWN_LINE_CHARS = 40


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
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {first + _YAML_LINE_OFFSET})",
                    key_node.start_mark,
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


def _wordless_view(line: str) -> str | None:
    """What a reader sees of a line with no letter or digit: invisible characters (Cf, Zs) removed,
    NFKC applied. ``None`` for a line with a letter or digit: it is neither blank nor a fence (the
    regex runs first, at C speed, so megabyte lines of text cost almost nothing)."""
    if not _NO_WORD.match(line):
        return None
    seen = unicodedata.normalize("NFKC", "".join(c for c in line if unicodedata.category(c) not in _INVISIBLE))
    return seen if _NO_WORD.match(seen) else None


def _is_blank(line: str) -> bool:
    seen = _wordless_view(line)
    return seen is not None and not seen.strip()


def _is_dash(c: str) -> bool:
    return c == "-" or c == _MINUS_SIGN or unicodedata.category(c) == "Pd"


def looks_like_fence(line: str) -> bool:
    """True for ``---`` and anything a reader could take for it (see the module docstring)."""
    seen = _wordless_view(line)
    if seen is None:
        return False
    typographic = any(_is_dash(c) and c != "-" for c in seen)
    return typographic or _HYPHEN_RUN.search(seen) is not None


def _looks_like_toml_fence(line: str) -> bool:
    seen = _wordless_view(line)
    return seen is not None and _PLUS_RUN.search(seen) is not None


def _shown(line: str) -> str:
    # repr escapes what cannot be seen (\t, \xa0, \u200b, \ufeff …); a long rule of dashes is cut.
    return repr(line if len(line) <= _SHOWN_LINE_CHARS else line[:_SHOWN_LINE_CHARS] + "…")


def _delimiter_problem(line: str, lineno: int) -> tuple[int, str] | None:
    if line == "---":
        return None
    return lineno, (
        f"front matter delimiter {_shown(line)} must be exactly '---' (no other dashes, whitespace or invisible characters)"
    )


def _may_nest_or_alias(block: str, lines: int) -> bool:
    """Whether ``block`` could nest past the bound or hold an alias: every nesting level needs a
    line of its own, a bracket or a compact indicator (``- ``, ``? ``), and every alias an
    ``&``/``*`` — so the strict parse (which doubles the cost of reading front matter) runs only
    where it can find something."""
    # compact forms nest on one line: "- - - x" (sequences), "? ? x" (complex keys)
    indicators = block.count("[") + block.count("{") + block.count("- ") + block.count("? ")
    return lines + indicators > MAX_DEPTH or "&" in block or "*" in block


def split_front_matter(text: str) -> tuple[FrontMatter | None, Problems]:
    """Split normalised text into front matter and body; ``None`` with problems if refused."""
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if not _is_blank(line)), None)
    none = FrontMatter(meta={}, key_lines={}, body=text)
    if first is None:
        return none, []
    opener = lines[first]
    if _looks_like_toml_fence(opener):
        return None, [(first + 1, "TOML front matter ('+++') is not supported: use YAML between '---' lines")]
    if not looks_like_fence(opener):
        return none, []
    if first != 0:
        return None, [(first + 1, "front matter must open on line 1 (a '---' line after blank lines is ambiguous)")]
    bad = _delimiter_problem(opener, 1)
    if bad:
        return None, [bad]
    close = next((j for j in range(1, len(lines)) if looks_like_fence(lines[j])), None)
    if close is None:
        return None, [(1, "front matter opened with '---' is never closed")]
    bad = _delimiter_problem(lines[close], close + 1)
    if bad:
        return None, [bad]
    block = "\n".join(lines[1:close])
    if _may_nest_or_alias(block, close - 1):
        try:  # nesting and aliases first: PyYAML would recurse past Python's limit, or expand a bomb
            load_yaml(block, "front matter", line_offset=1)
        except StrictLoadError as exc:
            if exc.kind in (TOO_DEEP, ALIAS):
                return None, [(exc.line, f"front matter: {exc.rule}")]
    try:
        meta, key_lines = _load_yaml(block)
    except RecursionError:  # a defence in depth: the check above bounds nesting before this parse
        return None, [(1, f"front matter: nesting deeper than {MAX_DEPTH} levels")]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + _YAML_LINE_OFFSET if mark else 1
        return None, [(line, f"front matter is not valid YAML: {exc.problem or exc.context}")]
    except yaml.YAMLError as exc:
        return None, [(1, f"front matter is not valid YAML: {exc}")]
    if not isinstance(meta, dict):
        return None, [(1, "front matter must be a mapping")]
    return FrontMatter(meta=meta, key_lines=key_lines, body="\n".join(lines[close + 1 :])), []
