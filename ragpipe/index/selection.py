"""The rows a metadata filter admits, in the forms each search engine applies inside its search.

A ``Selection`` is computed once per filter by retrieval (``ragpipe.retrieval.filtering``) over the
bundle's index rows, and handed to every channel: tantivy applies it as a zero-score must clause
on ``document_id`` (a term set) or a must-not clause on its complement, lancedb as a ``document_id
IN``/``NOT IN`` prefilter, the in-memory engine as a row mask. Each engine picks the smaller of
the admitted documents and their complement, so a filter admitting most of a corpus costs what a
filter excluding a few documents costs. It is never applied after a top ``k``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Selection:
    """``documents``: the admitted documents; ``others``: every other document of the index;
    ``rows``: one bool per index row (row order), true for the rows of admitted documents."""

    documents: frozenset[str]
    others: frozenset[str]
    rows: np.ndarray

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
