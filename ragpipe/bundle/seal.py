"""Bundle seals: unkeyed (SHA-256) by default, keyed (HMAC-SHA256) when a bundle key is configured.

A seal binds a bundle's two identities — the semantic bundle ID and the material digest — into one
value. The unkeyed seal is a domain-separated SHA-256 anyone can recompute: it catches accidents,
partial writes and edits by someone who does not also rewrite the manifest. The keyed seal is an
HMAC only holders of the key can produce, for bundle stores that others can write
(docs/trust.md states the threat model).

The key is the one key configuration of every seal (``ragpipe.kernel.seals``: the variables, the
minimum length). With a key configured, publication seals with it and verification refuses
unkeyed bundles and bundles sealed with another key; without one, a keyed bundle is refused too
(it cannot be checked, so it is not trusted).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import domain_digest
from ragpipe.kernel.seals import KEY_ENV, KEY_FILE_ENV, SealKey

_DOMAIN = b"ragpipe/bundle-seal/v2\0"


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
