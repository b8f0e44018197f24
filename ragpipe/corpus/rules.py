"""Rules every document ID (and every source string) must satisfy, shared by all connectors.

A document ID is normalised to NFC and then must be non-empty, at most ``MAX_ID_BYTES`` UTF-8
bytes, free of control characters (Unicode category Cc, plus U+2028/U+2029, which act as line
breaks) and of lone surrogates (which JSON ``\\ud800`` escapes can smuggle in, and which are not
encodable as UTF-8). Two IDs that are equal after NFC are the same ID: connectors refuse the second
one. Checking this while reading the source, before anything is registered, is what keeps a bad
ID from failing late inside the pipeline.
"""

from __future__ import annotations

import unicodedata

MAX_ID_BYTES = 512
_LINE_BREAKS = {"\u2028", "\u2029"}
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


def _escape(ch: str) -> str:
    if _is_control(ch) or _is_surrogate(ch):
        return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
    return ch


def escape_controls(text: str) -> str:
    """Control characters and surrogates as ``\\xNN``/``\\uNNNN``: one problem stays one line."""
    return "".join(_escape(c) for c in text)


def shown_id(doc_id: str) -> str:
    """An ID as it appears in messages: escaped (``escape_controls``), cut after 80 characters."""
    if len(doc_id) <= _SHOWN_ID_CHARS:
        return escape_controls(doc_id)
    size = len(doc_id.encode("utf-8", "surrogatepass"))
    return f"{escape_controls(doc_id[:_SHOWN_ID_CHARS])}… ({size} bytes)"
