"""One cell ``(case, repeat, arm)``: query through the real ``Retriever``, score, trace.

``run_cell`` returns what closes the cell (``CellRun``): ``CellCompleted`` with outcome
``success`` (or ``abstained`` when the run generates answers and the answer abstains), its
metrics and latency, and its trace rows and description, which the runner writes with the rest of
its group (``traces.write_traces``) before adding the trace reference to the record; or
``CellFailed`` (outcome ``failure``) with the error when the retriever or the answer step raises.
The query keeps its rankings (``rankings=True``): the per-channel hits before fusion and the fused
list — what the audit trace shows as dicts — go into the cell's trace rows straight from the
retriever's own objects.

Metrics per cell: the ranking metrics of the spec on the final hits collapsed to the case's target
level (answerable cases only: an unanswerable case has no relevant target), the safety metric
over every hit (and, with answers, every evidence item and citation the subject was shown), and
the answer metrics when the run generates answers, and ``ann_recall@10`` when its plan searches
vectors approximately (``ragpipe.evaluation.ann``: both top-10 lists go into the trace). Latency is
the query's wall time in ms
(execution data: recorded and reported, never in an ID); ``answer_ms`` is the answer step's and
``answer_usage`` what it took from a model (``ragpipe.answer.results.AnswerUsage``: calls,
tokens, micros — a cached answer's are those of the call that produced it). Given an
``answer_cache`` folder (the runner gives each cell its own, ``runner.pending_answers``), a model's
answer is kept there by the generator's answer cache (``answer.litellm_generator``: keyed by the
provider configuration, prompt, certified evidence and question; verified on load), so a cell run
again after a stop — its group never closed — reuses the answer it was given instead of asking
the model again (``answer_usage.cached`` then says so, with the producing call's usage).
"""

from __future__ import annotations

import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from ragpipe.answer.answering import answer as answer_question
from ragpipe.evaluation.ann import ANN_RECALL_K, ann_recall, measures_ann
from ragpipe.evaluation.eval_spec import SpecBody
from ragpipe.evaluation.judge_step import JudgeItem
from ragpipe.evaluation.judging import abstained_metrics, judge_item
from ragpipe.evaluation.metrics import collapse, score_cases
from ragpipe.evaluation.run_state import CellKey, cell_dict
from ragpipe.evaluation.safety import ANSWER_FIELDS, answer_metrics, unauthorized_disclosures
from ragpipe.evaluation.suite import Case
from ragpipe.evaluation.traces import Shown, hit_table
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever

PRINCIPAL = "ragpipe-eval"  # recorded in traces only; the policy decides on scopes


def subject_for(case: Case, body: SpecBody) -> Subject:
    return Subject(PRINCIPAL, case.subject.scopes if case.subject is not None else body.scopes)


def _nfc(value):
    """Free text recorded in the ledger (an error, the answer's reason: they may quote a query or
    a model) in NFC, as the canonical encoder requires; the metrics never read more than a prefix
    of ours (``safety.VALID_ABSTENTION_PREFIXES``), which NFC leaves as it is."""
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, list):
        return [_nfc(v) for v in value]
    if isinstance(value, dict):
        return {k: _nfc(v) for k, v in value.items()}
    return value


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 3)


def _answer(
    retriever: Retriever, case: Case, subject: Subject, body: SpecBody, answer_cache: Path | None = None
) -> tuple[dict[str, float], list[Shown], dict[str, object], dict[str, object], JudgeItem | None]:
    """The answer step's metrics, the items it showed beyond the hits (context evidence, then
    cited sources), the answer fields the metrics were computed on, the cell record's
    ``answer_ms`` and ``answer_usage`` (and, for an answer to judge, its ``answer_digest``), and —
    in a judged run — what the judge is to judge (an answerable case answered; an abstention takes
    its label by rule, ``judging``)."""
    started = time.perf_counter()
    answer = answer_question(retriever, case.query, subject, mode=body.mode, filter=case.filter, cache_dir=answer_cache)
    elapsed = _ms(started)
    data = answer.as_dict()
    shown: list[Shown] = [(e.chunk_id, e.document_id, e.access_scopes) for e in answer.context.evidence]
    shown += [
        (str(c["chunk_id"]), str(c["document_id"]), retriever.scopes[str(c["document_id"])])
        for c in data["citations"]  # type: ignore[union-attr]
    ]
    recorded = {name: _nfc(data[name]) for name in ANSWER_FIELDS}
    extra = {"answer_ms": elapsed, "answer_usage": answer.usage.model_dump()}
    metrics, item = answer_metrics(case, recorded), None
    if body.judge is not None and case.answerability == "answerable":
        if answer.validated.abstained:
            metrics.update(abstained_metrics(case))
        else:
            evidence = [{**e.public(), "access_scopes": e.access_scopes} for e in answer.context.evidence]
            item = judge_item(case, data, evidence)
            # the answer judged, bound in the cell's own record (its text is only in the judge's entry)
            extra["answer_digest"] = item.answer_digest
    return metrics, shown, recorded, extra, item


@dataclass(frozen=True)
class CellRun:
    """A cell's closing event ``kind`` and ``payload`` (a completed cell's lacks its ``trace``
    reference until its group's file is written), with its trace ``rows`` and ``described`` (the
    trace's metadata entry); both None for a failed cell, which has no trace."""

    kind: str
    payload: dict[str, Any]
    rows: pa.Table | None = None
    described: dict[str, Any] | None = None
    targets: list[str] | None = None  # what the ranking metrics are computed on (answerable cases)
    judge_item: JudgeItem | None = None  # what the run's judge judges (``judging.judge_cells``)


def score_group(runs: list[CellRun], cases: dict[str, Case], body: SpecBody) -> None:
    """Add the ranking metrics of every answerable completed cell of a group to its record and its
    trace description — ``ir_measures`` once for the group, not once a cell."""
    ranked = {str(i): r.targets for i, r in enumerate(runs) if r.targets is not None}
    if not ranked:
        return
    judged = {key: cases[runs[int(key)].payload["cell"]["case"]].judgments for key in ranked}
    for key, values in score_cases(judged, ranked, body.ranking_metrics()).items():
        run = runs[int(key)]
        run.payload["metrics"] = {**values, **run.payload["metrics"]}
        if run.described is not None:
            run.described["metrics"] = run.payload["metrics"]


def run_cell(
    retriever: Retriever, body: SpecBody, case: Case, key: CellKey, answer_cache: Path | None = None
) -> CellRun:
    """Execute one cell (module docstring) but for its ranking metrics, which ``score_group``
    adds; writes nothing but, with ``answer_cache``, the model's answer there."""
    cell = cell_dict(key)
    subject = subject_for(case, body)
    try:
        started = time.perf_counter()
        result = retriever.query(case.query, subject, k=body.k, mode=body.mode, rankings=True, filter=case.filter)
        latency = _ms(started)
        targets = collapse([(str(h["document_id"]), str(h["chunk_id"])) for h in result.hits], case.target_level)
        metrics: dict[str, float] = {}  # the ranking metrics follow, for the whole group (score_group)
        hit_scopes = [e.access_scopes for e in result.evidence]
        seen = [(e.document_id, e.access_scopes) for e in result.evidence]
        outcome, extra, shown, answer, item = "success", {}, [], None, None
        if body.answers:
            answered, shown, answer, extra, item = _answer(retriever, case, subject, body, answer_cache)
            metrics.update(answered)
            seen += [(document, scopes) for _, document, scopes in shown]
            outcome = "abstained" if answer["abstained"] else "success"
        metrics["unauthorized_disclosures"] = unauthorized_disclosures(case, seen, default_scopes=body.scopes)
        comparison = None
        if measures_ann(body.metrics):  # after the timed query: latency stays the query's own
            comparison = retriever.ann_comparison(case.query, subject, k=ANN_RECALL_K, filter=case.filter)
            metrics.update(ann_recall(comparison.approximate_ids, comparison.exact_ids))
        record = {"cell": cell, "outcome": outcome, "metrics": metrics, "latency_ms": latency, **extra}
        if result.rankings is None:
            raise RuntimeError("the retriever returned no rankings for a query that asked for them")
        rows = hit_table(
            cell,
            result.rankings,
            result.hits,
            hit_scopes,
            shown,
            reranked=retriever.reranker is not None,
            ann=comparison,
        )
    except Exception as exc:  # a cell's failure is recorded and counted; the run goes on
        return CellRun(
            "CellFailed", {"cell": cell, "outcome": "failure", "error": _nfc(f"{type(exc).__name__}: {exc}")}
        )
    described = record if answer is None else {**record, "answer": answer}
    ranked = targets if case.answerability == "answerable" else None
    return CellRun("CellCompleted", {**record, "hits": len(result.hits)}, rows, dict(described), ranked, item)
