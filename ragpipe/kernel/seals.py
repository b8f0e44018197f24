"""The keyed seal: one key configuration, an HMAC-SHA256 over a record's canonical form.

Hashes and content IDs catch accidents and edits by someone who does not recompute them; anyone
can recompute them. A seal is what only holders of the key can make, for stores that others can
write (docs/trust.md). One key seals bundles (``ragpipe.bundle.seal``), evaluation ledgers and
release histories (their head file, ``ragpipe.kernel.ledger``), pointers, release manifests and
kept gate decisions (a ``seal`` member beside the record).

Configuration (operational, never part of an ID): ``RAGPIPE_BUNDLE_KEY_FILE`` names a file whose
bytes (one trailing newline stripped) are the key, or ``RAGPIPE_BUNDLE_KEY`` holds the key itself.
Keys shorter than 32 bytes are refused; a variable set but empty is an error, never "no key".

The rule, the same everywhere (``seal_problem``): with a key configured, a record must carry a
seal made with that key over exactly its content, in its domain; without one, a sealed record is
refused too (it cannot be checked, so it is not trusted); without a key, an unsealed record is
what it always was. A seal is ``{"key_id", "mac"}``: ``key_id`` names the key (a hash, never the
key), so a record sealed with another key gets a precise refusal.

Records that only this home reads and writes — the remembered verification of a live release
(``ragpipe.release.verified_record``), the manifests of the query-graph cache
(``ragpipe.embedding.query_graph``) — are sealed by ``home_sealing_key``: the configured key when
there is one, else the home's own key, ``verified/home.key`` (32 random bytes created once with
mode 0600 by the first writer, never copied to an object store), so that whoever can write the
record's folder but not the key cannot make a record this home trusts.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.ids import domain_digest
from ragpipe.kernel.publish import rename_noreplace
from ragpipe.kernel.settings import MIN_KEY_BYTES, Settings, SettingsError, current_settings
from ragpipe.kernel.workspace import Workspace

KEY_ENV = "RAGPIPE_BUNDLE_KEY"
KEY_FILE_ENV = "RAGPIPE_BUNDLE_KEY_FILE"
SEAL = "seal"  # the member a sealed document carries beside its content
HOME_KEY = "home.key"  # under the home's verified/ folder
HOME_KEY_BYTES = 32


class SealKeyError(ValueError):
    """The key configuration is unusable; the message says which setting and why."""


@dataclass(frozen=True)
class SealKey:
    secret: bytes = field(repr=False)

    @property
    def key_id(self) -> str:
        """A public name for the key (a domain-separated hash): says *which* key sealed a record
        without revealing it."""
        return domain_digest("bundle-key", 1, self.secret)[:23]


def mac(key: SealKey, domain: str, payload: bytes) -> str:
    """``hmac-sha256:<hex>`` of ``payload`` in ``domain`` (a NUL separates the two)."""
    digest = hmac.new(key.secret, f"ragpipe/{domain}\0".encode() + payload, hashlib.sha256).hexdigest()
    return f"hmac-sha256:{digest}"


def make_seal(key: SealKey, domain: str, content: Mapping[str, Any]) -> dict[str, str]:
    """The seal of ``content`` (its canonical bytes) in ``domain``."""
    return {"key_id": key.key_id, "mac": mac(key, domain, canonical_bytes(dict(content)))}


def sealed(content: Mapping[str, Any], domain: str, key: SealKey | None) -> dict[str, Any]:
    """``content`` with its ``seal`` member when a key is given, else unchanged."""
    return dict(content) if key is None else {**content, SEAL: make_seal(key, domain, content)}


def seal_problem(seal: object, domain: str, content: Mapping[str, Any], key: SealKey | None) -> str | None:
    """Why ``seal`` (None: the record has none) does not prove ``content`` under ``key``; None if
    it does, or if there is neither a key nor a seal (module docstring)."""
    if seal is None:
        if key is None:
            return None
        return f"not sealed, but key {key.key_id} is configured: only records sealed with it are trusted"
    if not isinstance(seal, dict) or sorted(seal) != ["key_id", "mac"]:
        return "the seal is not {key_id, mac}"
    if key is None:
        return (
            f"sealed with key {seal['key_id']}, but no key is configured (set {KEY_FILE_ENV} or {KEY_ENV}) "
            "— a sealed record is not trusted unchecked"
        )
    if seal["key_id"] != key.key_id:
        return f"sealed with key {seal['key_id']}, the configured key is {key.key_id}"
    if not isinstance(seal["mac"], str) or not hmac.compare_digest(make_seal(key, domain, content)["mac"], seal["mac"]):
        return "the seal does not match the record (edited or forged)"
    return None


def unsealed(document: Mapping[str, Any], domain: str, key: SealKey | None) -> tuple[dict[str, Any], str | None]:
    """``(content, problem)``: the document without its ``seal`` member, and ``seal_problem``."""
    content = {k: v for k, v in document.items() if k != SEAL}
    return content, seal_problem(document.get(SEAL), domain, content, key)


def configured_key(settings: Settings | Mapping[str, str] | None = None) -> SealKey | None:
    """The key ``settings`` configure (a mapping: read as an environment by
    ``Settings.from_environ``; None: this process's ``current_settings()``), or None when neither
    variable is set (module docstring). The inline key is the raw bytes of the variable; a key
    file loses one trailing ``\\n`` or ``\\r\\n``. ``SealKeyError`` in one line when the
    configuration is unusable."""
    try:
        if settings is None:
            settings = current_settings()
        elif not isinstance(settings, Settings):
            settings = Settings.from_environ(settings)
    except SettingsError as exc:
        raise SealKeyError(exc.one_line()) from None
    if settings.bundle_key_file is not None:
        path = settings.bundle_key_file
        try:
            secret = path.read_bytes()
        except OSError as exc:
            raise SealKeyError(f"{KEY_FILE_ENV}={path}: cannot read the key file: {exc.strerror}") from None
        secret = secret.removesuffix(b"\n").removesuffix(b"\r")
        source = f"{KEY_FILE_ENV}={path}"
    elif settings.bundle_key is not None:
        return SealKey(settings.bundle_key.get_secret_value())  # its length is checked by Settings
    else:
        return None
    if len(secret) < MIN_KEY_BYTES:
        raise SealKeyError(f"{source}: key has {len(secret)} bytes, at least {MIN_KEY_BYTES} are required")
    return SealKey(secret)


def home_sealing_key(ws: Workspace, *, create: bool) -> SealKey | None:
    """The configured key, else the home's own key ``verified/home.key`` (created when ``create``;
    None if it does not exist yet, so nothing sealed with it can verify). ``OSError`` when the key
    file is not a regular file of ``HOME_KEY_BYTES`` bytes or cannot be created; ``SealKeyError``
    when the configuration is unusable."""
    key = configured_key()
    if key is not None:
        return key
    path = ws.verified / HOME_KEY
    try:
        secret = read_regular(path, 1024)
    except FileNotFoundError:
        if not create:
            return None
        secret = _create_home_key(path)
    if len(secret) != HOME_KEY_BYTES:
        raise OSError(f"{path}: {len(secret)} bytes, not a {HOME_KEY_BYTES}-byte verification key")
    return SealKey(secret)


def _create_home_key(path: Path) -> bytes:
    """32 random bytes in ``path``, mode 0600: written whole to a private temporary file, then
    renamed without replacing, so a reader never sees a partial key and of two racing processes
    the first key stays (the other reads it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_bytes(HOME_KEY_BYTES)
    tmp = path.with_name(f".{HOME_KEY}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secret)
            fh.flush()
            os.fsync(fh.fileno())
        if not rename_noreplace(tmp, path):
            return read_regular(path, 1024)
    finally:
        tmp.unlink(missing_ok=True)
    return secret
