"""MCP sessions, bounded per key as well as in all, so one key cannot hold every session slot.

The MCP SDK bounds the sessions of its streamable-HTTP manager in all (``max_sessions``) and ends a
session once no request has been in flight on it for ``session_idle_timeout`` — both set from
``limits.mcp_sessions`` and ``limits.mcp_session_idle_s``. It has no bound per credential, so
``SessionQuota`` keeps one in front of it (``KeyGuard``, ``ragpipe.server.mcp_tool``), from what
crosses HTTP alone — no SDK internals:

- a request that may open a session (no ``Mcp-Session-Id``, and a protocol version that has
  sessions: the SDK's own rule) reserves a slot of its caller (its key; without a key, its address)
  before it reaches the SDK, or is refused: 429 ``too_many_sessions`` at ``mcp_sessions_per_key``,
  503 ``overloaded`` at ``mcp_sessions``. The reservation becomes the session when the response
  carries a session ID, and is given back otherwise — so concurrent openings cannot overshoot;
- a session ends here when its owner's ``DELETE`` succeeds, when the SDK answers 404 for it (it is
  gone: expired or crashed), or when no request has been in flight on it for ``mcp_session_idle_s``.
  This clock starts when a request has finished passing through the guard, after the SDK's own:
  a session is counted here at least as long as the SDK keeps it, never shorter.

Everything runs on the event loop (the guard is a coroutine), so no lock is needed.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from ragpipe.server.errors import ApiError


@dataclass
class _Session:
    owner: str
    in_flight: int = 0
    idle_since: float = 0.0


def may_open_session(headers: dict[str, str]) -> bool:
    """Whether the SDK's stateful manager would open a session for this request: no session ID, and
    no protocol-version header or one of the handshake versions (others go to its sessionless path)."""
    if "mcp-session-id" in headers:
        return False
    version = headers.get("mcp-protocol-version")
    return version is None or version in HANDSHAKE_PROTOCOL_VERSIONS


class SessionQuota:
    """Open MCP sessions by owner (see the module docstring)."""

    def __init__(
        self,
        total: int,
        per_owner: int,
        idle_s: float,
        refused: Callable[[str], None] = lambda reason: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total = total
        self.per_owner = per_owner
        self.idle_s = idle_s
        self.refused = refused
        self.clock = clock
        self._sessions: dict[str, _Session] = {}
        self._pending: Counter[str] = Counter()
        self._held: Counter[str] = Counter()  # owner -> sessions + reservations

    def open_count(self, owner: str) -> int:
        self._expire()
        return self._held[owner]

    def reserve(self, owner: str) -> None:
        """Reserve a session slot for ``owner``; ``ApiError`` (429 ``too_many_sessions`` or 503
        ``overloaded``) when none is left. Follow with ``opened`` whatever the request's outcome."""
        self._expire()
        if self._held[owner] >= self.per_owner:
            self.refused("per_key")
            raise ApiError(
                429,
                "too_many_sessions",
                f"this caller holds {self._held[owner]} open MCP sessions, the most one key (or anonymous "
                f"address) may: end one (DELETE /mcp/ with its Mcp-Session-Id) or leave one idle for "
                f"{self.idle_s:g} s",
            )
        if len(self._sessions) + sum(self._pending.values()) >= self.total:
            self.refused("total")
            raise ApiError(
                503,
                "overloaded",
                f"all {self.total} MCP sessions are open: retry shortly",
                headers={"Retry-After": "1"},
            )
        self._pending[owner] += 1
        self._held[owner] += 1

    def opened(self, owner: str, session_id: str | None) -> None:
        """The reserving request is done: ``session_id`` is the session it opened, or None."""
        self._pending[owner] -= 1
        if self._pending[owner] <= 0:
            del self._pending[owner]
        if session_id is not None and session_id not in self._sessions:
            self._sessions[session_id] = _Session(owner, idle_since=self.clock())
        else:
            self._release(owner)

    def started(self, session_id: str, owner: str) -> bool:
        """A request on ``session_id`` by ``owner`` begins; False when the session is not ``owner``'s
        one here (the SDK refuses it as unknown)."""
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            return False
        session.in_flight += 1
        return True

    def finished(self, session_id: str, status: int | None, ended: bool) -> None:
        """A request ``started`` on ``session_id`` is done: answered ``status``; ``ended`` when it was
        a DELETE (the client ending the session)."""
        session = self._sessions.get(session_id)
        if session is None:
            return
        session.in_flight -= 1
        session.idle_since = self.clock()
        if status == 404 or (ended and status is not None and status < 300):
            self._forget(session_id)

    def _forget(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._release(session.owner)

    def _release(self, owner: str) -> None:
        self._held[owner] -= 1
        if self._held[owner] <= 0:
            del self._held[owner]

    def _expire(self) -> None:
        now = self.clock()
        stale = [sid for sid, s in self._sessions.items() if s.in_flight == 0 and now - s.idle_since >= self.idle_s]
        for sid in stale:
            self._forget(sid)
