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
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ragpipe.corpus.rules import string_problem
from ragpipe.kernel.canonical import CanonicalEncodingError, canonical_bytes

FieldType = Literal["string", "integer", "number", "boolean", "date", "datetime"]
Scalar = str | int | float | bool

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

    def as_json(self) -> Any:
        """The value as JSON shows it: a scalar, or a list when ``many``."""
        return list(self.values) if self.many else self.values[0]

    def type_name(self) -> str:
        return f"list<{self.type}>" if self.many else self.type


Metadata = dict[str, MetadataValue]


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
    for key, value in _flatten(raw):
        if not isinstance(key, str):
            not_kept.append((str(key), f"key of type {type(key).__name__} is not a field name"))
            continue
        key = unicodedata.normalize("NFC", key)
        if not KEY_PATTERN.match(key):
            not_kept.append((key, "not a field name (a letter or _, then letters, digits, _ . -; at most 128)"))
            continue
        if key in CORE_FIELDS:
            not_kept.append((key, "names a core field"))
            continue
        typed = _typed(value, f"{where(key.split('.')[0])}: metadata {key!r}", problems)
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
    return {
        k: MetadataValue(type=t, many=many, values=tuple(float(v) for v in values) if t == "number" else tuple(values))
        for k, (t, many, values) in value.items()
    }


def shown_metadata(metadata: Metadata) -> dict[str, Any]:
    """Metadata as hits show it: ``{key: value or [values]}``."""
    return {k: v.as_json() for k, v in sorted(metadata.items())}
