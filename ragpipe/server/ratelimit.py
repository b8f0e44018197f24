"""Per-caller rate limit: a moving window of one minute (the ``limits`` library, in memory)."""

from __future__ import annotations

import math
import time

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter


class RateLimiter:
    """``hit(key)``: None when the request may go on, else the seconds to wait (``Retry-After``).
    ``per_minute`` 0 turns the limit off."""

    def __init__(self, per_minute: int):
        self.item = RateLimitItemPerMinute(per_minute) if per_minute > 0 else None
        self.limiter = MovingWindowRateLimiter(MemoryStorage())

    def hit(self, key: str) -> int | None:
        if self.item is None or self.limiter.hit(self.item, key):
            return None
        reset = self.limiter.get_window_stats(self.item, key).reset_time
        return max(1, math.ceil(reset - time.time()))
