"""Domain-separated content IDs and typed ID wrappers.

An ID is ``sha256(b"ragpipe/<kind>/v<N>\\0" + canonical_bytes(value))`` rendered ``sha256:<hex>``.
The domain prefix makes an ID of one kind impossible to confuse with an ID of another kind over
the same bytes. The typed wrappers are ``str`` subclasses that refuse to be built from a value of
another ID type, so passing a chunk ID where a document ID is expected fails loudly.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, TypeVar

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from ragpipe.kernel.canonical import canonical_bytes

_SHA256 = re.compile(r"^sha256:[0-9a-f]{64}\Z")
_KIND = re.compile(r"^[a-z][a-z0-9_.-]*\Z")


def domain_digest(kind: str, version: int, payload: bytes) -> str:
    """``sha256:<hex>`` of ``payload`` under the domain ``ragpipe/<kind>/v<version>``."""
    h = domain_hash(kind, version)
    h.update(payload)
    return "sha256:" + h.hexdigest()


def domain_hash(kind: str, version: int):
    """The SHA-256 state after the domain prefix of ``ragpipe/<kind>/v<version>``: feed it a
    payload piece by piece, and ``"sha256:" + hexdigest()`` is ``domain_digest`` of the whole."""
    if not _KIND.match(kind) or version < 1:
        raise ValueError(f"invalid ID domain {kind!r} v{version}")
    return hashlib.sha256(f"ragpipe/{kind}/v{version}".encode() + b"\0")


def content_id(kind: str, version: int, value: Any) -> str:
    """Domain-separated ID of a JSON-like value (canonical RFC 8785 bytes)."""
    return domain_digest(kind, version, canonical_bytes(value))


def bytes_digest(data: bytes) -> str:
    """Plain SHA-256 of raw bytes (file and text content), ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


T = TypeVar("T", bound="TypedId")


class TypedId(str):
    """Base of typed IDs. Subclasses set ``pattern``; a different TypedId subclass is refused."""

    pattern: re.Pattern[str] = _SHA256

    def __new__(cls: type[T], value: str) -> T:
        if isinstance(value, TypedId) and not isinstance(value, cls):
            raise TypeError(f"{type(value).__name__} {value!s} cannot be used as a {cls.__name__}")
        if not isinstance(value, str) or not cls.pattern.match(value):
            raise ValueError(f"{cls.__name__}: malformed value {value!r}")
        return super().__new__(cls, value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls, core_schema.str_schema(), serialization=core_schema.plain_serializer_function_ser_schema(str)
        )

    @property
    def hex(self) -> str:
        return self.split(":", 1)[1]


class DocumentId(TypedId):
    """Logical document ID from the source (BEIR ``_id`` or a Markdown path)."""

    pattern = re.compile(r"^[^\x00-\x1f]{1,512}\Z")


class ContentDigest(TypedId):
    """SHA-256 of exact bytes."""


class SpecId(TypedId):
    """Semantic spec ID of a pipeline stage."""


class ChunkId(TypedId):
    pass


class RepresentationId(TypedId):
    pass


class BundleId(TypedId):
    pass


def require(value: object, cls: type[T]) -> T:
    """Return ``value`` if it is exactly of ID type ``cls``; raise ``TypeError`` otherwise."""
    if not isinstance(value, cls):
        raise TypeError(f"expected {cls.__name__}, got {type(value).__name__} {value!r}")
    return value
