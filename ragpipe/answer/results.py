"""What an answer returns: exactly the CLI's JSON through ``as_dict()``."""

from __future__ import annotations

from dataclasses import dataclass, field

from ragpipe.answer.generators import CandidateAnswer
from ragpipe.answer.validate import ValidatedAnswer
from ragpipe.kernel.models import FrozenModel
from ragpipe.retrieval.context import Context
from ragpipe.retrieval.results import QueryResult


def _unbilled(failure_kind: str | None) -> bool:
    """A call the provider refused before a model ran (429 or another 4xx) is not billed; a
    timeout, 5xx or dropped connection may have been, so its cost stays unknown."""
    return failure_kind is not None and failure_kind.startswith("http_error:4")


class AnswerUsage(FrozenModel):
    """What answering one question took from a model: the ``calls`` made (0: the extractive
    generator, or nothing to answer from), whether the answer came from the answer cache — its
    usage is then that of the call that produced it, so a recorded cost never depends on the
    cache's state — and tokens and micros, None when unknown (a call that failed without
    reporting usage, a model without a price, an answer cached before usage was kept)."""

    calls: int
    cached: bool
    input_tokens: int | None
    output_tokens: int | None
    cost_micros: int | None

    @classmethod
    def of(cls, candidate: CandidateAnswer | None) -> AnswerUsage:
        if candidate is None or candidate.calls == 0:
            return cls(calls=0, cached=False, input_tokens=0, output_tokens=0, cost_micros=0)
        u = candidate.usage
        failure = candidate.failure.kind if candidate.failure is not None else None
        if u is None and _unbilled(failure):
            return cls(calls=candidate.calls, cached=False, input_tokens=0, output_tokens=0, cost_micros=0)
        known = u is not None and u.metered
        return cls(
            calls=candidate.calls,
            cached=candidate.cached,
            input_tokens=u.input_tokens if known else None,  # type: ignore[union-attr]
            output_tokens=u.output_tokens if known else None,  # type: ignore[union-attr]
            cost_micros=u.cost_micros if known else None,  # type: ignore[union-attr]
        )


@dataclass
class AnswerResult:
    validated: ValidatedAnswer
    generator: str
    context: Context
    query: QueryResult
    certificate_id: str | None
    failure: dict[str, str] | None
    usage: AnswerUsage = field(default_factory=lambda: AnswerUsage.of(None))

    def as_dict(self) -> dict[str, object]:
        labels = self.context.by_label()
        return {
            "answer": self.validated.answer,
            "abstained": self.validated.abstained,
            "reason": self.validated.reason,
            "generator": self.generator,
            "citations": [
                {"label": c, "chunk_id": labels[c].chunk_id, "document_id": labels[c].document_id}
                for c in self.validated.citations
            ],
            "evidence": [e.public() for e in self.context.evidence],
            "omitted": list(self.context.omitted),
            "context_digest": self.context.digest,
            "certificate_id": self.certificate_id,
            "failure": self.failure,
            "usage": self.usage.model_dump(),
            "plan_id": self.query.plan_id,
            "bundle_id": self.query.bundle_id,
            "subject": self.query.subject.as_dict(),
            **({"approximate": True} if self.query.approximate else {}),  # the evidence came through ANN search
        }
