"""Who is calling: the subject comes from the key alone, never from the request.

``KeyRing.authenticate(header, client)``: a ``Bearer`` key in the config → its subject and scopes;
no ``Authorization`` header → the public subject when the config allows anonymous access, else
401; anything else (unknown ID, wrong secret, malformed header) → 401 with one message for all, so
a caller cannot tell which keys exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragpipe.retrieval.authz import Subject
from ragpipe.server.config import KeyEntry, Role, ServeConfig
from ragpipe.server.errors import ApiError
from ragpipe.server.keys import key_matches, new_key, split_key

UNAUTHORIZED = "missing or unknown API key (Authorization: Bearer rpk_...)"
DUMMY_HASH = new_key("dummy")[1]


@dataclass(frozen=True)
class Caller:
    subject: Subject
    rate_key: str  # what the rate limit counts: the key ID, or the anonymous caller's address
    roles: tuple[Role, ...] = ()  # the key's roles (``KeyEntry.roles``); none for anonymous callers

    @property
    def key_id(self) -> str | None:
        """The ID of the caller's key; None for an anonymous caller."""
        return self.rate_key.removeprefix("key:") if self.rate_key.startswith("key:") else None


class KeyRing:
    def __init__(self, config: ServeConfig):
        self.anonymous = config.anonymous
        self.entries: dict[str, KeyEntry] = {e.id: e for e in config.keys}
        self.subjects = {e.id: Subject(principal=e.subject, scopes=e.scopes) for e in config.keys}

    def authenticate(self, header: str | None, client: str) -> Caller:
        if header is None:
            if self.anonymous:
                return Caller(Subject.default(), f"anonymous:{client}")
            raise ApiError(401, "unauthorized", UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
        scheme, _, key = header.partition(" ")
        parts = split_key(key.strip()) if scheme.lower() == "bearer" else None
        entry = self.entries.get(parts[0]) if parts else None
        # An unknown ID costs the same digest as a known one, so timing does not tell which IDs exist.
        matches = key_matches(parts[1] if parts else "", entry.hash if entry else DUMMY_HASH)
        if entry is None or not matches:
            raise ApiError(401, "unauthorized", UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
        return Caller(self.subjects[entry.id], f"key:{entry.id}", entry.roles)
