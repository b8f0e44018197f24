"""Ed25519 signatures (the ``cryptography`` package) with keys and signatures as short text.

- a public key is ``ed25519:<base64 of its 32 raw bytes>`` (what a config file lists);
- a private key is a PKCS#8 PEM file, written once with mode 0600 (``new_key_file``);
- a signature is ``ed25519:<base64 of its 64 bytes>``.

``verify`` answers True or False and never raises on a malformed key or signature: a caller
refuses what does not verify, whatever the reason.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PUBLIC_KEY = re.compile(r"^ed25519:[A-Za-z0-9+/]{43}=$")
PREFIX = "ed25519:"


class KeyFileError(ValueError):
    """A private key file that cannot be used; the message names the file."""


def _text(raw: bytes) -> str:
    return PREFIX + base64.b64encode(raw).decode("ascii")


def public_key_text(key: Ed25519PrivateKey) -> str:
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return _text(raw)


def new_key_file(path: Path) -> str:
    """Write a new private key to ``path`` (refused if it exists; mode 0600); its public key text."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{path}: already exists (a key file is written once)") from None
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot create: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
        f.flush()
        os.fsync(f.fileno())
    return public_key_text(key)


def load_key_file(path: Path) -> Ed25519PrivateKey:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read key file: {exc.strerror or exc}") from None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: not an Ed25519 private key")
    return key


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    return _text(key.sign(message))


def verify(public_key: str, message: bytes, signature: str) -> bool:
    """Whether ``signature`` is ``public_key``'s over ``message`` (False for anything malformed)."""
    if not isinstance(public_key, str) or not PUBLIC_KEY.match(public_key) or not isinstance(signature, str):
        return False
    if not signature.startswith(PREFIX):
        return False
    try:
        raw_key = base64.b64decode(public_key[len(PREFIX) :], validate=True)
        raw_sig = base64.b64decode(signature[len(PREFIX) :], validate=True)
        Ed25519PublicKey.from_public_bytes(raw_key).verify(raw_sig, message)
    except (binascii.Error, ValueError, InvalidSignature):
        return False
    return True
