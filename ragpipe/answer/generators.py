"""The Generator interface and the embedded deterministic extractive generator."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from ragpipe.retrieval.authz import AuthorizationCertificate
from ragpipe.retrieval.context import Context
from ragpipe.work.usage import Usage

_SENTENCE = re.compile(r"(?<!\bvs\.)(?<!\be\.g\.)(?<!\bi\.e\.)(?<=[.!?])\s+(?=[A-Z(\[])")
_WORD = re.compile(r"\w+", re.UNICODE)
STOPWORDS = frozenset(
    "a an and are as at be by does do for from has have how in is it its of on or that the this to was were what when "
    "where which who why will with".split()
)


@dataclass(frozen=True)
class GeneratorFailure:
    """A typed failure of the generator: timeout, http_error, connection_error, malformed_output."""

    kind: str
    message: str


@dataclass(frozen=True)
class CandidateAnswer:
    """Model output before validation: nothing in it is trusted yet."""

    answer: str
    citations: tuple[str, ...]
    abstained: bool
    failure: GeneratorFailure | None = None
    raw: str = ""
    cached: bool = False
    # The model call that produced it — also when it comes from the answer cache, which keeps the
    # usage of the call it recorded (None: no model, or a call that reported none).
    usage: Usage | None = None
    calls: int = 0  # model calls it took (a cached answer: the one that produced it)
    extras: dict[str, object] = field(default_factory=dict)


class Generator(Protocol):
    """Answers ``question`` from ``context``. A generator that sends text off the machine sends
    only what ``certificate.require_payload(bundle_id, context)`` returns, and nothing if it raises."""

    name: str

    def generate(self, question: str, context: Context, certificate: AuthorizationCertificate) -> CandidateAnswer: ...


def terms(text: str) -> set[str]:
    return {w for w in (t.lower() for t in _WORD.findall(text)) if len(w) > 2 and w not in STOPWORDS}


class ExtractiveGenerator:
    """Selects the evidence sentences sharing most terms with the question (at most
    ``max_sentences``, from the first ``max_evidence`` items) and cites them. Deterministic; no LLM;
    sends nothing anywhere, so it needs no certificate check. It reads only the evidence text and
    labels, never ``context.rendered``."""

    name = "extractive/v1 (deterministic sentence selection, no LLM)"

    def __init__(self, max_sentences: int = 2, max_evidence: int = 3):
        self.max_sentences = max_sentences
        self.max_evidence = max_evidence

    def generate(self, question: str, context: Context, certificate: AuthorizationCertificate) -> CandidateAnswer:
        wanted = terms(question)
        scored = []
        for e_index, ev in enumerate(context.evidence[: self.max_evidence]):
            for s_index, sentence in enumerate(s.strip() for s in _SENTENCE.split(ev.text)):
                overlap = len(wanted & terms(sentence))
                if overlap and sentence:
                    scored.append((-overlap, e_index, s_index, sentence, ev.label))
        if not scored:
            return CandidateAnswer(
                answer="", citations=(), abstained=True, raw="no evidence sentence shares a term with the question"
            )
        picked = sorted(scored)[: self.max_sentences]
        picked.sort(key=lambda p: (p[1], p[2]))  # read in evidence order
        answer = " ".join(f"{sentence} [{label}]" for _, _, _, sentence, label in picked)
        citations = tuple(dict.fromkeys(label for *_, label in picked))
        return CandidateAnswer(answer=answer, citations=citations, abstained=False)
