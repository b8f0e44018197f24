"""Lab sessions: only reviewers get one, they end at their expiry or at logout, the map is
bounded, and a CSRF token matches only itself (a fake clock: no test waits on time)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.retrieval.authz import Subject
from ragpipe.server.auth import Caller
from ragpipe.server.lab.login import LabSessions, csrf_matches

REVIEWER = Caller(Subject("rita", ("public",)), "key:rita", ("reviewer",))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_only_a_reviewer_opens_a_session():
    sessions = LabSessions()
    with pytest.raises(PermissionError, match="^this key has no reviewer role$"):
        sessions.open(Caller(Subject("pat", ("public",)), "key:pat"))
    token, session = sessions.open(REVIEWER)
    assert sessions.get(token) is session
    assert session.principal == "rita"
    assert len(token) == len(session.csrf) == 43  # 32 random bytes, URL-safe base64
    assert token != session.csrf


def test_a_session_ends_at_its_expiry_and_at_logout():
    clock = Clock()
    sessions = LabSessions(ttl_s=60, clock=clock)
    token, _ = sessions.open(REVIEWER)
    clock.now += 59.999
    assert sessions.get(token) is not None
    clock.now += 0.001
    assert sessions.get(token) is None
    clock.now -= 1  # an expired session is gone, not merely hidden
    assert sessions.get(token) is None
    other, _ = sessions.open(REVIEWER)
    sessions.close(other)
    assert sessions.get(other) is None
    assert sessions.get(None) is None and sessions.get("") is None
    sessions.close(None)  # closing nothing is harmless


def test_the_oldest_session_ends_beyond_capacity():
    sessions = LabSessions(capacity=2)
    first, _ = sessions.open(REVIEWER)
    second, _ = sessions.open(REVIEWER)
    third, _ = sessions.open(REVIEWER)
    assert [sessions.get(t) is not None for t in (first, second, third)] == [False, True, True]


@given(st.text(max_size=60) | st.none())
def test_a_csrf_token_matches_only_itself(presented):
    _, session = LabSessions().open(REVIEWER)
    assert csrf_matches(session, session.csrf)
    assert csrf_matches(session, presented) == (presented == session.csrf)
