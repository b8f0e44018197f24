"""The rows a metadata filter admits, in the forms each search engine applies inside its search.

A ``Selection`` is computed once per filter by retrieval (``ragpipe.retrieval.filtering``) over the
bundle's index rows, and handed to every channel: tantivy applies it as a zero-score must clause
on ``document_id`` (a term set) or a must-not clause on its complement, lancedb as a ``document_id
IN``/``NOT IN`` prefilter, the in-memory engine as a row mask. Each engine picks the smaller of
the admitted documents and their complement, so a filter admitting most of a corpus costs what a
filter excluding a few documents costs. It is never applied after a top ``k``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Selection:
    """``documents``: the admitted documents; ``others``: every other document of the index;
    ``rows``: one bool per index row (row order), true for the rows of admitted documents."""

    documents: frozenset[str]
    others: frozenset[str]
    rows: np.ndarray
    # each engine's compiled form (a tantivy clause, a SQL predicate), built once per selection:
    # a selection is cached per filter, so a filter a service sees often compiles once
    _compiled: dict[str, object] = field(default_factory=dict, repr=False)

    def compiled(self, engine: str, build: Callable[[], T]) -> T:
        """``engine``'s form of this selection, built on first use (racing threads may build it
        twice; both results are equal)."""
        found = self._compiled.get(engine)
        if found is None:
            found = self._compiled.setdefault(engine, build())
        return found  # type: ignore[return-value]

    @property
    def empty(self) -> bool:
        return not self.documents

    @property
    def everything(self) -> bool:
        """Whether every document of the index is admitted: engines add no clause at all."""
        return not self.others

    @property
    def by_exclusion(self) -> bool:
        """Whether engines should exclude ``others`` rather than admit ``documents``."""
        return len(self.others) < len(self.documents)
