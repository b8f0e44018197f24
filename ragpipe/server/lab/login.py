"""Who is looking at the lab: a key with the ``reviewer`` role, exchanged once for a session.

The login form takes the key (checked by the server's ``KeyRing``, the same keys as the API); a key
without the role gets 403. A session is a random 256-bit token held server-side with its caller, a
CSRF token and an absolute expiry (``SESSION_TTL_S``); the browser holds only the token, in an
``HttpOnly``, ``SameSite=Strict`` cookie scoped to ``/lab``, so a script cannot read it and no other
site's form or link carries it. Every POST must echo the session's CSRF token (compared in constant
time). Sessions live in this process: a restart logs every reviewer out, which is the safe
direction. The map is bounded (``MAX_SESSIONS``): beyond it the oldest session ends.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from ragpipe.server.auth import Caller

COOKIE = "ragpipe_lab"
REVIEWER = "reviewer"
SESSION_TTL_S = 8 * 3600.0
MAX_SESSIONS = 10_000


@dataclass(frozen=True)
class LabSession:
    caller: Caller
    csrf: str
    expires: float  # time.monotonic() deadline

    @property
    def principal(self) -> str:
        return self.caller.subject.principal


class LabSessions:
    """The open sessions of this process (thread-safe: pages render in worker threads)."""

    def __init__(self, ttl_s: float = SESSION_TTL_S, capacity: int = MAX_SESSIONS, clock=time.monotonic):
        self.ttl_s = ttl_s
        self.capacity = capacity
        self.clock = clock
        self._lock = threading.Lock()
        self._open: OrderedDict[str, LabSession] = OrderedDict()

    def open(self, caller: Caller) -> tuple[str, LabSession]:
        """A new session for ``caller`` (who must hold the reviewer role): (cookie token, session)."""
        if REVIEWER not in caller.roles:
            raise PermissionError("this key has no reviewer role")
        token = secrets.token_urlsafe(32)
        session = LabSession(caller, secrets.token_urlsafe(32), self.clock() + self.ttl_s)
        with self._lock:
            self._open[token] = session
            while len(self._open) > self.capacity:
                self._open.popitem(last=False)
        return token, session

    def get(self, token: str | None) -> LabSession | None:
        """The live session of ``token``; an expired one is closed and None returned."""
        if not token:
            return None
        with self._lock:
            session = self._open.get(token)
            if session is not None and session.expires <= self.clock():
                del self._open[token]
                return None
            return session

    def close(self, token: str | None) -> None:
        with self._lock:
            self._open.pop(token or "", None)


def csrf_matches(session: LabSession, presented: str | None) -> bool:
    """Whether ``presented`` is the session's CSRF token (constant-time)."""
    return presented is not None and hmac.compare_digest(session.csrf.encode(), presented.encode())
