"""Bundle seals: unkeyed (SHA-256) by default, keyed (HMAC-SHA256) when a bundle key is configured.

A seal binds a bundle's two identities — the semantic bundle ID and the material digest — into one
value. The unkeyed seal is a domain-separated SHA-256 anyone can recompute: it catches accidents,
partial writes and edits by someone who does not also rewrite the manifest. The keyed seal is an
HMAC only holders of the key can produce, for bundle stores that others can write
(docs/trust.md states the threat model).

Configuration (operational, never part of an ID): ``RAGPIPE_BUNDLE_KEY_FILE`` names a file whose
bytes (one trailing newline stripped) are the key, or ``RAGPIPE_BUNDLE_KEY`` holds the key itself.
Keys shorter than 32 bytes are refused. With a key configured, publication seals with it and
verification refuses unkeyed bundles and bundles sealed with another key; without one, a keyed
bundle is refused too (it cannot be checked, so it is not trusted).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import domain_digest

KEY_ENV = "RAGPIPE_BUNDLE_KEY"
KEY_FILE_ENV = "RAGPIPE_BUNDLE_KEY_FILE"
MIN_KEY_BYTES = 32
_DOMAIN = b"ragpipe/bundle-seal/v2\0"


class SealKeyError(ValueError):
    """The bundle-key configuration is unusable; the message says which setting and why."""


@dataclass(frozen=True)
class SealKey:
    secret: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        """A public name for the key (a domain-separated hash): says *which* key sealed a bundle
        without revealing it, so a wrongly keyed bundle gets a precise refusal."""
        return domain_digest("bundle-key", 1, self.secret)[:23]


class Seal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["sha256", "hmac-sha256"]
    key_id: str | None = None
    value: str = Field(pattern=r"^(sha256|hmac-sha256):[0-9a-f]{64}$")


def _payload(bundle_id: str, material_digest: str) -> bytes:
    return canonical_bytes({"bundle_id": bundle_id, "material_digest": material_digest})


def make_seal(bundle_id: str, material_digest: str, key: SealKey | None) -> Seal:
    payload = _payload(bundle_id, material_digest)
    if key is None:
        return Seal(kind="sha256", value=domain_digest("bundle-seal", 2, payload))
    mac = hmac.new(key.secret, _DOMAIN + payload, hashlib.sha256).hexdigest()
    return Seal(kind="hmac-sha256", key_id=key.key_id, value=f"hmac-sha256:{mac}")


def seal_problems(seal: Seal, bundle_id: str, material_digest: str, key: SealKey | None) -> list[str]:
    """Why ``seal`` does not prove (bundle ID, material digest) under ``key``; empty when it does."""
    if key is None and seal.kind == "hmac-sha256":
        return [
            f"seal: keyed with key {seal.key_id}, but no bundle key is configured "
            f"(set {KEY_FILE_ENV} or {KEY_ENV}) — a keyed bundle is not trusted unchecked"
        ]
    if key is not None and seal.kind == "sha256":
        return [f"seal: unkeyed, but bundle key {key.key_id} is configured: only bundles sealed with it are trusted"]
    if key is not None and seal.key_id != key.key_id:
        return [f"seal: made with key {seal.key_id}, the configured bundle key is {key.key_id}"]
    expected = make_seal(bundle_id, material_digest, key)
    if not hmac.compare_digest(expected.value, seal.value):
        return ["seal: does not match the bundle ID and material digest (manifest edited or forged)"]
    return []


def configured_key(environ: dict[str, str] | None = None) -> SealKey | None:
    """The bundle key from the environment, or None when neither variable is set.

    A variable that is set but empty is an error, not "no key": a deployment that meant to
    configure a key must never fall back to unkeyed verification. The inline key is taken as the
    raw bytes of the environment value; a key file loses one trailing ``\n`` or ``\r\n``."""
    if environ is None:
        env = {
            name: os.environb[os.fsencode(name)] for name in (KEY_ENV, KEY_FILE_ENV) if os.fsencode(name) in os.environb
        }
    else:
        env = {name: os.fsencode(environ[name]) for name in (KEY_ENV, KEY_FILE_ENV) if name in environ}
    inline, path = env.get(KEY_ENV), env.get(KEY_FILE_ENV)
    if inline is not None and path is not None:
        raise SealKeyError(f"both {KEY_ENV} and {KEY_FILE_ENV} are set: configure one bundle key")
    if path is not None:
        shown = os.fsdecode(path)
        if not path:
            raise SealKeyError(f"{KEY_FILE_ENV} is set but empty: name the bundle key file, or unset it")
        try:
            secret = Path(os.fsdecode(path)).read_bytes()
        except OSError as exc:
            raise SealKeyError(f"{KEY_FILE_ENV}={shown}: cannot read the bundle key file: {exc.strerror}") from None
        secret = secret.removesuffix(b"\n").removesuffix(b"\r")
        source = f"{KEY_FILE_ENV}={shown}"
    elif inline is not None:
        if not inline:
            raise SealKeyError(f"{KEY_ENV} is set but empty: set the bundle key, or unset it")
        secret, source = inline, KEY_ENV
    else:
        return None
    if len(secret) < MIN_KEY_BYTES:
        raise SealKeyError(f"{source}: bundle key has {len(secret)} bytes, at least {MIN_KEY_BYTES} are required")
    return SealKey(secret)
