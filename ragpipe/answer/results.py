"""What an answer returns: exactly the CLI's JSON through ``as_dict()``."""

from __future__ import annotations

from dataclasses import dataclass

from ragpipe.answer.validate import ValidatedAnswer
from ragpipe.retrieval.context import Context
from ragpipe.retrieval.results import QueryResult


@dataclass
class AnswerResult:
    validated: ValidatedAnswer
    generator: str
    context: Context
    query: QueryResult
    certificate_id: str | None
    failure: dict[str, str] | None

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
            "plan_id": self.query.plan_id,
            "bundle_id": self.query.bundle_id,
            "subject": self.query.subject.as_dict(),
        }
