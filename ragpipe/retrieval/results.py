"""What a query returns: exactly the CLI's JSON through ``as_dict()``."""

from __future__ import annotations

from dataclasses import dataclass, field

from ragpipe.index.hits import Hit, recall_of
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.context import Evidence
from ragpipe.retrieval.fusion.order import FusedHit, RankedHit


class QueryError(ValueError):
    pass


class FilterQueryError(QueryError):
    """A metadata filter the bundle refuses: malformed, an unknown field, a value of another type."""


@dataclass(frozen=True)
class Rankings:
    """A query's rankings as the retriever holds them (``query(..., rankings=True)``): each
    channel's collapsed hits before fusion and the fused list, cut like the trace's
    (``trace.fused_shown``). The audit trace's ``channels`` and ``fusion.items`` are these, as
    dicts; an evaluation reads them here, without building thousands of dicts per query."""

    channels: dict[str, list[RankedHit]]
    fused: list[FusedHit]


@dataclass(frozen=True)
class AnnComparison:
    """One query's vector search done twice on the same query vector, subject, source roles and
    metadata filter: the approximate searcher's top ``k`` rows and exact search's
    (``Retriever.ann_comparison``), each best first."""

    approximate: list[Hit]
    exact: list[Hit]

    @property
    def approximate_ids(self) -> list[str]:
        return [h.representation_id for h in self.approximate]

    @property
    def exact_ids(self) -> list[str]:
        return [h.representation_id for h in self.exact]

    @property
    def recall(self) -> float:
        """``recall_of(approximate, exact)``: the share of exact search's top rows found."""
        return recall_of(self.approximate_ids, self.exact_ids)


@dataclass
class QueryResult:
    plan_id: str
    bundle_id: str
    mode: str
    subject: Subject
    hits: list[dict[str, object]]
    trace: dict[str, object] | None = None
    evidence: list[Evidence] = field(default_factory=list)
    rankings: Rankings | None = None  # never serialised: ``trace`` is the public view
    source_roles: tuple[str, ...] | None = None  # the roles the query was filtered on, if any
    release_id: str | None = None  # the release served, when the bundle was reached through one
    filter: dict[str, object] | None = None  # the metadata filter applied, canonical JSON, if any
    # the vector channel ranked candidates from an ANN index (docs/retrieval.md, "Approximate vector search")
    approximate: bool = False

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "plan_id": self.plan_id,
            "bundle_id": self.bundle_id,
            "mode": self.mode,
            "subject": self.subject.as_dict(),
            "hits": self.hits,
        }
        if self.release_id is not None:
            out["release_id"] = self.release_id
        if self.source_roles is not None:
            out["source_roles"] = list(self.source_roles)
        if self.filter is not None:
            out["filter"] = self.filter
        if self.approximate:  # absent for exact search: its results read as they always did
            out["approximate"] = True
        if self.trace is not None:
            out["trace"] = self.trace
        return out
