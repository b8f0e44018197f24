"""The metadata filter language: one immutable AST, its JSON form, checking against a corpus, evaluation.

A filter is one of (JSON form, as HTTP bodies, MCP tools and suite cases carry it):

- ``{"field": f, "eq": v}``; ``{"field": f, "in": [v, …]}`` (1 to 1024 values);
- ``{"field": f, "gte": a, "lt": b}``: a range, any of ``gt``/``gte``/``lt``/``lte``, at most one
  lower and one upper bound; bounds are numbers or date/datetime text;
- ``{"field": f, "exists": true}`` (or ``false``);
- ``{"and": [f, …]}``, ``{"or": [f, …]}`` (non-empty), ``{"not": f}``.

A node has exactly one shape; an unknown key, an extra key or a value of the wrong type is a
``FilterError`` naming its path (``filter.and[1].gte: …``). A filter nests at most 32 levels of
``and``/``or``/``not`` and holds at most 256 nodes: the parsers count them as written, before
recursing, and the models again in normal form, so no filter, however it was built, can make a
recursive walk hit Python's recursion limit. The text form (``--where``) is in ``where_syntax.py``;
both forms build the same AST (``Filter``, a union ``isinstance`` takes).

Normal form (one form per meaning where that is cheap; the models apply it, so every ``Filter``
is normal): an ``and`` inside an ``and`` (``or`` inside ``or``) is merged into it; an ``and``/``or``
of one filter is read as that filter (the models refuse one of one); ``exists: false`` is ``not exists``; ``in`` values are sorted and
deduplicated, but stay ``in`` (one value is not rewritten to ``eq``); a number with an integral
value is that integer (``2.0`` is ``2``, as RFC 8785 writes it); ``not not x`` stays as written.

Semantics (``matches``, the reference, and ``DocumentMatcher.mask`` agree, and tests hold them to
it): ``source_role`` is a ``string`` field of every document. A comparison on a field a document
lacks is false, and so is ``exists``. ``not`` is plain negation, so ``not category = "faq"`` (and
``category != "faq"``) matches documents without ``category``. A list field matches when any
element does. Values compare in the form ``comparable`` gives: integer and number as one numeric
family (``2 = 2.0``), dates and datetimes as normalised ISO text. A literal of a type the field does
not hold matches nothing; ``check_filter`` turns that, and every other mistake, into an error.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import math
import operator
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
from pydantic import (
    AfterValidator,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ragpipe.corpus.metadata import KEY_PATTERN, MAX_STRING_CHARS, MAX_VALUES, Metadata, MetadataValue, Scalar
from ragpipe.corpus.rules import escape_controls, string_problem
from ragpipe.kernel.models import FrozenModel

MAX_DEPTH = 32
MAX_NODES = 256
MAX_INTEGER = 2**53 - 1
ROLE_FIELD = "source_role"
BOUNDS = ("gt", "gte", "lt", "lte")
_ORDERED = frozenset({"number", "date", "datetime"})  # families a range applies to
_COMPARE = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}
_FIELD_RULE = "a letter or _, then letters, digits, _ . -; at most 128"


class FilterError(ValueError):
    """A filter that cannot be read, or does not fit the corpus. The message is one line."""


def shown(value: object) -> str:
    """A value as a one-line message shows it: JSON for a scalar (cut at 40 characters), a kind otherwise
    (never the whole of a container, which may be huge or deep)."""
    if value is None or isinstance(value, bool | int | float | str):
        text = escape_controls(json.dumps(value, ensure_ascii=False))
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, list | tuple | Mapping) and not value:
        return "{}" if isinstance(value, Mapping) else "[]"
    if isinstance(value, list | tuple):
        return "a list"
    return "an object" if isinstance(value, Mapping) else f"a {type(value).__name__}"


def literal_problem(value: object, *, bound: bool = False) -> str | None:
    """Why ``value`` cannot be a literal (a range bound when ``bound``: no booleans), or None."""
    wanted = "a number or a date/datetime text" if bound else "a string, number or boolean"
    if isinstance(value, bool):
        return f"expected {wanted}, got {shown(value)}" if bound else None
    if isinstance(value, int):
        return None if abs(value) <= MAX_INTEGER else f"integer {shown(value)} is outside ±(2^53-1)"
    if isinstance(value, float):
        if not math.isfinite(value):
            return f"{value!r} is not a finite number"
        if (
            value.is_integer() and abs(value) > MAX_INTEGER
        ):  # no canonical JSON form (RFC 8785 reads it back as an integer)
            return f"number {value!r} is an integer outside ±(2^53-1)"
        return None
    if isinstance(value, str):
        if len(value) > MAX_STRING_CHARS:
            return f"string of {len(value)} characters (limit {MAX_STRING_CHARS})"
        return string_problem(value, "value")
    return f"expected {wanted}, got {shown(value)}"


def _literal(value: Any) -> Any:
    problem = literal_problem(value)
    if problem:
        raise ValueError(problem)
    if isinstance(value, str):  # stored metadata is NFC: an NFD literal would never match, and has no canonical form
        return unicodedata.normalize("NFC", value)
    # An integral float is its integer: RFC 8785 writes 2.0 as 2, and the canonical JSON must read back equal.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _field_name(name: str) -> str:
    if not KEY_PATTERN.match(name):
        raise ValueError(f"{shown(name)} is not a field name ({_FIELD_RULE})")
    return name


Value = Annotated[StrictBool | StrictInt | StrictFloat | StrictStr, AfterValidator(_literal)]
Bound = Annotated[StrictInt | StrictFloat | StrictStr, AfterValidator(_literal)]
FieldName = Annotated[StrictStr, AfterValidator(_field_name)]


class _Node(FrozenModel):
    # Nesting and size, measured once at construction from the children's (so always bounded).
    _depth: int = PrivateAttr(default=0)
    _size: int = PrivateAttr(default=1)


class Eq(_Node):
    field: FieldName
    value: Value


class In(_Node):
    field: FieldName
    values: tuple[Value, ...]

    @field_validator("values")
    @classmethod
    def _normal(cls, values: tuple[Scalar, ...]) -> tuple[Scalar, ...]:
        if not 1 <= len(values) <= MAX_VALUES:
            raise ValueError(f"'in' takes 1 to {MAX_VALUES} values, got {len(values)}")

        def key(v: Scalar) -> tuple[int, Scalar]:  # booleans, then numbers, then strings, each in order
            return {bool: 0, int: 1, float: 1, str: 2}[type(v)], v

        ordered = sorted(values, key=key)
        return tuple(v for i, v in enumerate(ordered) if i == 0 or key(v) != key(ordered[i - 1]))


class Range(_Node):
    field: FieldName
    gt: Bound | None = None
    gte: Bound | None = None
    lt: Bound | None = None
    lte: Bound | None = None

    @model_validator(mode="after")
    def _one_each(self) -> Range:
        if self.gt is not None and self.gte is not None or self.lt is not None and self.lte is not None:
            raise ValueError("a range has at most one lower bound (gt, gte) and one upper bound (lt, lte)")
        if not self.bounds():
            raise ValueError("a range needs a bound (gt, gte, lt or lte)")
        return self

    def bounds(self) -> list[tuple[str, int | float | str]]:
        """The bounds given, as ``(operator, value)`` in the order gt, gte, lt, lte."""
        return [(op, getattr(self, op)) for op in BOUNDS if getattr(self, op) is not None]


class Exists(_Node):
    field: FieldName


def _measured(node: _Node, children: Sequence[_Node]) -> None:
    node._depth = 1 + max(c._depth for c in children)
    node._size = 1 + sum(c._size for c in children)
    if node._depth > MAX_DEPTH:
        raise ValueError(f"nesting deeper than {MAX_DEPTH} levels (and, or, not)")
    if node._size > MAX_NODES:
        raise ValueError(f"more than {MAX_NODES} nodes")


class Not(_Node):
    filter: Filter

    @model_validator(mode="after")
    def _measure(self) -> Not:
        _measured(self, [self.filter])
        return self


class _Group(_Node):
    filters: tuple[Filter, ...]

    @field_validator("filters")
    @classmethod
    def _flat(cls, filters: tuple[Filter, ...]) -> tuple[Filter, ...]:
        flat = [g for f in filters for g in (f.filters if type(f) is cls else (f,))]  # type: ignore[union-attr]
        if len(flat) < 2:
            raise ValueError(f"'{cls.__name__.lower()}' of {len(flat)} filters (one filter is written alone)")
        return tuple(flat)

    @model_validator(mode="after")
    def _measure(self) -> _Group:
        _measured(self, self.filters)
        return self


class And(_Group):
    """All of ``filters``."""


class Or(_Group):
    """Any of ``filters``."""


Filter = Eq | In | Range | Exists | Not | And | Or
for _model in (Not, _Group, And, Or):
    _model.model_rebuild()


def built(path: str, make: type[_Node], **fields: Any) -> Any:
    """``make(**fields)``, a refusal raised as a ``FilterError`` at ``path`` (the parsers check first;
    this turns what only the models see, such as a depth that normal form adds, into the same error)."""
    try:
        return make(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise FilterError(f"{path}: {error.get('ctx', {}).get('error', error['msg'])}") from None


def parse_filter(value: object) -> Filter:
    """The filter of a decoded JSON value; a ``FilterError`` naming the path of the first problem."""
    return _parse(value, "filter", 0, [0])


def _parse(value: object, path: str, depth: int, count: list[int]) -> Filter:
    if not isinstance(value, Mapping):
        raise FilterError(f"{path}: expected a filter object, got {shown(value)}")
    count[0] += 1
    if count[0] > MAX_NODES:
        raise FilterError(f"{path}: more than {MAX_NODES} nodes")
    for key in value:
        if key not in ("field", "eq", "in", "exists", "and", "or", "not", *BOUNDS):
            raise FilterError(
                f"{path}: unknown key {shown(key)} (a filter node has 'and', 'or', 'not', "
                "or 'field' with one of eq, in, exists, gt, gte, lt, lte)"
            )
    shapes = [k for k in value if k in ("eq", "in", "exists", "and", "or", "not")]
    shapes += [k for k in BOUNDS if k in value][:1]  # the bounds of a range are one shape
    if len(shapes) > 1:
        raise FilterError(
            f"{path}: {len(shapes)} shapes in one node ({', '.join(map(repr, shapes))}); a node has exactly one"
        )
    if not shapes:
        raise FilterError(
            f"{path}: 'field' without an operator (eq, in, exists, gt, gte, lt, lte)"
            if "field" in value
            else f"{path}: empty filter node (expected 'and', 'or', 'not', or 'field' with an operator)"
        )
    shape = shapes[0]
    if shape in ("and", "or", "not"):
        if "field" in value:
            raise FilterError(f"{path}: 'field' does not belong in a {shape!r} node")
        if depth >= MAX_DEPTH:  # before recursing: the input may nest thousands deep
            raise FilterError(f"{path}: nesting deeper than {MAX_DEPTH} levels (and, or, not)")
        if shape == "not":
            return built(path, Not, filter=_parse(value["not"], f"{path}.not", depth + 1, count))
        items = value[shape]
        if not isinstance(items, list | tuple) or not items:
            raise FilterError(f"{path}.{shape}: expected a non-empty list of filters, got {shown(items)}")
        children = [_parse(item, f"{path}.{shape}[{i}]", depth + 1, count) for i, item in enumerate(items)]
        return children[0] if len(children) == 1 else built(path, And if shape == "and" else Or, filters=children)
    if "field" not in value:
        raise FilterError(f"{path}: missing 'field' (the metadata field the {shape!r} compares)")
    field = value["field"]
    if not isinstance(field, str) or not KEY_PATTERN.match(field):
        raise FilterError(f"{path}.field: expected a field name ({_FIELD_RULE}), got {shown(field)}")
    if shape == "exists":
        if not isinstance(value["exists"], bool):
            raise FilterError(f"{path}.exists: expected true or false, got {shown(value['exists'])}")
        exists = built(path, Exists, field=field)
        return exists if value["exists"] else built(path, Not, filter=exists)
    if shape == "eq":
        return built(path, Eq, field=field, value=_json_literal(value["eq"], f"{path}.eq"))
    if shape == "in":
        items = value["in"]
        if not isinstance(items, list | tuple) or not items:
            raise FilterError(f"{path}.in: expected a non-empty list of values, got {shown(items)}")
        if len(items) > MAX_VALUES:
            raise FilterError(f"{path}.in: {len(items)} values (limit {MAX_VALUES})")
        return built(path, In, field=field, values=[_json_literal(v, f"{path}.in[{i}]") for i, v in enumerate(items)])
    bounds = {op: _json_literal(value[op], f"{path}.{op}", bound=True) for op in BOUNDS if op in value}
    for a, b, side in (("gt", "gte", "lower"), ("lt", "lte", "upper")):
        if a in bounds and b in bounds:
            raise FilterError(f"{path}: both {a!r} and {b!r} (a range has at most one {side} bound)")
    return built(path, Range, field=field, **bounds)


def _json_literal(value: object, path: str, *, bound: bool = False) -> Any:
    problem = literal_problem(value, bound=bound)
    if problem:
        raise FilterError(f"{path}: {problem}")
    return value


def filter_json(f: Filter) -> dict[str, Any]:
    """The canonical JSON form: ``parse_filter(filter_json(f)) == f``; equal filters give equal JSON."""
    if isinstance(f, Not):
        if isinstance(f.filter, Exists):
            return {"field": f.filter.field, "exists": False}
        return {"not": filter_json(f.filter)}
    if isinstance(f, And | Or):
        return {"and" if isinstance(f, And) else "or": [filter_json(c) for c in f.filters]}
    if isinstance(f, Eq):
        return {"field": f.field, "eq": f.value}
    if isinstance(f, In):
        return {"field": f.field, "in": list(f.values)}
    if isinstance(f, Range):
        return {"field": f.field, **dict(f.bounds())}
    return {"field": f.field, "exists": True}


def _family(type_name: str) -> str:
    """``integer``/``number`` (and their lists) are the numeric family ``number``; a list is its element type."""
    if type_name.startswith("list<"):
        type_name = type_name[5:-1]
    return "number" if type_name == "integer" else type_name


def comparable(value: Scalar, field_type: str) -> str | float | bool | None:
    """The form in which ``value`` compares with values of a field of ``field_type`` (a type name such
    as ``integer`` or ``list<date>``), or None when it cannot equal or order against them. Literals and
    stored values both go through it, so evaluation compares like with like:

    - integer and number: the float (``2 == 2.0``; exact within ±2^53); string, boolean: the value;
    - date: the ISO text of ``datetime.date.fromisoformat`` (``20240501`` is ``2024-05-01``);
    - datetime: ``datetime.datetime.fromisoformat``; an aware one in UTC with ``Z`` as metadata.py
      writes it, a naive one as is, both with microseconds always written (so that text order is time
      order even when seconds have fractions: ``…:00Z`` sorts after ``…:00.5Z`` in metadata.py's text).
      Naive and aware datetimes compare as this text: never equal, ordered by wall-clock reading.
    """
    family = _family(field_type)
    if isinstance(value, bool):
        return value if family == "boolean" else None
    if isinstance(value, int | float):
        return float(value) if family == "number" else None
    if family == "string":
        return value
    try:
        if family == "date":
            return dt.date.fromisoformat(value).isoformat()
        if family == "datetime":
            moment = dt.datetime.fromisoformat(value)
            if moment.tzinfo is None:
                return moment.isoformat(timespec="microseconds")
            utc = moment.astimezone(dt.UTC).replace(tzinfo=None)
            return utc.isoformat(timespec="microseconds") + "Z"
    except (ValueError, OverflowError):
        return None
    return None


class FieldFact(FrozenModel):
    """What a corpus holds in one field: document counts per type name (``integer``, ``list<string>``)
    and the number of documents that have the field."""

    types: dict[str, int]
    documents: int


def _with_role(metadata: Metadata, role: str, roles: dict[str, MetadataValue]) -> Mapping[str, MetadataValue]:
    if role not in roles:  # few distinct roles: one value each, not one per document
        roles[role] = MetadataValue(type="string", values=(role,))
    return {**metadata, ROLE_FIELD: roles[role]}


def _documents(metas: Sequence[Metadata], roles: Sequence[str]) -> list[Mapping[str, MetadataValue]]:
    if len(metas) != len(roles):
        raise ValueError(f"{len(metas)} metadata records but {len(roles)} source roles")
    cache: dict[str, MetadataValue] = {}
    return [_with_role(meta, role, cache) for meta, role in zip(metas, roles)]


def field_catalog(metas: Sequence[Metadata], roles: Sequence[str]) -> dict[str, FieldFact]:
    """Every filterable field of a corpus (``source_role`` included), with its types and counts."""
    counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for document in _documents(metas, roles):
        for name, stored in document.items():
            counts[name][stored.type_name()] += 1
    return {k: FieldFact(types=dict(sorted(c.items())), documents=c.total()) for k, c in sorted(counts.items())}


def _leaves(f: Filter) -> list[Eq | In | Range | Exists]:
    leaves, stack = [], [f]
    while stack:
        node = stack.pop()
        if isinstance(node, Not):
            stack.append(node.filter)
        elif isinstance(node, And | Or):
            stack.extend(reversed(node.filters))
        else:
            leaves.append(node)
    return leaves


def _literals(leaf: Eq | In | Range) -> list[Scalar]:
    if isinstance(leaf, Eq):
        return [leaf.value]
    return list(leaf.values) if isinstance(leaf, In) else [v for _, v in leaf.bounds()]


def _kind(value: Scalar) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}[type(value)]


def check_filter(f: Filter, catalog: Mapping[str, FieldFact]) -> None:
    """Refuse (``FilterError``) a filter that cannot mean what its writer meant on this corpus: an
    unknown field; a comparison on a field whose documents hold different type families; a literal of
    another type than the field's (a list<T> field takes T literals); a date/datetime literal that does
    not parse; a range on a string or boolean field. ``exists`` takes any known field."""
    for leaf in _leaves(f):
        name = leaf.field
        fact = catalog.get(name)
        if fact is None:
            close = difflib.get_close_matches(name, list(catalog), n=1)
            known = sorted(catalog)
            listed = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise FilterError(f"filter field {name!r} is not in this corpus{hint} (known fields: {listed or 'none'})")
        if isinstance(leaf, Exists):
            continue
        families = {_family(t) for t in fact.types}
        if len(families) > 1:
            counts = ", ".join(
                f"{t} in {n} document{'s' * (n != 1)}"
                for t, n in sorted(fact.types.items(), key=lambda tn: (-tn[1], tn[0]))
            )
            raise FilterError(
                f"filter field {name!r} holds values of different types ({counts}); comparisons on it are refused"
            )
        family, held = families.pop(), " and ".join(sorted(fact.types))
        if isinstance(leaf, Range) and family not in _ORDERED:
            op = leaf.bounds()[0][0]
            raise FilterError(
                f"filter field {name!r} holds {held} values; a range ({op}) needs integer, number, date or datetime values"
            )
        for literal in _literals(leaf):
            if comparable(literal, family) is None:
                if isinstance(literal, str) and family in ("date", "datetime"):
                    form = "YYYY-MM-DD" if family == "date" else "ISO 8601, like 2024-05-01T10:00:00Z"
                    raise FilterError(
                        f"filter field {name!r} holds {held} values; {shown(literal)} is not a {family} ({form})"
                    )
                raise FilterError(f"filter field {name!r} holds {held} values; {shown(literal)} is {_kind(literal)}")


def matches(f: Filter, metadata: Metadata, role: str) -> bool:
    """Whether one document (its metadata and source role) matches ``f``: the reference evaluation,
    written to be obviously right; ``DocumentMatcher`` is the fast one and must agree with it."""
    return _holds(f, _with_role(metadata, role, {}))


def _holds(f: Filter, document: Mapping[str, MetadataValue]) -> bool:
    if isinstance(f, Not):
        return not _holds(f.filter, document)
    if isinstance(f, And):
        return all(_holds(c, document) for c in f.filters)
    if isinstance(f, Or):
        return any(_holds(c, document) for c in f.filters)
    stored = document.get(f.field)
    if stored is None:
        return False
    if isinstance(f, Exists):
        return True
    values = [c for c in (comparable(v, stored.type) for v in stored.values) if c is not None]
    if isinstance(f, Eq | In):
        wanted = {comparable(v, stored.type) for v in _literals(f)} - {None}
        return any(v in wanted for v in values)
    bounds = [(op, comparable(v, stored.type)) for op, v in f.bounds()]
    if _family(stored.type) not in _ORDERED or any(b is None for _, b in bounds):
        return False
    return any(all(_COMPARE[op](v, b) for op, b in bounds) for v in values)


class DocumentMatcher:
    """Filters over one bundle's documents (in their fixed order), built once: ``mask(f)`` is the
    boolean array of the documents ``matches(f, …)`` accepts. Per field and type family it keeps where
    each value occurs (eq, in), the values sorted with their documents (ranges, by binary search) and
    which documents have the field (exists); a filter costs its leaves' lookups, no loop over documents."""

    def __init__(self, metas: Sequence[Metadata], roles: Sequence[str]) -> None:
        documents = _documents(metas, roles)
        self.size = len(documents)
        present: defaultdict[str, list[int]] = defaultdict(list)
        entries: defaultdict[tuple[str, str], list[tuple[Any, int]]] = defaultdict(list)
        forms: dict[tuple[str, type, Scalar], Any] = {}  # values repeat across documents: parse each once
        for position, document in enumerate(documents):
            for name, stored in document.items():
                present[name].append(position)
                family = "number" if stored.type == "integer" else stored.type
                bucket = entries[name, family]
                for v in stored.values:
                    key = (family, type(v), v)
                    form = forms[key] if key in forms else forms.setdefault(key, comparable(v, family))
                    if form is not None:  # a stored value that does not parse as its type (a hand-made record)
                        bucket.append((form, position))
        self._present = {name: np.array(p, dtype=np.int64) for name, p in present.items()}
        self._families: defaultdict[str, list[str]] = defaultdict(list)
        self._where: dict[tuple[str, str], dict[Any, npt.NDArray[np.int64]]] = {}
        self._sorted: dict[tuple[str, str], tuple[np.ndarray, npt.NDArray[np.int64]]] = {}
        for (name, family), pairs in entries.items():
            self._families[name].append(family)
            grouped: defaultdict[Any, list[int]] = defaultdict(list)
            for value, position in pairs:
                grouped[value].append(position)
            self._where[name, family] = {v: np.array(p, dtype=np.int64) for v, p in grouped.items()}
            if family in _ORDERED:
                keys = np.array([v for v, _ in pairs], dtype=np.float64 if family == "number" else np.str_)
                order = np.argsort(keys, kind="stable")
                self._sorted[name, family] = (keys[order], np.array([p for _, p in pairs], dtype=np.int64)[order])

    def mask(self, f: Filter) -> npt.NDArray[np.bool_]:
        """One boolean per document, in document order: whether it matches ``f``."""
        if isinstance(f, Not):
            return ~self.mask(f.filter)
        if isinstance(f, And | Or):
            out = self.mask(f.filters[0])
            for child in f.filters[1:]:
                out = out & self.mask(child) if isinstance(f, And) else out | self.mask(child)
            return out
        out = np.zeros(self.size, dtype=bool)
        if isinstance(f, Exists):
            out[self._present.get(f.field, np.zeros(0, dtype=np.int64))] = True
            return out
        for family in self._families.get(f.field, ()):
            if isinstance(f, Eq | In):
                where = self._where[f.field, family]
                for literal in _literals(f):
                    positions = where.get(comparable(literal, family))
                    if positions is not None:
                        out[positions] = True
            elif family in _ORDERED:
                keys, positions = self._sorted[f.field, family]
                low, high = 0, len(keys)
                for op, literal in f.bounds():
                    bound = comparable(literal, family)
                    if bound is None:
                        low, high = 0, 0
                        break
                    if op in ("gt", "gte"):
                        low = max(low, int(np.searchsorted(keys, bound, side="right" if op == "gt" else "left")))
                    else:
                        high = min(high, int(np.searchsorted(keys, bound, side="left" if op == "lt" else "right")))
                out[positions[low:high]] = True
        return out
