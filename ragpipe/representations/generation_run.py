"""Generate a revision's generated kinds through the step runner, and record the evidence.

For each generated kind of the spec, every chunk becomes one item keyed by its request
(``generation_key``); the runner looks each key up in ``$RAGPIPE_HOME/generation_cache/<kind>/``
first, so a revision that changes 1 % of the chunks calls the model for exactly those. One budget
covers every kind of the run. Outcomes:

* a chunk the disclosure policy keeps from the kind's endpoint (``GeneratedKindSpec.may_send``:
  none of its document's scopes may be sent there) → nothing is sent, a ``withheld`` record naming
  the scopes, and no representation;
* a valid reply → the chunk's text of that kind, and an ``ok`` evidence record;
* an invalid reply (attempts exhausted) → an ``invalid_output`` record and no representation; more
  than ``execution.generation.max_invalid_fraction`` of the replies invalid → ``GenerationFailed``;
* any other failure left after its attempts (rate limited, timeout, server or client error) →
  ``GenerationFailed``: nothing is published, every finished item stays cached, and building again
  asks only for the rest. A budget stop raises ``BudgetExhausted`` the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ragpipe.chunking.models import Chunk
from ragpipe.corpus.models import Document
from ragpipe.representations.generate import (
    GenerationInput,
    GenerationStep,
    InvalidOutput,
    chat_request,
    check_call_reply,
    generation_key,
    parse_reply,
)
from ragpipe.representations.generations import GenerationRecord, withheld_record
from ragpipe.spec import GenerationExecution, RepresentationSpec
from ragpipe.work.admission import Budget
from ragpipe.work.chat import ChatRequest
from ragpipe.work.entries import JsonEntryStore
from ragpipe.work.leases import KeyLeases
from ragpipe.work.runner import StepReport, run_step
from ragpipe.work.usage import PriceTable, Usage, UsageTotals


class GenerationFailed(RuntimeError):
    """Items failed for a reason other than their output; ``str(e)`` is one line with the counts."""


@dataclass(frozen=True)
class GenerationOutcome:
    texts: dict[tuple[str, str], str]  # (chunk ID, kind) -> representation text
    records: list[GenerationRecord]  # one per chunk and generated kind, in chunk order
    reports: dict[str, StepReport]  # per kind

    @property
    def usage(self) -> UsageTotals:
        """What this run's calls cost (cache hits cost nothing)."""
        total = UsageTotals()
        for report in self.reports.values():
            total = total.merge(report.usage)
        return total


def generate_representations(
    documents: list[Document],
    chunks: list[Chunk],
    spec: RepresentationSpec,
    producer_spec_id: str,
    execution: GenerationExecution,
    cache_root: Path,
    prices: PriceTable,
) -> GenerationOutcome:
    """Module docstring. Raises ``GenerationFailed`` or ``BudgetExhausted`` (nothing to publish)."""
    titles = {d.document_id: d.title for d in documents}
    scopes = {d.document_id: d.access_scopes for d in documents}
    budget = Budget(execution.budget_micros)
    texts: dict[tuple[str, str], str] = {}
    records: list[GenerationRecord] = []
    reports: dict[str, StepReport] = {}
    for kind in spec.generated_kinds:
        kspec = spec.generated[kind]  # type: ignore[index]
        sent = [c for c in chunks if kspec.may_send(scopes[c.document_id])]
        items = []
        for chunk in sent:
            request = chat_request(kind, kspec, titles.get(chunk.document_id, ""), chunk.text)
            items.append((generation_key(kind, kspec, request), GenerationInput(kind, kspec, request)))
        folder = cache_root / kind
        values, report = run_step(
            GenerationStep(kind, kspec, execution, prices),
            items,
            JsonEntryStore(folder, f"generation cache ({kind})", _value_check(kind, kspec)),
            execution,
            leases=KeyLeases(folder / "leases"),
            budget=budget,
        )
        reports[kind] = report
        failures = {f.key: f for f in report.failures}
        stuck = [f for f in report.failures if f.kind != "invalid_output"]
        if stuck:
            counts = ", ".join(f"{k}: {n}" for k, n in report.failure_counts().items() if k != "invalid_output")
            raise GenerationFailed(
                f"generating {kind}: {len(stuck)} item(s) failed after their attempts ({counts}); first: "
                f"{stuck[0].detail}: {stuck[0].message} (finished items are cached: build again to continue)"
            )
        keys = {chunk.chunk_id: key for chunk, (key, _) in zip(sent, items, strict=True)}
        kind_records = []
        for chunk in chunks:
            key = keys.get(chunk.chunk_id)
            if key is None:
                kind_records.append(
                    withheld_record(chunk.chunk_id, kind, kspec, scopes[chunk.document_id], producer_spec_id)
                )
                continue
            value = values.get(key)
            failure = failures.get(key)
            evidence = value if value is not None else (failure.evidence if failure is not None else None)
            if evidence is None:  # an invalid reply that cannot even be recorded (not Unicode text)
                why = failure.message if failure is not None else "no reply"
                raise GenerationFailed(f"generating {kind}: chunk {chunk.chunk_id}: {why}")
            record = evidence_record(chunk.chunk_id, kind, key, evidence, producer_spec_id)
            try:
                texts[(chunk.chunk_id, kind)] = parse_reply(kind, kspec, record.content)
            except InvalidOutput as exc:
                record = record.model_copy(update={"status": "invalid_output", "failure": str(exc)})
            kind_records.append(record)
        _check_invalid_fraction(kind, kind_records, len(sent), execution.max_invalid_fraction)
        records += kind_records
    return GenerationOutcome(texts, records, reports)


def _check_invalid_fraction(kind: str, records: list[GenerationRecord], sent: int, limit: float) -> None:
    """Fail the run when more than ``limit`` of the replies to the chunks sent broke the contract:
    a bundle without most of the kind the spec asked for is not what it says it is."""
    invalid = [r for r in records if r.status == "invalid_output"]
    if sent and len(invalid) / sent > limit:
        raise GenerationFailed(
            f"generating {kind}: {len(invalid)} of {sent} replies broke the output contract "
            f"({len(invalid) / sent:.0%}, more than execution.generation.max_invalid_fraction {limit:g}); "
            f"first: chunk {invalid[0].chunk_id}: {invalid[0].failure}"
        )


def _value_check(kind: str, kspec):
    """A cached value must be a call for its key: its request's key is the entry's, its usage and
    reply well-formed (pydantic's ``ValidationError`` is a ``ValueError``)."""

    def check(key: str, value: object) -> None:
        if not isinstance(value, dict) or set(value) != {"request", "content", "response", "usage"}:
            raise ValueError("is not a generation (request, content, response, usage)")
        if generation_key(kind, kspec, ChatRequest.model_validate(value["request"])) != key:
            raise ValueError("holds the reply to another request than its key's")
        check_call_reply(value)

    return check


def evidence_record(chunk_id: str, kind: str, key: str, value: dict, producer_spec_id: str) -> GenerationRecord:
    request = ChatRequest.model_validate(value["request"])
    usage = Usage.model_validate(value["usage"])
    return GenerationRecord(
        chunk_id=chunk_id,
        kind=kind,
        status="ok",
        failure=None,
        step_key=key,
        request_digest=request.digest,
        request=json.dumps(request.body(), sort_keys=True, ensure_ascii=False),
        content=value["content"],
        response=json.dumps(value["response"], sort_keys=True, ensure_ascii=False),
        producer_spec_id=producer_spec_id,
        **usage.model_dump(),
    )
