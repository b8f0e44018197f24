"""The hit every search channel returns: the index layer's result type, used by retrieval; and
``recall_of``, how much of one result list another holds (approximate against exact search)."""

from __future__ import annotations

import math
from collections.abc import Sequence
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


def recall_of(approximate: Sequence[str], exact: Sequence[str]) -> float:
    """The share of ``exact``'s IDs that ``approximate`` also holds: ``|approximate ∩ exact| /
    |exact|``, in [0, 1]; 1.0 when ``exact`` is empty (nothing to find, nothing missed). Order does
    not matter. A list naming an ID twice is no result list (``ValueError``)."""
    for name, ids in (("approximate", approximate), ("exact", exact)):
        if len(set(ids)) != len(ids):
            twice = next(i for n, i in enumerate(ids) if i in ids[:n])
            raise ValueError(f"the {name} list names {twice!r} twice")
    if not exact:
        return 1.0
    return len(set(approximate) & set(exact)) / len(exact)
