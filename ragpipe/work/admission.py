"""Admission of attempts: a rate limit shared by every thread, and a budget reserved before each call."""

from __future__ import annotations

import threading
from collections.abc import Callable


class RateLimiter:
    """At most ``per_minute`` attempt starts per minute, evenly spaced; a server's ``Retry-After``
    pauses every thread (``pause``). ``None``: only pauses apply."""

    def __init__(self, per_minute: int | None, clock: Callable[[], float], sleep: Callable[[float], None]):
        self.interval = 60.0 / per_minute if per_minute else 0.0
        self.clock, self.sleep = clock, sleep
        self._next = 0.0
        self._lock = threading.Lock()

    def wait_turn(self) -> None:
        with self._lock:
            now = self.clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self.sleep(start - now)

    def pause(self, seconds: float) -> None:
        with self._lock:
            self._next = max(self._next, self.clock() + seconds)


class Budget:
    """Money a run may spend. ``reserve(worst)`` admits a call only if spent + reserved + worst
    stays within the limit; ``settle(worst, actual)`` replaces the reservation by what it cost."""

    def __init__(self, limit: int | None):
        self.limit = limit
        self.spent = 0
        self.reserved = 0
        self._lock = threading.Lock()

    def reserve(self, worst: int) -> bool:
        with self._lock:
            if self.limit is not None and self.spent + self.reserved + worst > self.limit:
                return False
            self.reserved += worst
            return True

    def settle(self, worst: int, actual: int) -> None:
        with self._lock:
            self.reserved -= worst
            self.spent += actual


def backoff(attempt: int, base: float, cap: float, retry_after: float | None) -> float:
    """Seconds before attempt ``attempt + 1``: the server's ``Retry-After`` if it sent one, else
    ``base × 2^(attempt-1)``; never more than ``cap``."""
    wish = retry_after if retry_after is not None else base * (2 ** (attempt - 1))
    return max(0.0, min(cap, wish))
