"""The strict answer validator: model output is a candidate until it passes.

Accepted: a non-empty answer citing distinct labels that all belong to the supplied evidence
(inline ``[E<n>]`` markers included), or an abstention citing nothing. Anything else — and any
generator failure — becomes a safe abstention whose reason says exactly why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ragpipe.answer.generators import CandidateAnswer
from ragpipe.retrieval.context import Context

SAFE_ABSTENTION = "I cannot answer this from the available evidence."
_MARKER = re.compile(r"\[(E\d+)\]")


@dataclass(frozen=True)
class ValidatedAnswer:
    answer: str
    abstained: bool
    reason: str | None
    citations: tuple[str, ...]


def abstain(reason: str) -> ValidatedAnswer:
    return ValidatedAnswer(answer=SAFE_ABSTENTION, abstained=True, reason=reason, citations=())


def validate_candidate(candidate: CandidateAnswer, context: Context) -> ValidatedAnswer:
    if candidate.failure is not None:
        return abstain(f"generator failed ({candidate.failure.kind}): {candidate.failure.message}")
    labels = set(context.by_label())
    if candidate.abstained:
        if candidate.citations:
            return abstain("model abstained but cited evidence: " + ", ".join(candidate.citations))
        return abstain(f"model abstained: {candidate.raw or candidate.answer or 'no reason given'}")
    if not candidate.answer.strip():
        return abstain("answer is empty")
    if not candidate.citations:
        return abstain("answer cites no evidence")
    duplicates = sorted({c for c in candidate.citations if candidate.citations.count(c) > 1})
    if duplicates:
        return abstain(f"duplicate citation {duplicates[0]}")
    unknown = [c for c in candidate.citations if c not in labels]
    if unknown:
        return abstain(f"citation of unknown label {unknown[0]}")
    inline_unknown = [m for m in _MARKER.findall(candidate.answer) if m not in labels]
    if inline_unknown:
        return abstain(f"answer text refers to unknown label {inline_unknown[0]}")
    return ValidatedAnswer(answer=candidate.answer.strip(), abstained=False, reason=None, citations=candidate.citations)
