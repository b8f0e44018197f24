"""API keys: ``rpk_<id>_<secret>``, stored only as a salted SHA-256 digest, compared in constant time.

The secret is 32 random bytes (``secrets.token_urlsafe``): with that much entropy a slow password
hash buys nothing (nobody can guess the input), while it would cost every request tens of
milliseconds; so the stored form is ``sha256:<salt hex>:<digest hex>`` of salt + secret, the way
hosted services keep API tokens. The ID names the entry to compare against, so checking a key costs
one digest whatever the number of keys, and an unknown ID and a wrong secret get the same 401.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

KEY_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
_HASH = re.compile(r"^sha256:([0-9a-f]{32}):([0-9a-f]{64})$")
PREFIX = "rpk_"


def parse_key_hash(value: str) -> tuple[bytes, bytes]:
    """(salt, digest) of a stored key hash; ``ValueError`` naming the expected form."""
    match = _HASH.match(value)
    if match is None:
        raise ValueError("must be sha256:<32 hex salt>:<64 hex digest> (made by ragpipe serve-key)")
    return bytes.fromhex(match.group(1)), bytes.fromhex(match.group(2))


def _digest(salt: bytes, secret: str) -> bytes:
    return hashlib.sha256(salt + secret.encode("utf-8")).digest()


def new_key(key_id: str) -> tuple[str, str]:
    """A fresh key for ``key_id`` and its stored hash: (key, ``sha256:<salt>:<digest>``)."""
    if not KEY_ID.match(key_id):
        raise ValueError(f"key ID {key_id!r} must match {KEY_ID.pattern}")
    secret = secrets.token_urlsafe(32)
    salt = secrets.token_bytes(16)
    return f"{PREFIX}{key_id}_{secret}", f"sha256:{salt.hex()}:{_digest(salt, secret).hex()}"


def split_key(key: str) -> tuple[str, str] | None:
    """(ID, secret) of a key in the ``rpk_<id>_<secret>`` form, else None."""
    if not key.startswith(PREFIX):
        return None
    key_id, sep, secret = key[len(PREFIX) :].partition("_")
    if not sep or not secret or not KEY_ID.match(key_id):
        return None
    return key_id, secret


def key_matches(secret: str, stored: str) -> bool:
    """Whether ``secret`` is the one ``stored`` was made from (constant-time comparison)."""
    salt, digest = parse_key_hash(stored)
    return hmac.compare_digest(_digest(salt, secret), digest)
