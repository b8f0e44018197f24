"""Verification recomputes the measurements: a cell's metrics are what its trace and the suite say.

A ledger's ``CellCompleted`` record *claims* metrics; the gate reads them. ``check_cells`` refuses
a run in which any claim differs from the recomputation, so editing metrics (even with the chain,
the head and every digest recomputed) no longer makes a losing run win. For each completed cell,
from its trace (already checked against the record's digest) and the run's bound suite and spec:

* the rows its record names are all the cell's, and the trace's metadata describes the cell once,
  as the record does (cell, outcome, metrics, latency; format 3);
* its ``final`` rows are the ``hits`` the record counts, rank 1..n;
* the ranking metrics (answerable cases: every ranking metric of the spec, none otherwise) equal
  ``ir_measures`` on those hits collapsed to the case's target level (``metrics.collapse``) and
  the case's judgments — all cells in one ``score_cases`` call;
* ``unauthorized_disclosures`` equals the count over the final and shown rows and their scopes;
* with answers, the answer metrics equal ``safety.answer_metrics`` of the recorded answer, and
  the outcome is ``abstained`` exactly when the answer abstained;
* with a judge, its metrics equal what the cell's judge entry gives (``judging.recompute_judge``:
  the request rebuilt from the bound judge spec, the case and the judged item — whose answer is
  the one the record's ``answer_digest`` names; the verdict parsed from the recorded reply), and
  without one no cell carries a judge outcome, usage, cache flag or answer digest;
* in a run that measures ``ann_recall@10`` (an approximate plan), it equals ``recall_of`` the
  trace's ``ann_approximate`` and ``ann_exact`` lists, which must be lists one comparison could
  produce (``ragpipe.evaluation.ann.check_ann_rows``); in any other run no cell may claim it.

Not recomputable, and so never a reason to trust a run: the latencies (observations), and whether
a trace's rows are what the retriever would return today (the bundle's determinism, not custody;
forging a whole run consistently is what the keyed seal stops, docs/trust.md). Aggregates are
never read from a file: reports and the gate's arms are rebuilt from the verified cells.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ragpipe.evaluation.ann import ANN_STAGES, ann_recall, check_ann_rows, measures_ann
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.judging import JUDGE_RECORD_FIELDS, JudgeCheckError, recompute_judge
from ragpipe.evaluation.ledger import LEDGER, Record
from ragpipe.evaluation.metrics import collapse, score_cases
from ragpipe.evaluation.safety import ANSWER_FIELDS, answer_metrics, unauthorized_disclosures
from ragpipe.evaluation.suite import Case
from ragpipe.evaluation.traces import TraceError, TraceReader

TRACE_ONLY = ("answer", "judge")  # metadata keys a record does not repeat
CITATION_KEYS = ["chunk_id", "document_id", "label"]
RECORD_ONLY = ("hits", "trace")  # record keys the trace's metadata does not repeat


ROW_FIELDS = ["stage", "rank", "chunk_id", "document_id", "access_scopes"]
ANN_FIELDS = ["stage", "rank", "representation_id", "score"]  # read only for runs that measure ANN recall
ANN_READ = [*ANN_FIELDS, "channel"]  # and the channel column, to count the vector channel's rows


def _stage(table: pa.Table, stage: str, fields: Sequence[str] = ROW_FIELDS) -> dict[str, list[Any]]:
    """The columns of one stage's rows, by rank (filtered and sorted in Arrow, columns to Python
    lists: a cell has ~5,000 rows at k = 1000, and one dict per row was a third of the time)."""
    part = table.filter(pc.equal(table["stage"], stage))
    part = part.take(pc.sort_indices(part["rank"]))
    return {name: part[name].to_pylist() for name in fields}


def _ann_metrics(table: pa.Table, where: str) -> dict[str, float]:
    """``ann_recall@10`` recomputed from the cell's two top-10 lists, after checking that one
    comparison could have produced them (``ragpipe.evaluation.ann.check_ann_rows``)."""
    approximate, exact = (_stage(table, stage, ANN_FIELDS) for stage in ANN_STAGES)
    vector = table.filter(pc.and_(pc.equal(table["stage"], "channel"), pc.equal(table["channel"], "vector")))
    problem = check_ann_rows(approximate, exact, vector.num_rows)
    if problem is not None:
        raise TraceError(f"{where}: {problem}")
    return ann_recall(approximate["representation_id"], exact["representation_id"])


@functools.lru_cache(maxsize=4096)
def _scope_list(text: object) -> tuple[str, ...] | None:
    """The scopes a trace cell spells, or None; memoised, as a corpus has a few distinct scope
    sets and a run ~1,000 rows per cell (parsing each row was most of verification's time)."""
    try:
        value = json.loads(text)  # type: ignore[arg-type]
    except (TypeError, ValueError, RecursionError):
        return None
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        return None
    return tuple(value)


def _scopes(rows: Mapping[str, list[Any]], stage: str, where: str) -> list[tuple[str, ...]]:
    out = []
    for rank, text in zip(rows["rank"], rows["access_scopes"], strict=True):
        scopes = _scope_list(text)
        if scopes is None:
            raise TraceError(f"{where}: {stage} row {rank} has no access scopes list")
        out.append(scopes)
    return out


def _number(value: object) -> bool:
    return type(value) in (int, float)  # bool is neither: a forged ``true`` is no metric value


def _check_payload(payload: Mapping[str, Any], k: int, where: str) -> None:
    """The fields recomputation reads, of the types the runner writes (a forged record is refused,
    never a crash): ``hits`` a count no larger than the spec's k, ``trace`` a reference to rows of
    a file, ``metrics`` names to numbers."""
    hits, trace, metrics = payload.get("hits"), payload.get("trace"), payload.get("metrics")
    if type(hits) is not int or not 0 <= hits <= k:
        raise TraceError(f"{where}: hits {hits!r} is not a count of at most k = {k}")
    if (
        not isinstance(trace, dict)
        or not all(isinstance(trace.get(f), str) for f in ("file", "digest"))
        or not all(type(trace.get(f)) is int and trace[f] >= 0 for f in ("first_row", "rows"))
    ):
        raise TraceError(f"{where}: trace is not a {{file, digest, first_row, rows}} reference")
    if not isinstance(metrics, dict) or not all(_number(v) for v in metrics.values()):
        raise TraceError(f"{where}: metrics is not an object of numbers")


def _check_answer(answer: object, where: str) -> dict[str, Any]:
    """The recorded answer, of the types ``AnswerResult.as_dict`` gives."""
    ok = (
        isinstance(answer, dict)
        and set(answer) == set(ANSWER_FIELDS)
        and isinstance(answer["abstained"], bool)
        and (answer["reason"] is None or isinstance(answer["reason"], str))
        # a generator's failure is {kind, message} (``AnswerResult.failure``), not a text
        and (
            answer["failure"] is None
            or (isinstance(answer["failure"], dict) and all(isinstance(v, str) for v in answer["failure"].values()))
        )
        and isinstance(answer["citations"], list)
        and all(
            isinstance(c, dict) and sorted(c) == CITATION_KEYS and all(isinstance(v, str) for v in c.values())
            for c in answer["citations"]
        )
    )
    if not ok:
        raise TraceError(
            f"{where}: the trace records no well-formed answer ({', '.join(ANSWER_FIELDS)}), but the run generates answers"
        )
    return answer  # type: ignore[return-value]


def _observed(record: Record, table: pa.Table, meta: Mapping[str, Any], case: Case, where: str):
    """Check the trace against the record; ``(targets, shown, answer)`` to recompute from."""
    payload = record.payload
    claimed = {k: v for k, v in payload.items() if k not in RECORD_ONLY}
    if {k: v for k, v in meta.items() if k not in TRACE_ONLY} != claimed:
        raise TraceError(f"{where}: the trace's metadata differs from the record")
    final = _stage(table, "final")
    if final["rank"] != list(range(1, payload["hits"] + 1)):
        raise TraceError(f"{where}: the trace's final rows are not the record's {payload['hits']} hits")
    targets = collapse(list(zip(final["document_id"], final["chunk_id"])), case.target_level)
    extra = _stage(table, "shown")
    if extra["rank"] != list(range(1, len(extra["rank"]) + 1)):
        raise TraceError(f"{where}: the trace's shown rows are not ranked 1..{len(extra['rank'])}")
    documents = final["document_id"] + extra["document_id"]
    shown = list(zip(documents, _scopes(final, "final", where) + _scopes(extra, "shown", where)))
    return targets, shown, list(zip(extra["chunk_id"], extra["document_id"])), meta.get("answer")


def _differences(claimed: Mapping[str, Any], recomputed: Mapping[str, float]) -> str | None:
    if set(claimed) != set(recomputed):
        extra = sorted(set(claimed) ^ set(recomputed))
        return f"metric {extra[0]!r} is {'claimed but not computed' if extra[0] in claimed else 'computed but missing'}"
    for name, value in recomputed.items():
        if claimed[name] != value:
            return f"{name} is {claimed[name]!r} in the ledger, {value!r} recomputed from its trace and the suite"
    return None


def _judged(
    spec: EvaluationSpec,
    case: Case,
    answer: Mapping[str, Any],
    cited_scopes: list[tuple[str, ...]],
    meta: Mapping[str, Any],
    payload: Mapping[str, Any],
    where: str,
) -> dict[str, float]:
    """The judge's metrics of a cell, recomputed from its trace entry (``judging.recompute_judge``);
    none, and no judge entry, in a run without a judge."""
    entry, outcome = meta.get("judge"), payload.get("judge_outcome")
    if spec.judge is None:
        if entry is not None or outcome is not None or any(k in payload for k in JUDGE_RECORD_FIELDS):
            raise TraceError(f"{where}: a judge outcome in a run whose answers are not judged")
        return {}
    if (case.answerability != "answerable" or answer["abstained"]) and any(k in payload for k in JUDGE_RECORD_FIELDS):
        raise TraceError(
            f"{where}: judge fields on a cell with nothing to judge (an unanswerable case or an abstention)"
        )
    if "judge_cached" in payload and (payload["judge_cached"] is not True or outcome != "judged"):
        raise TraceError(f"{where}: judge_cached is true, and only on a judged verdict")
    try:
        return recompute_judge(spec.judge, case, answer, cited_scopes, entry, outcome, payload.get("answer_digest"))
    except JudgeCheckError as exc:
        raise TraceError(f"{where}: {exc}") from None


def check_cells(run: Path, records: Sequence[Record], spec: EvaluationSpec) -> None:
    """Refuse (``TraceError`` naming the record) when a completed cell's metrics or outcome differ
    from their recomputation (module docstring)."""
    body = spec.body
    cases = {c.id: c for c in spec.suite.cases}
    recomputed: dict[int, dict[str, float]] = {}
    judged: dict[str, Mapping[str, int]] = {}
    ranked: dict[str, list[str]] = {}
    completed = [r for r in records if r.kind == "CellCompleted"]
    ann = measures_ann(body.metrics)
    traces = TraceReader(run, list(dict.fromkeys(ROW_FIELDS + ANN_READ)) if ann else ROW_FIELDS)
    for record in completed:
        where = f"{run / LEDGER}: record {record.seq}"
        case = cases.get(record.payload["cell"]["case"])
        if case is None:
            raise TraceError(f"{where}: case {record.payload['cell']['case']!r} is not in the run's suite")
        _check_payload(record.payload, body.k, where)
        table, meta = traces.cell(record.payload["trace"], record.payload["cell"], where)
        targets, shown, extra, answer = _observed(record, table, meta, case, where)
        metrics: dict[str, float] = {}
        if body.answers:
            answer = _check_answer(answer, where)
            cited = [(c["chunk_id"], c["document_id"]) for c in answer["citations"]]
            if cited and extra[-len(cited) :] != cited:  # the runner shows the context, then the citations
                raise TraceError(f"{where}: the recorded answer cites sources the trace does not show")
            metrics.update(answer_metrics(case, answer))
            if (record.payload["outcome"] == "abstained") != bool(answer["abstained"]):
                raise TraceError(f"{where}: outcome {record.payload['outcome']!r} contradicts the recorded answer")
            cited_scopes = [tuple(scopes) for _, scopes in shown[len(shown) - len(cited) :]] if cited else []
            metrics.update(_judged(spec, case, answer, cited_scopes, meta, record.payload, where))
        elif answer is not None or record.payload["outcome"] != "success":
            raise TraceError(f"{where}: an answer or abstention in a run that generates no answers")
        metrics["unauthorized_disclosures"] = unauthorized_disclosures(case, shown, default_scopes=body.scopes)
        if ann:
            metrics.update(_ann_metrics(table, where))
        if case.answerability == "answerable":
            judged[str(record.seq)], ranked[str(record.seq)] = case.judgments, targets
        recomputed[record.seq] = metrics
    if ranked:
        for seq, values in score_cases(judged, ranked, body.ranking_metrics()).items():
            recomputed[int(seq)].update(values)
    for record in completed:
        problem = _differences(record.payload["metrics"], recomputed[record.seq])
        if problem is not None:
            raise TraceError(f"{run / LEDGER}: record {record.seq}: {problem}")
