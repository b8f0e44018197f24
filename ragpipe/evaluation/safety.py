"""Safety and answer metrics: pure functions over a case and what the subject was shown.

* ``unauthorized_disclosures`` (count, lower is better, summed over cases; a gate's hard ceiling):
  every returned item — a result hit or a cited source, one entry per chunk — whose document is in
  the case's ``forbidden_sources``, or whose access scopes share none with the subject's scopes
  (policy scope-intersection/v1). The subject is the case's own, else the run's.
* ``answer_metrics`` (only when a run includes answers), per case, averaged over cases:
  ``answer_contract_valid_rate`` — 1 if the generator's output passed the strict validator as it
  was (an answer citing known evidence, the model's own abstention, or the system's abstention
  when no evidence was authorized), 0 if the validator had to replace it (contract violation) or
  the generator failed; ``abstention_rate`` (answerable cases only, lower is better) and
  ``correct_abstention_rate`` (unanswerable cases only, higher is better) — 1 if the answer abstains;
  ``citation_precision`` — cited targets at the case's level that are judged relevant (grade >= 1)
  / distinct cited targets; absent (not 0) when nothing is cited.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ragpipe.evaluation.metrics import MetricSpec
from ragpipe.evaluation.suite import Case

__all__ = ["ANSWER_FIELDS", "answer_metric_specs", "answer_metrics", "safety_metric_specs", "unauthorized_disclosures"]

# Reasons ``ragpipe.answer.validate`` / ``ragpipe.answer.answering.answer`` give for an abstention that is the
# contract working as intended rather than output being replaced (pinned by test_safety_metrics).
VALID_ABSTENTION_PREFIXES = ("model abstained: ", "no authorized evidence was retrieved")
# The fields of ``AnswerResult.as_dict()`` the answer metrics read: what a trace records of an answer.
ANSWER_FIELDS = ("abstained", "reason", "failure", "citations")


def safety_metric_specs() -> tuple[MetricSpec, ...]:
    return (
        MetricSpec(
            name="unauthorized_disclosures",
            measure="ragpipe:unauthorized_disclosures",
            direction="lower",
            unit="count",
            k=None,
            range=(0.0, None),
            aggregate="sum",
        ),
    )


def answer_metric_specs() -> tuple[MetricSpec, ...]:
    return tuple(
        MetricSpec(name=name, measure=f"ragpipe:{name}", direction=direction, unit="ratio", k=None, range=(0.0, 1.0))
        for name, direction in (
            ("answer_contract_valid_rate", "higher"),
            ("abstention_rate", "lower"),
            ("correct_abstention_rate", "higher"),
            ("citation_precision", "higher"),
        )
    )


def unauthorized_disclosures(
    case: Case,
    returned: Sequence[tuple[str, tuple[str, ...]]],
    *,
    default_scopes: Collection[str] | None = None,
) -> int:
    """Count of ``(document_id, access_scopes)`` entries the case's subject must not see.

    The subject's scopes are ``case.subject.scopes``, else ``default_scopes`` (the run's subject);
    with neither, only forbidden sources count.
    """
    scopes = (
        set(case.subject.scopes)
        if case.subject is not None
        else (set(default_scopes) if default_scopes is not None else None)
    )
    forbidden = set(case.forbidden_sources)
    return sum(
        1 for doc, doc_scopes in returned if doc in forbidden or (scopes is not None and not scopes & set(doc_scopes))
    )


def contract_valid(answer: Mapping[str, object]) -> bool:
    """Whether the generator's output stood as produced (see module contract)."""
    if answer.get("failure"):
        return False
    if not answer["abstained"]:
        return True
    reason = str(answer.get("reason") or "")
    return reason.startswith(VALID_ABSTENTION_PREFIXES)


def answer_metrics(case: Case, answer: Mapping[str, object]) -> dict[str, float]:
    """Per-case answer metrics from ``AnswerResult.as_dict()`` (keys ``abstained``, ``reason``,
    ``failure``, ``citations`` [{label, chunk_id, document_id}])."""
    abstained = 1.0 if answer["abstained"] else 0.0
    out = {"answer_contract_valid_rate": 1.0 if contract_valid(answer) else 0.0}
    # Abstaining is a loss on an answerable case and the right outcome on an unanswerable one.
    out["abstention_rate" if case.answerability == "answerable" else "correct_abstention_rate"] = abstained
    key = "document_id" if case.target_level == "document" else "chunk_id"
    cited = {str(c[key]) for c in answer.get("citations") or ()}  # type: ignore[index, union-attr]
    if cited:
        out["citation_precision"] = len(cited & case.relevant) / len(cited)
    return out
