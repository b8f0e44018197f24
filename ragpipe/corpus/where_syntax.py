"""The text form of metadata filters (``ragpipe query --where '…'``): ``parse_where`` and ``show_where``.

It builds the same AST as the JSON form (``metadata_filter.py``)::

    filter     := and_expr ("or" and_expr)*
    and_expr   := unary ("and" unary)*
    unary      := "not"* primary
    primary    := "(" filter ")" | "exists" "(" FIELD ")"
                | FIELD op value | FIELD ["not"] "in" "(" value ("," value)* ")"
                | value ("<" | "<=") FIELD [("<" | "<=") value]        -- 2020 <= year < 2024
    op         := "=" | "!=" | "<" | "<=" | ">" | ">="
    value      := "string" (JSON escapes) | number (JSON: -1, 2.5, 1e3) | true | false

``not`` binds tighter than ``and``, ``and`` than ``or``. Keywords (``and or not in exists true false``)
are case-insensitive and reserved: a field so named is filtered in the JSON form. ``a != v`` is
``not a = v`` and ``a not in (…)`` is ``not a in (…)``, so they match documents without ``a``.
Bounds: 4096 characters, 32 levels of ``and``/``or``/``not`` as written (the JSON form's rule),
32 nested parentheses, 256 nodes; the parser recurses only on parentheses, so none of these
inputs can reach Python's recursion limit. Errors are one line naming the 1-based column.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from ragpipe.corpus.metadata import KEY_PATTERN, MAX_VALUES
from ragpipe.corpus.metadata_filter import (
    MAX_DEPTH,
    MAX_NODES,
    And,
    Eq,
    Exists,
    Filter,
    FilterError,
    In,
    Not,
    Or,
    Range,
    built,
    literal_problem,
    shown,
)

MAX_TEXT = 4096
MAX_PARENS = MAX_DEPTH  # show_where opens a parenthesis only where an and/or/not level starts
KEYWORDS = frozenset({"and", "or", "not", "in", "exists", "true", "false"})
_TOKEN = re.compile(
    r"(?P<space>\s+)|(?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)"
    r"|(?P<op><=|>=|!=|=|<|>)|(?P<punct>[(),])"
)
_RANGE_OP = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}
_RANGE_TEXT = {op: text for text, op in _RANGE_OP.items()}


@dataclass(frozen=True)
class _Token:
    kind: str  # number, string, name, keyword, op, ( ) , or end
    text: str  # as written (a keyword lower-cased)
    value: Any  # the literal of a number, string, true or false
    column: int  # 1-based

    def shown(self) -> str:
        if self.kind == "end":
            return "end of text"
        return f"'{self.text}'" if len(self.text) <= 40 else f"'{self.text[:37]}...'"


def _fail(column: int, message: str) -> NoReturn:
    raise FilterError(f"--where column {column}: {message}")


def _tokens(text: str) -> list[_Token]:
    tokens, i = [], 0
    while i < len(text):
        if text[i] == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= len(text):
                _fail(i + 1, 'unterminated string (a string ends with ")')
            try:
                value = json.loads(text[i : j + 1])
            except json.JSONDecodeError as exc:
                _fail(i + 1 + exc.pos, f"invalid string: {exc.msg}")
            tokens.append(_Token("string", text[i : j + 1], value, i + 1))
            i = j + 1
            continue
        match = _TOKEN.match(text, i)
        if match is None:
            _fail(i + 1, f"unexpected character {shown(text[i])}")
        kind, word = match.lastgroup or "", match.group()
        if kind == "number":
            value = float(word) if any(c in word for c in ".eE") else int(word)
            tokens.append(_Token("number", word, value, i + 1))
        elif kind == "name" and word.lower() in KEYWORDS:
            word = word.lower()
            tokens.append(_Token("keyword", word, {"true": True, "false": False}.get(word), i + 1))
        elif kind != "space":
            tokens.append(_Token(word if kind == "punct" else kind, word, None, i + 1))
        i = match.end()
    return [*tokens, _Token("end", "", None, len(text) + 1)]


class _Parser:
    """Recursive descent over the tokens; each grammar rule returns ``(filter, depth as written)``."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.nodes = 0

    def peek(self) -> _Token:
        return self.tokens[self.at]

    def take(self) -> _Token:
        token = self.tokens[self.at]
        self.at += token.kind != "end"
        return token

    def keyword(self, word: str) -> bool:
        token = self.peek()
        return token.kind == "keyword" and token.text == word

    def expect(self, kind: str, what: str) -> _Token:
        token = self.take()
        if token.kind != kind:
            _fail(token.column, f"expected '{kind}' {what} (got {token.shown()})")
        return token

    def node(self, token: _Token, make: type[Any], depth: int, **fields: Any) -> tuple[Filter, int]:
        """A new node (found at ``token``), counted and bounded before it is built."""
        self.nodes += 1
        if self.nodes > MAX_NODES:
            _fail(token.column, f"more than {MAX_NODES} nodes")
        if depth > MAX_DEPTH:
            _fail(token.column, f"nesting deeper than {MAX_DEPTH} levels (and, or, not)")
        return built(f"--where column {token.column}", make, **fields), depth

    def expression(self, parens: int) -> tuple[Filter, int]:
        return self.group("or", Or, lambda: self.group("and", And, lambda: self.unary(parens)))

    def group(self, word: str, make: type[Any], operand: Callable[[], tuple[Filter, int]]) -> tuple[Filter, int]:
        parts, token = [operand()], self.peek()
        while self.keyword(word):
            self.take()
            parts.append(operand())
        if len(parts) == 1:
            return parts[0]
        return self.node(token, make, 1 + max(d for _, d in parts), filters=[f for f, _ in parts])

    def unary(self, parens: int) -> tuple[Filter, int]:
        nots = []
        while self.keyword("not"):  # a loop, not recursion: `not not … x` may be thousands long
            nots.append(self.take())
        result = self.primary(parens)
        for token in reversed(nots):
            result = self.node(token, Not, result[1] + 1, filter=result[0])
        return result

    def primary(self, parens: int) -> tuple[Filter, int]:
        token = self.take()
        if token.kind == "(":
            if parens >= MAX_PARENS:
                _fail(token.column, f"more than {MAX_PARENS} nested parentheses")
            inner = self.expression(parens + 1)
            self.expect(")", f"to close the '(' at column {token.column}")
            return inner
        if token.kind == "keyword" and token.text == "exists":
            self.expect("(", "after 'exists'")
            name = self.field(self.take())
            self.expect(")", "after the field name")
            return self.node(token, Exists, 0, field=name)
        if token.kind in ("number", "string"):  # a range written value first: 2020 <= year < 2024
            low, op = self.value(token, token, bound=True), self.take()
            if op.text not in ("<", "<="):
                _fail(
                    op.column,
                    f"expected '<' or '<=' after a value that starts a range, as in 2020 <= year < 2024 (got {op.shown()})",
                )
            bounds = {"gt" if op.text == "<" else "gte": low}
            name = self.field(self.take())
            if self.peek().text in ("<", "<="):
                op = self.take()
                bounds[_RANGE_OP[op.text]] = self.value(self.take(), op, bound=True)
            return self.node(token, Range, 0, field=name, **bounds)
        if token.kind == "keyword" and token.text not in ("true", "false"):
            _fail(
                token.column,
                f"expected a field name, not the keyword {token.shown()} (a field so named needs the JSON form)",
            )
        name, op = self.field(token), self.take()
        if op.kind == "op":
            value = self.value(self.take(), op, bound=op.text in _RANGE_OP)
            if op.text in _RANGE_OP:
                return self.node(token, Range, 0, field=name, **{_RANGE_OP[op.text]: value})
            eq = self.node(token, Eq, 0, field=name, value=value)
            return eq if op.text == "=" else self.node(op, Not, 1, filter=eq[0])
        negated = op.kind == "keyword" and op.text == "not"
        if negated:
            op = self.take()
        if op.kind != "keyword" or op.text != "in":
            wanted = "'in' after 'not'" if negated else f"an operator (= != < <= > >= in) after {name!r}"
            _fail(op.column, f"expected {wanted} (got {op.shown()})")
        paren = self.expect("(", "after 'in'")
        values = [self.value(self.take(), paren)]
        while self.peek().kind == ",":
            comma = self.take()
            values.append(self.value(self.take(), comma))
            if len(values) > MAX_VALUES:
                _fail(self.peek().column, f"more than {MAX_VALUES} values in 'in'")
        self.expect(")", "to close the values of 'in'")
        found = self.node(token, In, 0, field=name, values=values)
        return self.node(op, Not, 1, filter=found[0]) if negated else found

    def field(self, token: _Token) -> str:
        if token.kind != "name":
            _fail(token.column, f"expected a field name, 'not', 'exists(' or '(' (got {token.shown()})")
        if not KEY_PATTERN.match(token.text):
            _fail(token.column, f"{token.shown()} is not a field name (at most 128 characters)")
        return token.text

    def value(self, token: _Token, after: _Token, *, bound: bool = False) -> Any:
        if token.kind not in ("number", "string") and not (token.kind == "keyword" and token.text in ("true", "false")):
            _fail(token.column, f"expected a value after '{after.text}' (got {token.shown()})")
        if bound and isinstance(token.value, bool):
            _fail(token.column, f"expected a number or a quoted date after '{after.text}' (got {token.shown()})")
        problem = literal_problem(token.value, bound=bound)
        if problem:
            _fail(token.column, problem)
        return token.value


def parse_where(text: str) -> Filter:
    """The filter a ``--where`` text states; a ``FilterError`` naming the column of the first problem."""
    if len(text) > MAX_TEXT:
        raise FilterError(f"--where: {len(text)} characters (limit {MAX_TEXT})")
    parser = _Parser(text)
    found, _ = parser.expression(0)
    token = parser.peek()
    if token.kind != "end":
        _fail(token.column, f"expected 'and', 'or' or end of text (got {token.shown()})")
    return found


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # true/false, JSON numbers, JSON strings: what the tokenizer reads


def _name(field: str) -> str:
    if field.lower() in KEYWORDS:
        raise FilterError(f"field {field!r} is a keyword of the --where syntax; write this filter in the JSON form")
    return field


def show_where(f: Filter) -> str:
    """The text form of ``f``: ``parse_where(show_where(f)) == f``, with the fewest parentheses. A field
    named like a keyword raises ``FilterError``; a large filter may show longer than ``MAX_TEXT``."""
    if isinstance(f, Or):  # an and binds tighter, and normal form has no or directly inside an or
        return " or ".join(show_where(c) for c in f.filters)
    if isinstance(f, And):
        return " and ".join(f"({show_where(c)})" if isinstance(c, Or) else show_where(c) for c in f.filters)
    if isinstance(f, Not):
        if isinstance(f.filter, Eq):
            return f"{_name(f.filter.field)} != {_value(f.filter.value)}"
        if isinstance(f.filter, In):
            return f"{_name(f.filter.field)} not in ({', '.join(map(_value, f.filter.values))})"
        return f"not ({show_where(f.filter)})" if isinstance(f.filter, And | Or) else f"not {show_where(f.filter)}"
    if isinstance(f, Eq):
        return f"{_name(f.field)} = {_value(f.value)}"
    if isinstance(f, In):
        return f"{_name(f.field)} in ({', '.join(map(_value, f.values))})"
    if isinstance(f, Exists):
        return f"exists({_name(f.field)})"
    bounds = dict(f.bounds())
    if len(bounds) == 2:
        low, high = ("gt" if "gt" in bounds else "gte"), ("lt" if "lt" in bounds else "lte")
        written = {"gt": "<", "gte": "<=", "lt": "<", "lte": "<="}  # value first: low < field < high
        return f"{_value(bounds[low])} {written[low]} {_name(f.field)} {written[high]} {_value(bounds[high])}"
    ((op, value),) = bounds.items()
    return f"{_name(f.field)} {_RANGE_TEXT[op]} {_value(value)}"
