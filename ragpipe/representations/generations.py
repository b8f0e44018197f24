"""The record of every model call behind generated representations: one per (chunk, generated kind), verified.

``generations.parquet`` (in the representations stage output and in the bundle) holds, for every
chunk and generated kind, the exact request (JSON and its digest), the step key, the model's reply
(its text and litellm's response), the call's usage, and the outcome: ``ok`` (a representation
exists whose text is the reply parsed under the kind's contract) or ``invalid_output`` (the reply
broke the contract; no representation). Verification (``verify_generations``) re-derives nothing a
model made; it checks that the record is what the spec would ask and the reply says:

* exactly one record per chunk and generated kind of the spec, produced under the bundle's spec ID;
* the request parses, its digest recomputes, its prompt's digest is the spec's, and it equals the
  request the spec builds for that chunk's title and text; the step key recomputes from it;
* the reply text is the response's message, the tokens are the response's usage, the model is the
  request's;
* an ``ok`` reply parses under the contract (its text, returned, must then be a representation's);
  an ``invalid_output`` reply does not, with the recorded reason;
* a chunk the spec's disclosure keeps from the kind's endpoint has exactly the ``withheld`` record
  (nothing sent) and every other chunk has no such record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, ValidationError

from ragpipe.chunking.models import Chunk
from ragpipe.corpus.models import Document
from ragpipe.representations.generate import (
    InvalidOutput,
    chat_request,
    generation_key,
    parse_reply,
    prompt_of,
)
from ragpipe.spec import GeneratedKindSpec, RepresentationSpec, content_digest_of
from ragpipe.work.chat import ChatRequest
from ragpipe.work.usage import Usage

GENERATIONS_FILE = "generations.parquet"


class GenerationRecord(Usage):
    """One chunk's generation for one kind: the call's evidence, or why there was none (an invalid
    reply's broken rule, a withheld chunk's disclosure rule), and the call's ``Usage``."""

    chunk_id: str
    kind: str
    status: str = Field(pattern=r"^(ok|invalid_output|withheld)$")
    failure: str | None  # the broken rule of an invalid reply; why a withheld chunk was not sent
    step_key: str
    request_digest: str
    request: str  # the request's exact JSON
    content: str  # the reply's text
    response: str  # litellm's response, JSON
    producer_spec_id: str


# The record's own fields, then the usage's: the column order of every generations file written.
GENERATIONS_SCHEMA = pa.schema(
    [
        (name, pa.int64() if name.endswith(("_tokens", "_ms", "_micros")) else pa.string())
        for name in [*(n for n in GenerationRecord.model_fields if n not in Usage.model_fields), *Usage.model_fields]
    ]
)


def write_generations(path: Path, records: list[GenerationRecord]) -> None:
    rows = [r.model_dump() for r in records]
    pq.write_table(pa.Table.from_pylist(rows, schema=GENERATIONS_SCHEMA), path)


def read_generations(path: Path) -> list[GenerationRecord]:
    """The records of ``path``; ``ValueError`` naming the row when one is not a record."""
    rows = pq.read_table(path, schema=GENERATIONS_SCHEMA).to_pylist()
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(GenerationRecord.model_validate(row))
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(
                f"{GENERATIONS_FILE}: row {i}: {'.'.join(map(str, first['loc']))}: {first['msg']}"
            ) from None
    return out


def verify_generations(
    documents: list[Document],
    chunks: list[Chunk],
    spec: RepresentationSpec,
    producer_spec_id: str,
    records: list[GenerationRecord],
) -> tuple[dict[tuple[str, str], str], list[str]]:
    """(the generated texts by (chunk, kind), problems) — module docstring for the rules."""
    titles = {d.document_id: d.title for d in documents}
    scopes = {d.document_id: d.access_scopes for d in documents}
    by_chunk = {c.chunk_id: c for c in chunks}
    texts: dict[tuple[str, str], str] = {}
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for i, record in enumerate(records):
        where = f"{GENERATIONS_FILE}: row {i} (chunk {record.chunk_id}, {record.kind})"
        coordinate = (record.chunk_id, record.kind)
        if coordinate in seen:
            problems.append(f"{where}: a second record for this chunk and kind")
            continue
        seen.add(coordinate)
        chunk = by_chunk.get(record.chunk_id)
        if chunk is None or record.kind not in spec.generated_kinds:
            problems.append(f"{where}: no such chunk and generated kind in the bundle's spec")
            continue
        kspec = spec.generated[record.kind]  # type: ignore[index]
        document_scopes = scopes.get(chunk.document_id, ())
        if not kspec.may_send(document_scopes):
            problem, text = _withheld_problem(record, kspec, document_scopes, producer_spec_id), None
        elif record.status == "withheld":
            problem, text = f"recorded withheld but the spec's disclosure lets it go to {kspec.endpoint}", None
        else:
            problem, text = _check(record, spec, titles.get(chunk.document_id, ""), chunk.text, producer_spec_id)
        if problem:
            problems.append(f"{where}: {problem}")
        elif text is not None:
            texts[coordinate] = text
    missing = [(c.chunk_id, k) for c in chunks for k in spec.generated_kinds if (c.chunk_id, k) not in seen]
    if missing:
        problems.append(f"{GENERATIONS_FILE}: no record for {len(missing)} chunk(s) and kind(s), first {missing[0]}")
    return texts, problems


def _check(
    record: GenerationRecord, spec: RepresentationSpec, title: str, chunk_text: str, producer_spec_id: str
) -> tuple[str | None, str | None]:
    """(the first broken rule or None, the representation text of an ok record)."""
    kspec = spec.generated[record.kind]  # type: ignore[index]
    if record.producer_spec_id != producer_spec_id:
        return f"produced under spec {record.producer_spec_id}, not the bundle's {producer_spec_id}", None
    try:
        request = ChatRequest.model_validate_json(record.request)
    except ValidationError:
        return "its request is not a chat request", None
    if request.digest != record.request_digest:
        return "its request does not match its request digest", None
    prompt = prompt_of(record.kind, kspec, request)
    if prompt is None or content_digest_of(prompt) != kspec.prompt_digest:
        return "its request's prompt is not the spec's (prompt digest differs)", None
    if request != chat_request(record.kind, kspec, title, chunk_text, prompt_text=prompt):
        return "its request is not the one the spec asks for this chunk", None
    if record.step_key != generation_key(record.kind, kspec, request):
        return "its step key does not recompute from its request", None
    problem = _reply_problem(record, request)
    if problem:
        return problem, None
    try:
        text = parse_reply(record.kind, kspec, record.content)
    except InvalidOutput as exc:
        if record.status == "invalid_output" and record.failure == str(exc):
            return None, None
        return f"recorded {record.status} but its reply breaks the contract: {exc}", None
    if record.status != "ok":
        return "recorded invalid_output but its reply meets the contract", None
    return None, text


def withheld_record(
    chunk_id: str, kind: str, kspec: GeneratedKindSpec, scopes: tuple[str, ...], producer_spec_id: str
) -> GenerationRecord:
    """The record of a chunk the disclosure policy keeps from the kind's endpoint: nothing was sent."""
    return GenerationRecord(
        chunk_id=chunk_id,
        kind=kind,
        status="withheld",
        failure=withheld_reason(kspec, scopes),
        step_key="",
        request_digest="",
        request="",
        content="",
        response="",
        producer_spec_id=producer_spec_id,
        provider="",
        model=kspec.model,
        input_tokens=0,
        output_tokens=0,
        latency_ms=0,
        cost_micros=0,
    )


def withheld_reason(kspec: GeneratedKindSpec, scopes: tuple[str, ...]) -> str:
    allowed = ", ".join(kspec.send_scopes or ())
    return f"scope(s) {', '.join(scopes)} may not be sent to {kspec.endpoint} (it may receive: {allowed})"


def _withheld_problem(
    record: GenerationRecord, kspec: GeneratedKindSpec, scopes: tuple[str, ...], producer_spec_id: str
) -> str | None:
    """A chunk the spec's disclosure keeps from the endpoint must have exactly the withheld record:
    anything else says its text was sent where the spec forbids."""
    expected = withheld_record(record.chunk_id, record.kind, kspec, scopes, producer_spec_id)
    if record.status != "withheld":
        return f"recorded {record.status} but the spec's disclosure forbids sending its chunk to {kspec.endpoint}"
    if record != expected:
        return "its withheld record is not the one the spec's disclosure makes (a withheld record sends nothing)"
    return None


def _reply_problem(record: GenerationRecord, request: ChatRequest) -> str | None:
    try:
        response = json.loads(record.response)
        content = response["choices"][0]["message"]["content"] or ""
        usage = response.get("usage") or {}
    except (json.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        return "its response is not a chat completion"
    if content != record.content:
        return "its reply text is not its response's message"
    if not isinstance(usage, Mapping) or (usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0) != (
        record.input_tokens,
        record.output_tokens,
    ):
        return "its token counts are not its response's usage"
    if record.model != request.model:
        return "its model is not its request's"
    return None
