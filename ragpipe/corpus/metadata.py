"""Typed document metadata: what a team's front matter or BEIR ``metadata`` says about a document.

Every key a source gives beside the core fields (``title``, ``access_scopes``, ``source_role``)
is kept as one ``MetadataValue``: a type (``string``, ``integer``, ``number``, ``boolean``,
``date``, ``datetime``), whether it is a list, and its values. Rules, the same for every format:

- a nested mapping is flattened into dotted keys (``params.weight``), as search engines index it;
- ``null`` and an empty list are *absent* (a filter's ``exists`` is false for them), not kept;
- a YAML date is ``date`` as ISO text (``2024-05-01``); a YAML timestamp is ``datetime`` as ISO
  text, one with a time zone converted to UTC (``2024-05-01T10:00:00Z``; filters compare
  datetimes as times, ``ragpipe.corpus.metadata_filter.comparable``); a string that merely looks like a date stays a ``string``;
- a list must hold scalars of one type (integers and floats together are ``number``);
- a key must be a field name (``KEY_PATTERN``) and must not name a core field.

A value no rule covers (a list of mappings, a list mixing types, a key that is not a field name)
is not kept and is listed with its reason in ``not_kept``; a value that breaks a bound (string
length, list length, keys per document) or is not finite is a problem: the corpus is refused.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ragpipe.corpus.rules import string_problem
from ragpipe.kernel.canonical import CanonicalEncodingError, canonical_bytes

FieldType = Literal["string", "integer", "number", "boolean", "date", "datetime"]
Scalar = str | int | float | bool

SECURITY_KEYS = ("access_scopes", "source_role")
_NOT_ALNUM = re.compile(r"[\W_]+")
_SHOWN_KEY_CHARS = 60
KEY_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}\Z")
CORE_FIELDS = frozenset({"title", "text", "document_id", "access_scopes", "source_role"})
MAX_KEYS = 256
MAX_VALUES = 1024
MAX_STRING_CHARS = 8192


class MetadataValue(BaseModel):
    """One metadata field of one document. ``values`` holds one value unless ``many``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    type: FieldType
    many: bool = False
    values: tuple[Scalar, ...]

    @model_validator(mode="after")
    def _consistent(self) -> MetadataValue:
        """One value unless ``many``, at least one, each of the declared type (a date as ISO
        text): what a source can produce, so a rewritten table fails here, never in a query."""
        if not self.values or (not self.many and len(self.values) != 1):
            raise ValueError(f"{len(self.values)} value(s) for a {'list' if self.many else 'single'} {self.type}")
        check = _TYPE_CHECKS[self.type]
        bad = next((v for v in self.values if not check(v)), None)
        if bad is not None:
            raise ValueError(f"{bad!r} is not a {self.type} value")
        return self

    def as_json(self) -> Any:
        """The value as JSON shows it: a scalar, or a list when ``many``."""
        return list(self.values) if self.many else self.values[0]

    def type_name(self) -> str:
        return f"list<{self.type}>" if self.many else self.type


Metadata = dict[str, MetadataValue]


def _iso(parse: Callable[[str], Any]) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        try:
            parse(value.removesuffix("Z"))
        except (AttributeError, TypeError, ValueError):
            return False
        return True

    return check


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, float),
    "boolean": lambda v: isinstance(v, bool),
    "date": lambda v: isinstance(v, str) and _iso(dt.date.fromisoformat)(v),
    "datetime": lambda v: isinstance(v, str) and _iso(dt.datetime.fromisoformat)(v),
}


def _scalar(value: Any) -> tuple[FieldType, Scalar] | None:
    """The type and stored form of a scalar, or None when ``value`` is not one."""
    if isinstance(value, bool):
        return "boolean", value
    if isinstance(value, int):
        return "integer", value
    if isinstance(value, float):
        return "number", value
    if isinstance(value, str):
        # escapes in YAML or JSON can spell a string that is not NFC; stored text is NFC
        return "string", unicodedata.normalize("NFC", value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
            return "datetime", value.isoformat() + "Z"
        return "datetime", value.isoformat()
    if isinstance(value, dt.date):
        return "date", value.isoformat()
    return None


def _checked(scalar: Scalar, where: str, problems: list[str]) -> bool:
    """Whether ``scalar`` can be stored: the canonical encoder's number rules (finite; integers,
    and floats that print as integers, within ±(2^53−1)), strings valid Unicode within the bound."""
    if isinstance(scalar, str):
        bad = string_problem(scalar, "value")
        if bad:
            problems.append(f"{where}: {bad}")
            return False
        if len(scalar) > MAX_STRING_CHARS:
            problems.append(f"{where}: string of {len(scalar)} characters (limit {MAX_STRING_CHARS})")
            return False
        return True
    if isinstance(scalar, float) and not math.isfinite(scalar):
        problems.append(f"{where}: non-finite number {scalar!r} (metadata numbers must be finite)")
        return False
    try:
        canonical_bytes(scalar)
    except CanonicalEncodingError as exc:
        problems.append(f"{where}: {str(exc).removeprefix('$: ')}")
        return False
    return True


def _typed(value: Any, where: str, problems: list[str]) -> MetadataValue | str | None:
    """A kept value, a reason it is not kept (str), or None (absent, or a problem was added)."""
    if value is None:
        return None
    if isinstance(value, list):
        if not value:
            return None
        if len(value) > MAX_VALUES:
            problems.append(f"{where}: list of {len(value)} values (limit {MAX_VALUES})")
            return None
        typed = [_scalar(v) for v in value]
        if any(t is None for t in typed):
            return "a list holding mappings or lists (metadata lists hold scalars)"
        types = {t for t, _ in typed}  # type: ignore[misc]
        if types == {"integer", "number"}:
            types = {"number"}
        if len(types) != 1:
            return f"a list mixing {', '.join(sorted(types))} (metadata lists hold one type)"
        values = tuple(v for _, v in typed)  # type: ignore[misc]
        if not all(_checked(v, where, problems) for v in values):
            return None
        kind = types.pop()
        if kind == "number":
            values = tuple(float(v) for v in values)
        return MetadataValue(type=kind, many=True, values=values)
    typed_scalar = _scalar(value)
    if typed_scalar is None:
        return f"a value of type {type(value).__name__} (metadata holds scalars and lists of scalars)"
    kind, scalar = typed_scalar
    if not _checked(scalar, where, problems):
        return None
    return MetadataValue(type=kind, values=(scalar,))


def _key_skeleton(key: str) -> str:
    """The part of a key that a typo, a case or separator change or a plural does not touch."""
    return _NOT_ALNUM.sub("", unicodedata.normalize("NFKC", key).casefold()).removesuffix("s")


# ``scopes`` alone reads as the audience too: kept as metadata it would publish the document under
# the default scope while its author meant to restrict it.
_INTENDED = {_key_skeleton(key): key for key in SECURITY_KEYS} | {"scope": "access_scopes"}


def near_miss_problems(keys: Iterable[Any], where: Callable[[str], str]) -> list[str]:
    """One problem per key that is a *near miss* of a security key: it differs from
    ``access_scopes``/``source_role`` but equals it, or ``scope``, after NFKC, case-folding,
    removing every character that is not a letter or digit and dropping one trailing ``s``. Such a key is refused,
    never kept as metadata: keeping ``Access_Scopes`` would publish the document under the default
    (usually widest) scope. ``where(key)`` locates the key."""
    problems = []
    for key in keys:
        if not isinstance(key, str):
            continue
        intended = _INTENDED.get(_key_skeleton(key))
        if intended is not None and key != intended:
            shown = repr(key if len(key) <= _SHOWN_KEY_CHARS else key[:_SHOWN_KEY_CHARS] + "…")
            problems.append(
                f"{where(key)}: metadata key {shown} must be spelt exactly {intended!r} "
                "(a misspelt security key is refused, never kept as metadata)"
            )
    return problems


def _nested_near_miss(key: str, located: str) -> str | None:
    """A flattened key that is a near miss of a security key, as a whole (``access.scopes``) or by
    its last part (``permissions.scope``): nesting must not get round the rule."""
    parts = [key, key.rsplit(".", 1)[-1]] if "." in key else [key]
    for part in parts:
        found = near_miss_problems([part], lambda _key: located)
        if found:
            return found[0].replace(f"metadata key {part!r}", f"metadata key {key!r}")
    return None


def _flatten(raw: Mapping[Any, Any], prefix: str = "") -> list[tuple[Any, Any]]:
    items: list[tuple[Any, Any]] = []
    for key, value in raw.items():
        name = f"{prefix}{key}" if prefix or isinstance(key, str) else key
        if isinstance(value, Mapping) and value:
            items += _flatten(value, f"{name}.")
        else:
            items.append((name, value))
    return items


def typed_metadata(
    raw: Mapping[Any, Any], where: Callable[[str], str], problems: list[str]
) -> tuple[Metadata, list[tuple[str, str]]]:
    """Typed metadata from a source's raw mapping (core fields already taken out), and the keys not
    kept with their reasons. ``where(key)`` locates a key for problems (``file:line [id=…]``)."""
    kept: Metadata = {}
    not_kept: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, value in _flatten(raw):
        if not isinstance(key, str):
            not_kept.append((str(key), f"key of type {type(key).__name__} is not a field name"))
            continue
        key = unicodedata.normalize("NFC", key)
        located = where(key.split(".")[0])
        refused = _nested_near_miss(key, located)
        if refused:
            problems.append(refused)
            continue
        if key in seen:  # a.b written both flat and nested, or two keys equal after NFC
            problems.append(f"{located}: metadata key {key!r} is given twice (flat and nested, or equal after NFC)")
            continue
        seen.add(key)
        if not KEY_PATTERN.match(key):
            not_kept.append((key, "not a field name (a letter or _, then letters, digits, _ . -; at most 128)"))
            continue
        if key in CORE_FIELDS:
            not_kept.append((key, "names a core field"))
            continue
        typed = _typed(value, f"{located}: metadata {key!r}", problems)
        if isinstance(typed, str):
            not_kept.append((key, typed))
        elif typed is not None:
            kept[key] = typed
    if len(kept) > MAX_KEYS:
        problems.append(f"{where('')}: {len(kept)} metadata keys (limit {MAX_KEYS})")
    return dict(sorted(kept.items())), not_kept


def metadata_json(metadata: Metadata) -> dict[str, Any]:
    """The canonical, typed form stored and digested: ``{key: [type, many, [values…]]}``."""
    return {k: [v.type, v.many, list(v.values)] for k, v in sorted(metadata.items())}


def metadata_from_json(value: Mapping[str, Any]) -> Metadata:
    """Inverse of ``metadata_json`` (validated: a tampered table fails here, never later). Canonical
    JSON writes ``2.0`` as ``2``: a ``number`` field's values are floats again."""
    out: Metadata = {}
    for key, (kind, many, values) in value.items():
        if not KEY_PATTERN.match(key) or key in CORE_FIELDS:
            raise ValueError(f"metadata key {key!r} is not a field name a source can give")
        numbers = kind == "number" and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        out[key] = MetadataValue(
            type=kind, many=many, values=tuple(float(v) for v in values) if numbers else tuple(values)
        )
    return out


def shown_metadata(metadata: Metadata) -> dict[str, Any]:
    """Metadata as hits show it: ``{key: value or [values]}``."""
    return {k: v.as_json() for k, v in sorted(metadata.items())}
