"""Canonical JSON (RFC 8785) with ragpipe's input rules.

Contract: ``canonical_bytes(value)`` returns the RFC 8785 encoding of ``value`` after checking
that every float is finite, every integer lies within ±(2^53−1) (the range JSON numbers
carry exactly; so must integral floats that would print without an exponent) and that every
string (keys included) is already in Unicode NFC. Anything else — NaN, ±Inf, huge integers,
non-string keys, unsupported types, a string that NFC would change — raises
``CanonicalEncodingError`` naming the path of the offending value: the encoder never changes a
value, because a silently coerced value would give two different things one ID. (Until v2 of the
IDs that encode through it, it normalised strings to NFC; the ingestion steps that normalise —
documents, IDs, suites — do so themselves, as they declare.)
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

import rfc8785

MAX_SAFE_INTEGER = 2**53 - 1


class CanonicalEncodingError(ValueError):
    """A value cannot be encoded canonically; the message names its path and the rule broken."""


def _prepare(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise CanonicalEncodingError(f"{path}: integer {value} is outside ±(2^53-1)")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalEncodingError(f"{path}: non-finite float {value!r} is not allowed")
        if value.is_integer() and MAX_SAFE_INTEGER < abs(value) < 1e21:
            # RFC 8785 prints these as plain digits, which read back as an out-of-range integer.
            raise CanonicalEncodingError(f"{path}: float {value!r} is an integer outside ±(2^53-1)")
        return value
    if isinstance(value, str):
        if not unicodedata.is_normalized("NFC", value):
            raise CanonicalEncodingError(f"{path}: string {value[:40]!r} is not in Unicode NFC (normalise it first)")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalEncodingError(f"{path}: object key {key!r} is not a string")
            if not unicodedata.is_normalized("NFC", key):
                raise CanonicalEncodingError(f"{path}: object key {key[:40]!r} is not in Unicode NFC")
            out[key] = _prepare(item, f"{path}.{key}")
        return out
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [_prepare(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise CanonicalEncodingError(f"{path}: type {type(value).__name__} has no canonical JSON form")


def canonical_bytes(value: Any) -> bytes:
    """RFC 8785 bytes of ``value`` (see module contract)."""
    return rfc8785.dumps(_prepare(value, "$"))
