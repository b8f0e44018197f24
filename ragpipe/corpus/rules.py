"""Rules every document ID (and every source string) must satisfy, shared by all connectors.

A document ID is normalised to NFC and then must be non-empty, at most ``MAX_ID_BYTES`` UTF-8
bytes, free of control characters (Unicode category Cc, plus U+2028/U+2029, which act as line
breaks), of lone surrogates (which JSON ``\\ud800`` escapes can smuggle in, and which are not
encodable as UTF-8) and of bidirectional controls (U+202A–U+202E, U+2066–U+2069, U+200E/U+200F,
U+061C: ``a\\u202egpj.md`` is *displayed* as ``adm.jpg``, so an ID could read as another one in a
log, a trace or a review). Other format characters stay allowed: the joiners U+200C/U+200D are
needed to spell words in Persian, Indic scripts and emoji sequences. Two IDs that are equal after
NFC are the same ID: connectors refuse the second one. Checking this while reading the source,
before anything is registered, is what keeps a bad ID from failing late inside the pipeline.
"""

from __future__ import annotations

import unicodedata

MAX_ID_BYTES = 512
_LINE_BREAKS = {"\u2028", "\u2029"}
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_SHOWN_ID_CHARS = 80


def _is_control(ch: str) -> bool:
    return unicodedata.category(ch) == "Cc" or ch in _LINE_BREAKS


def _is_surrogate(ch: str) -> bool:
    return 0xD800 <= ord(ch) <= 0xDFFF


def normalize_id(raw: str) -> str:
    """The NFC form of a raw ID (the form stored, compared and shown)."""
    return unicodedata.normalize("NFC", raw)


def id_problem(doc_id: str) -> str | None:
    """The rule an NFC-normalised ID breaks, or None if it is valid."""
    if not doc_id.strip():
        return "document ID is empty"
    bad = next((c for c in doc_id if _is_surrogate(c)), None)
    if bad is not None:
        return f"document ID contains a lone surrogate U+{ord(bad):04X} (not valid Unicode)"
    bad = next((c for c in doc_id if _is_control(c)), None)
    if bad is not None:
        return f"document ID contains control character U+{ord(bad):04X} (not allowed in IDs)"
    bad = next((c for c in doc_id if c in _BIDI_CONTROLS), None)
    if bad is not None:
        return (
            f"document ID contains bidirectional control character U+{ord(bad):04X} "
            "(not allowed in IDs: it reorders how the ID is displayed)"
        )
    size = len(doc_id.encode("utf-8"))
    if size > MAX_ID_BYTES:
        return f"document ID is {size} UTF-8 bytes long (limit {MAX_ID_BYTES})"
    return None


def string_problem(value: str, field: str) -> str | None:
    """A lone surrogate makes a string unencodable as UTF-8; name the field and the index."""
    try:
        value.encode("utf-8")  # C speed: texts can be megabytes
    except UnicodeEncodeError as exc:
        return f"{field!r} contains a lone surrogate U+{ord(value[exc.start]):04X} at index {exc.start} (not valid Unicode)"
    return None


def _is_unseen(ch: str) -> bool:
    """Characters a reader cannot see or tell apart from a space: escaped in messages."""
    category = unicodedata.category(ch)
    return category == "Cf" or (category == "Zs" and ch != " ")


def _escape(ch: str) -> str:
    if _is_control(ch) or _is_surrogate(ch) or _is_unseen(ch):
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
    return ch


def escape_controls(text: str) -> str:
    """Control characters, surrogates and characters a reader cannot see (format characters such as
    bidirectional controls and zero-width spaces, spaces other than U+0020) as ``\\xNN``/``\\uNNNN``:
    one problem stays one line and shows exactly which ID it is about."""
    return "".join(_escape(c) for c in text)


def shown_id(doc_id: str) -> str:
    """An ID as it appears in messages: escaped (``escape_controls``), cut after 80 characters."""
    if len(doc_id) <= _SHOWN_ID_CHARS:
        return escape_controls(doc_id)
    size = len(doc_id.encode("utf-8", "surrogatepass"))
    return f"{escape_controls(doc_id[:_SHOWN_ID_CHARS])}… ({size} bytes)"
