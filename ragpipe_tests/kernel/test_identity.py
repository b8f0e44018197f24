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
    ({"é": "e\u0301"}, '{"é":"é"}'.encode()),  # NFC on keys and values
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
        ({"e\u0301": 1, "é": 2}, r"keys collide after NFC"),
    ],
)
def test_canonical_refusals(value, message):
    with pytest.raises(CanonicalEncodingError, match=message):
        canonical_bytes(value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def nfc(value):
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, list):
        return [nfc(v) for v in value]
    if isinstance(value, dict):
        return {nfc(k): nfc(v) for k, v in value.items()}
    return value


@given(json_values)
def test_canonical_round_trip_is_a_fixed_point(value):
    try:
        encoded = canonical_bytes(value)
    except CanonicalEncodingError as exc:
        # the only refusals possible for this input: NFC key collisions, huge integral floats
        assert "collide" in str(exc) or "is an integer outside" in str(exc)
        return
    decoded = json.loads(encoded)
    assert canonical_bytes(decoded) == encoded
    assert decoded == nfc(value)  # numbers compare by value (1.0 == 1, -0.0 == 0)


@given(st.dictionaries(st.text(max_size=6), st.integers(-1000, 1000), max_size=6))
def test_canonical_ignores_key_order(d):
    reordered = dict(reversed(list(d.items())))
    try:
        assert canonical_bytes(d) == canonical_bytes(reordered)
    except CanonicalEncodingError:
        pass


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
