"""Answering on top of retrieval: retrieve, build the context, certify it, generate, validate.

    from ragpipe.answer.answering import answer
    result = answer(retriever, "Does aspirin prevent stroke?")   # default subject: public scope only

The retriever finds and hydrates evidence; this module owns everything after that: the context
budget, the authorization certificate over exactly the evidence a generator is sent, the
generator the plan names (``make_generator``) and the strict validator that turns its output into
an answer or a safe abstention.
"""

from __future__ import annotations

from pathlib import Path

from ragpipe.answer.generators import ExtractiveGenerator, Generator
from ragpipe.answer.results import AnswerResult, AnswerUsage
from ragpipe.answer.validate import abstain, validate_candidate
from ragpipe.retrieval.authz import AuthorizationError, Subject, issue_certificate
from ragpipe.retrieval.context import build_context
from ragpipe.retrieval.plan import GeneratorPlan
from ragpipe.retrieval.retriever import Retriever


def make_generator(plan: GeneratorPlan, bundle_id: str, cache_dir: Path | None = None) -> Generator:
    """The generator ``plan`` names: the extractive default, or an LLM through litellm whose
    answers are cached under ``cache_dir`` (operational: never in an ID)."""
    if plan.kind == "extractive":
        return ExtractiveGenerator()
    from ragpipe.answer.litellm_generator import LiteLLMGenerator  # litellm only when configured

    return LiteLLMGenerator(plan, bundle_id, cache_dir=cache_dir)


def answer(
    retriever: Retriever,
    text: str,
    subject: Subject | None = None,
    generator: Generator | None = None,
    mode: str | None = None,
    cache_dir: Path | None = None,
    filter: object | None = None,
) -> AnswerResult:
    """Answer ``text`` for ``subject`` from the evidence ``retriever`` finds under its plan's
    context budget (restricted by the metadata ``filter``, if any), with ``generator`` (default:
    the plan's). No authorized evidence is an
    abstention; every evidence item is re-checked against the policy before it is certified."""
    subject = subject or Subject.default()
    budget = retriever.plan.context
    result = retriever.query(text, subject, k=max(10, 2 * budget.max_chunks), mode=mode, filter=filter)
    context = build_context(result.evidence, budget)
    generator = generator or make_generator(retriever.plan.answer.generator, retriever.bundle_id, cache_dir)
    if not context.evidence:
        return AnswerResult(
            abstain("no authorized evidence was retrieved"), generator.name, context, result, None, None
        )
    for ev in context.evidence:  # hydration re-check before anything is certified
        if not retriever.policy.allows(subject, ev.access_scopes):
            raise AuthorizationError(f"chunk {ev.chunk_id} is not visible to {subject.principal}")
    certificate = issue_certificate(
        subject, retriever.policy, retriever.bundle_id, context.evidence, retriever.release_id
    )
    candidate = generator.generate(text, context, certificate)
    failure = {"kind": candidate.failure.kind, "message": candidate.failure.message} if candidate.failure else None
    return AnswerResult(
        validate_candidate(candidate, context),
        generator.name,
        context,
        result,
        certificate.certificate_id,
        failure,
        AnswerUsage.of(candidate),
    )
