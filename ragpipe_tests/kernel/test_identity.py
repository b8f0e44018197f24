"""Canonical encoding and IDs: golden vectors, laws, and clear refusals."""

from __future__ import annotations

import json
import math
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.kernel.canonical import CanonicalEncodingError, canonical_bytes
from ragpipe.kernel.ids import (
    BundleId,
    ChunkId,
    ContentDigest,
    DocumentId,
    SpecId,
    bytes_digest,
    content_id,
    domain_digest,
    require,
)

# Golden vectors: these bytes and IDs are persisted; changing them breaks every stored artifact.
GOLDEN_CANONICAL = [
    ({"b": 1, "a": [True, None, "x"]}, b'{"a":[true,null,"x"],"b":1}'),
    ({"n": 1.5, "z": -0.0, "e": 1e21}, b'{"e":1e+21,"n":1.5,"z":0}'),
    ({"\u00e9": "\u00e9"}, '{"é":"é"}'.encode()),  # NFC keys and values, as they are
    ([9007199254740991, -9007199254740991], b"[9007199254740991,-9007199254740991]"),
]


@pytest.mark.parametrize(("value", "expected"), GOLDEN_CANONICAL)
def test_canonical_golden(value, expected):
    assert canonical_bytes(value) == expected


def test_id_golden_vectors():
    assert domain_digest("test", 1, b"") == "sha256:" + __import__("hashlib").sha256(b"ragpipe/test/v1\0").hexdigest()
    assert content_id("test", 1, {"a": 1}) == "sha256:9c71cd76d2cdd55124fc9ad3e24825dc5d59410899c0423d2ee11af69ecc9732"
    assert bytes_digest(b"abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_domain_separation():
    assert content_id("chunk", 1, {"a": 1}) != content_id("document", 1, {"a": 1})
    assert content_id("chunk", 1, {"a": 1}) != content_id("chunk", 2, {"a": 1})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": math.nan}, r"\$\.x: non-finite float nan"),
        ({"x": [1, math.inf]}, r"\$\.x\[1\]: non-finite float inf"),
        ({"x": 2**53}, r"\$\.x: integer 9007199254740992 is outside ±\(2\^53-1\)"),
        ({"x": 2.0**60}, r"\$\.x: float 1.152921504606847e\+18 is an integer outside"),
        ({1: "a"}, r"\$: object key 1 is not a string"),
        ({"x": b"raw"}, r"\$\.x: type bytes has no canonical JSON form"),
        ({"x": "e\u0301"}, r"^\$\.x: string 'e\u0301' is not in Unicode NFC \(normalise it first\)$"),
        ({"a": [{"e\u0301": 1}]}, r"^\$\.a\[0\]: object key 'e\u0301' is not in Unicode NFC$"),
    ],
)
def test_canonical_refusals(value, message):
    with pytest.raises(CanonicalEncodingError, match=message):
        canonical_bytes(value)


def nfc_text(max_size: int | None = None):
    return st.text(max_size=max_size).map(lambda t: unicodedata.normalize("NFC", t))


safe_floats = st.floats(allow_nan=False, allow_infinity=False).filter(
    lambda f: not (f.is_integer() and 2**53 - 1 < abs(f) < 1e21)  # refused: they read back out of range
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1) | safe_floats | nfc_text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(nfc_text(8), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_canonical_round_trip_is_a_fixed_point(value):
    encoded = canonical_bytes(value)
    decoded = json.loads(encoded)
    assert canonical_bytes(decoded) == encoded
    assert decoded == value  # nothing changed (numbers compare by value: 1.0 == 1, -0.0 == 0)


@given(st.text(max_size=12))
def test_the_encoder_never_changes_a_string(text):
    """A string NFC would change is refused with its path; any other is encoded as it is."""
    if unicodedata.is_normalized("NFC", text):
        assert json.loads(canonical_bytes({"s": text})) == {"s": text}
    else:
        with pytest.raises(CanonicalEncodingError, match=r"^\$\.s: string .* is not in Unicode NFC"):
            canonical_bytes({"s": text})


@given(st.dictionaries(nfc_text(6), st.integers(-1000, 1000), max_size=6))
def test_canonical_ignores_key_order(d):
    reordered = dict(reversed(list(d.items())))
    assert canonical_bytes(d) == canonical_bytes(reordered)


def test_typed_ids_refuse_each_other():
    chunk = ChunkId(content_id("chunk", 1, {}))
    with pytest.raises(TypeError, match="ChunkId .* cannot be used as a BundleId"):
        BundleId(chunk)
    with pytest.raises(TypeError, match="expected DocumentId, got ChunkId"):
        require(chunk, DocumentId)
    with pytest.raises(ValueError, match="SpecId: malformed value 'abc'"):
        SpecId("abc")
    assert ContentDigest(bytes_digest(b"x")).hex == bytes_digest(b"x")[7:]
    with pytest.raises(ValueError, match="DocumentId: malformed"):
        DocumentId("bad\nid")
