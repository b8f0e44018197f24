"""The hit every search channel returns: the index layer's result type, used by retrieval."""

from __future__ import annotations

import math
from typing import NamedTuple

# Tuples, not dataclasses: a query creates a few hundred of these, and a frozen dataclass costs
# about twice as much to construct — measurable against a 1 ms lexical budget.


class _HitFields(NamedTuple):
    channel: str
    representation_id: str
    chunk_id: str
    document_id: str
    score: float


class Hit(_HitFields):
    """One channel hit on a representation. Scores must be finite."""

    __slots__ = ()

    def __new__(cls, channel: str, representation_id: str, chunk_id: str, document_id: str, score: float):
        if not math.isfinite(score):
            raise ValueError(f"non-finite {channel} score {score!r} for {representation_id}")
        return super().__new__(cls, channel, representation_id, chunk_id, document_id, score)
