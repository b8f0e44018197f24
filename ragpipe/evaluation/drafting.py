"""Drafting evaluation cases with a model: questions a chunk answers, with their required facts.

**Request.** One call per chunk (``draft_request``): a system message — the spec's prompt text, a
blank line, then the contract's instruction for ``n`` questions of at most ``max_facts`` facts —
and a user message with the document's title and the chunk's text, exactly as a generated
representation sends them (``representations.generate.generation_input``).

**Contract** ``ragpipe.case-draft/v1`` (``parse_drafts``): one JSON object with exactly the key
``cases``, a list of exactly ``n`` objects with exactly the keys ``question`` (a non-empty string
of at most ``MAX_QUESTION_CHARS`` characters) and ``required_facts`` (a list of at most
``max_facts`` strings, each non-empty and at most ``suite_rules.MAX_FACT_CHARS`` characters). The
reply is read as every contract reads it (``contract_calls.contract_json``: one Markdown fence
accepted, strict JSON, at most ``MAX_REPLY_CHARS``). An empty fact list meets the contract; such a
draft is excluded by validation ("no_facts"), never scored.

**Step.** ``draft_chunks`` runs the calls on the step machinery (``contract_calls``: cache,
leases, budget). The key is ``step_key("case-draft", 1, {draft_spec, chunk, text, endpoint})``: the
spec ID, the chunk ID, the digest of the chunk's text and the endpoint. Outcomes, one per chunk,
every one counted: ``drafted``, ``invalid_output``, ``refused``, ``provider`` and ``withheld`` — a
chunk whose document has no scope the disclosure policy lets reach the spec's endpoint
(``DraftSpec.may_send``): nothing is sent, nothing looked up. A budget stop (``BudgetExhausted``)
leaves every drafted chunk cached: the next run drafts only the rest.

**Drafts.** Question ``i`` (from 0) of a chunk becomes a case with ID ``draft-`` + the first 16 hex
digits of ``content_id("case-draft", 1, {spec, chunk, index})`` — the same on every run of the
spec — at ``target_level`` ``document`` (``expected``: the chunk's document) or ``chunk``
(``expected``: the chunk), with the reply's ``required_facts``, ``provenance {author: model, by:
<model>, model_spec_id: <spec ID>, at: <now, RFC 3339 UTC>}``, ``review: provisional`` and the tag
``drafted``. A draft is never truth until a person adjudicates it.

**Validation** (``validate_drafts``) against the bundle's document and chunk IDs: a draft whose
expected source is absent (``absent_source``), with no facts (``no_facts``), breaking a case rule
(``invalid_case``) or whose question's normal form (``audit.normal_form``) repeats an earlier draft
of the batch (``duplicate``; batch order: chunk, then index) is excluded with its reason — listed,
never written as a case. Joining a dataset (``exclude_against``), a draft is also excluded when the
dataset already holds its ID, when it duplicates an existing case, or when it leaks: a duplicate
or near duplicate (``audit.audit_cases``) of a case in another split.

**Sampling** (``choose_chunks``): ``count`` chunk IDs drawn by ``random.Random(seed)`` from the
sorted IDs, returned sorted; the same IDs, count and seed always draw the same chunks.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import Field

from ragpipe.bundle.tables import CHUNKS, DOCUMENTS, VerifiedTables
from ragpipe.evaluation.audit import AuditReport, audit_cases, normal_form
from ragpipe.evaluation.contract_calls import ContractCall, ContractStep, contract_json, failure_status, run_calls
from ragpipe.evaluation.draft_spec import DraftSpec
from ragpipe.evaluation.suite import Case, SuiteError
from ragpipe.evaluation.suite_rules import MAX_FACT_CHARS, check_case
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.models import FrozenModel
from ragpipe.representations.generate import generation_input
from ragpipe.spec import content_digest_of
from ragpipe.work.admission import Budget
from ragpipe.work.chat import ChatMessage, ChatRequest
from ragpipe.work.keys import step_key
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.runner import StepReport
from ragpipe.work.usage import PriceTable

DRAFT_STEP = "case-draft"
DRAFT_STEP_VERSION = 1
DRAFT_TAG = "drafted"
MAX_REPLY_CHARS = 65_536
MAX_QUESTION_CHARS = 500
Status = Literal["drafted", "invalid_output", "refused", "provider", "withheld"]
STATUSES: tuple[str, ...] = ("drafted", "invalid_output", "refused", "provider", "withheld")
REASONS: tuple[str, ...] = ("absent_source", "no_facts", "invalid_case", "duplicate", "already_in_dataset", "leakage")
TargetLevel = Literal["document", "chunk"]
INSTRUCTION = (
    'Reply with one JSON object and nothing else: {{"cases": [{{"question": string, "required_facts": '
    "[string, ...]}}, ...]}} holding exactly {n} cases; each question at most {max_chars} characters, "
    "each with at most {max_facts} required facts, every fact a non-empty statement."
)


class InvalidDraft(ValueError):
    """A reply that breaks the draft contract; ``str(e)`` is the rule, one line."""


class DraftChunk(FrozenModel):
    """One chunk to draft from, as plain values: its document's scopes decide whether it may be
    sent (they are never sent)."""

    chunk_id: str = Field(min_length=1)
    document_id: str = Field(min_length=1)
    title: str
    text: str
    access_scopes: tuple[str, ...]


class DraftedQuestion(FrozenModel):
    question: str
    required_facts: tuple[str, ...]


def draft_request(spec: DraftSpec, title: str, chunk_text: str) -> ChatRequest:
    """The chat request that asks ``spec``'s model for one chunk's drafts (module docstring)."""
    instruction = INSTRUCTION.format(n=spec.n, max_chars=MAX_QUESTION_CHARS, max_facts=spec.max_facts)
    return ChatRequest(
        model=spec.model,
        messages=(
            ChatMessage(role="system", content=spec.prompt_text.rstrip() + "\n\n" + instruction),
            ChatMessage(role="user", content=generation_input(title, chunk_text)),
        ),
        temperature=spec.temperature,
        max_tokens=spec.max_tokens,
        seed=spec.seed,
        response_format="json_object",
    )


def _strings(value: object, where: str, limit: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidDraft(f"{where} must be a list of strings")
    for i, text in enumerate(value, 1):
        if not text.strip():
            raise InvalidDraft(f"{where}[{i}] is empty")
        if len(text) > limit:
            raise InvalidDraft(f"{where}[{i}] has {len(text)} characters, more than {limit}")
    return value


def parse_drafts(reply: str, n: int, max_facts: int) -> tuple[DraftedQuestion, ...]:
    """The drafts of a reply, or ``InvalidDraft`` naming the first broken rule (module docstring)."""
    obj = contract_json(reply, MAX_REPLY_CHARS, InvalidDraft)
    if not isinstance(obj, dict) or set(obj) != {"cases"}:
        raise InvalidDraft("reply must be an object with exactly the key cases")
    cases = obj["cases"]
    if not isinstance(cases, list):
        raise InvalidDraft("cases must be a list")
    if len(cases) != n:
        raise InvalidDraft(f"cases has {len(cases)} items, {n} were asked for")
    out = []
    for i, case in enumerate(cases, 1):
        if not isinstance(case, dict) or set(case) != {"question", "required_facts"}:
            raise InvalidDraft(f"cases[{i}] must be an object with exactly the keys question, required_facts")
        question = case["question"]
        if not isinstance(question, str) or not question.strip():
            raise InvalidDraft(f"cases[{i}].question must be a non-empty string")
        if len(question) > MAX_QUESTION_CHARS:
            raise InvalidDraft(f"cases[{i}].question has {len(question)} characters, more than {MAX_QUESTION_CHARS}")
        facts = _strings(case["required_facts"], f"cases[{i}].required_facts", MAX_FACT_CHARS)
        if len(facts) > max_facts:
            raise InvalidDraft(f"cases[{i}].required_facts has {len(facts)} facts, at most {max_facts} allowed")
        out.append(DraftedQuestion(question=" ".join(question.split()), required_facts=tuple(facts)))
    return tuple(out)


@dataclass(frozen=True)
class DraftInput(ContractCall):
    """One chunk's call: its key's inputs, the request and the contract's bounds."""

    n: int
    max_facts: int

    def parse(self, content: str) -> tuple[DraftedQuestion, ...]:
        return parse_drafts(content, self.n, self.max_facts)


def draft_key_inputs(spec: DraftSpec, chunk: DraftChunk) -> dict:
    return {
        "draft_spec": spec.spec_id,
        "chunk": chunk.chunk_id,
        "text": content_digest_of(chunk.text),
        "endpoint": spec.endpoint,
    }


def draft_key(spec: DraftSpec, chunk: DraftChunk) -> str:
    """The step key of drafting from ``chunk`` (module docstring)."""
    return step_key(DRAFT_STEP, DRAFT_STEP_VERSION, draft_key_inputs(spec, chunk))


def draft_input(spec: DraftSpec, chunk: DraftChunk) -> tuple[str, DraftInput]:
    """The key and step input of one chunk."""
    inputs = draft_key_inputs(spec, chunk)
    request = draft_request(spec, chunk.title, chunk.text)
    return step_key(DRAFT_STEP, DRAFT_STEP_VERSION, inputs), DraftInput(inputs, request, spec.n, spec.max_facts)


def draft_step(spec: DraftSpec, prices: PriceTable, api_key: str | None = None) -> ContractStep:
    """The drafting step: one call per chunk; a budget stop says to raise ``--budget-micros``."""
    return ContractStep(DRAFT_STEP, "--budget-micros", spec.api_base, spec.timeout_seconds, prices, api_key)


def draft_case_id(spec_id: str, chunk_id: str, index: int) -> str:
    """``draft-<16 hex>``: the same spec, chunk and question index make the same ID on every run."""
    digest = content_id("case-draft", 1, {"spec": spec_id, "chunk": chunk_id, "index": index})
    return "draft-" + digest.split(":", 1)[1][:16]


def draft_case(
    spec: DraftSpec, chunk: DraftChunk, index: int, drafted: DraftedQuestion, target_level: TargetLevel, at: str
) -> dict:
    """Draft ``index`` of ``chunk`` as a case's fields (module docstring); not yet checked (see
    ``validate_drafts``)."""
    source = chunk.document_id if target_level == "document" else chunk.chunk_id
    return {
        "id": draft_case_id(spec.spec_id, chunk.chunk_id, index),
        "query": drafted.question,
        "target_level": target_level,
        "expected": [source],
        "required_facts": list(drafted.required_facts),
        "tags": [DRAFT_TAG],
        "provenance": {"author": "model", "by": spec.model, "model_spec_id": spec.spec_id, "at": at},
        "review": "provisional",
    }


@dataclass(frozen=True)
class DraftOutcome:
    """What became of one chunk: its drafts (``drafted``), or how it failed: ``kind`` (the
    provider failure's kind, or the status itself) and a one-line ``message``."""

    chunk_id: str
    key: str
    status: Status
    drafts: tuple[dict, ...] = ()
    kind: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class DraftRun:
    outcomes: list[DraftOutcome]  # one per chunk, in chunk order
    report: StepReport | None  # None when every chunk was withheld

    @property
    def drafts(self) -> list[dict]:
        return [d for o in self.outcomes for d in o.drafts]

    def counts(self) -> dict[str, int]:
        return {s: sum(o.status == s for o in self.outcomes) for s in STATUSES}


def now_utc() -> str:
    """Now as an RFC 3339 UTC timestamp to the second (``2026-12-07T21:08:01Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def draft_chunks(
    spec: DraftSpec,
    chunks: Sequence[DraftChunk],
    cache_root: Path,
    policy: ExecutionPolicy,
    prices: PriceTable,
    *,
    target_level: TargetLevel = "document",
    budget: Budget | None = None,
    api_key: str | None = None,
    at: str | None = None,
) -> DraftRun:
    """One outcome per chunk (module docstring); ``at`` (default: now) stamps the drafts'
    provenance. Raises ``BudgetExhausted`` (drafted chunks stay cached) or
    ``BudgetUnenforceable`` (a budget and a model without a price)."""
    at = at or now_utc()
    keyed = [(chunk, *draft_input(spec, chunk)) for chunk in chunks]
    sent = [(key, inp) for chunk, key, inp in keyed if spec.may_send(chunk.access_scopes)]
    step = draft_step(spec, prices, api_key)
    results = run_calls(step, DRAFT_STEP_VERSION, "a set of drafts", sent, cache_root, policy, budget)
    outcomes = []
    for chunk, key, inp in keyed:
        if not spec.may_send(chunk.access_scopes):
            why = (
                f"chunk {chunk.chunk_id} (scopes {', '.join(chunk.access_scopes) or 'none'}) may not be sent to "
                f"{spec.endpoint} (it may receive {', '.join(spec.send_scopes)})"
            )
            outcomes.append(DraftOutcome(chunk.chunk_id, key, "withheld", kind="withheld", message=why))
        elif key in results.values:
            drafted = inp.parse(results.values[key]["content"])
            cases = tuple(draft_case(spec, chunk, i, d, target_level, at) for i, d in enumerate(drafted))
            outcomes.append(DraftOutcome(chunk.chunk_id, key, "drafted", cases))
        else:
            f = results.failures[key]
            status = failure_status(f.kind)
            outcomes.append(
                DraftOutcome(chunk.chunk_id, key, status, kind=f.kind, message=f.message)  # type: ignore[arg-type]
            )
    return DraftRun(outcomes, results.report)


@dataclass(frozen=True)
class Exclusion:
    """A draft left out, with a stable ``reason`` code and a one-line ``message``."""

    case_id: str
    reason: str
    message: str


def validate_drafts(
    drafts: Iterable[dict], document_ids: set[str], chunk_ids: set[str]
) -> tuple[list[Case], list[Exclusion]]:
    """The drafts that may be put up for adjudication, as cases, and the others with their
    reasons (module docstring), both in batch order."""
    kept: list[Case] = []
    excluded: list[Exclusion] = []
    seen: dict[str, str] = {}  # normal form → the draft that asked it first
    for draft in drafts:
        case_id = draft["id"]
        known = document_ids if draft["target_level"] == "document" else chunk_ids
        absent = [s for s in draft["expected"] if s not in known]
        form = normal_form(draft["query"])
        if absent:
            excluded.append(
                Exclusion(
                    case_id, "absent_source", f"expected {draft['target_level']} {absent[0]} is not in the bundle"
                )
            )
            continue
        if not draft["required_facts"]:
            excluded.append(Exclusion(case_id, "no_facts", "the model gave no required facts"))
            continue
        if form in seen:
            excluded.append(Exclusion(case_id, "duplicate", f"asks what {seen[form]} asks ({form!r})"))
            continue
        try:
            check_case(draft)  # the suite's rules, as one line (a Case would wrap it in pydantic's error)
        except SuiteError as exc:
            excluded.append(Exclusion(case_id, "invalid_case", str(exc)))
            continue
        seen[form] = case_id
        kept.append(Case(**draft))
    return kept, excluded


def choose_chunks(chunk_ids: Iterable[str], count: int, seed: int) -> list[str]:
    """``count`` chunk IDs (all of them when there are fewer) drawn by a seeded RNG from the sorted
    IDs, returned sorted (module docstring)."""
    ordered = sorted(set(chunk_ids))
    if count < 1:
        raise ValueError(f"--chunks must be at least 1, got {count}")
    return sorted(random.Random(seed).sample(ordered, min(count, len(ordered))))


@dataclass(frozen=True)
class BundleCorpus:
    """What drafting reads of a verified bundle: every chunk to draft from, and the IDs drafts
    are validated against."""

    chunks: dict[str, DraftChunk]  # chunk ID → chunk
    document_ids: set[str]

    @property
    def chunk_ids(self) -> set[str]:
        return set(self.chunks)

    def select(self, count: int | None, seed: int, documents: Sequence[str] = ()) -> list[DraftChunk]:
        """The chunks to draft from: every chunk of ``documents`` (each must be in the bundle), or
        ``count`` seeded-random chunks (``choose_chunks``), or every chunk; in chunk ID order."""
        if documents:
            absent = [d for d in documents if d not in self.document_ids]
            if absent:
                raise ValueError(f"--documents: document {absent[0]} is not in the bundle")
            wanted = set(documents)
            return [c for _, c in sorted(self.chunks.items()) if c.document_id in wanted]
        ids = sorted(self.chunks) if count is None else choose_chunks(self.chunks, count, seed)
        return [self.chunks[i] for i in ids]


def bundle_corpus(tables: VerifiedTables) -> BundleCorpus:
    """The chunks (with their documents' titles and scopes) of a verified bundle's tables."""
    documents = tables.table(DOCUMENTS, ["document_id", "title", "access_scopes"]).to_pylist()
    by_id = {d["document_id"]: d for d in documents}
    chunks = {}
    for row in tables.table(CHUNKS, ["chunk_id", "document_id", "text"]).to_pylist():
        document = by_id[row["document_id"]]
        chunks[row["chunk_id"]] = DraftChunk(
            chunk_id=row["chunk_id"],
            document_id=row["document_id"],
            title=document["title"],
            text=row["text"],
            access_scopes=tuple(document["access_scopes"]),
        )
    return BundleCorpus(chunks, set(by_id))


def exclude_against(
    drafts: Sequence[Case], existing: Sequence[Case], splits: Mapping[str, str]
) -> tuple[list[Case], list[Exclusion], AuditReport]:
    """The drafts that may join a dataset holding ``existing`` (its cases not rejected), and the
    others with their reasons, in draft order; and the audit (``audit.audit_cases``) of drafts and
    existing cases together under ``splits`` (case ID → split). A draft is excluded when

    * its ID is already in the dataset (``already_in_dataset``: the same spec drafted it before);
    * its question is a duplicate of an existing case's (``duplicate``);
    * it leaks (``leakage``): it is a duplicate or near duplicate of an existing case, or of an
      earlier draft kept, in another split — the same question in ``dev`` and ``holdout`` lets a
      change tuned on one pass the other."""
    known = {c.id for c in existing}
    fresh = [d for d in drafts if d.id not in known]
    excluded = [
        Exclusion(d.id, "already_in_dataset", "the dataset already holds this case") for d in drafts if d.id in known
    ]
    report = audit_cases([*existing, *fresh], splits)
    partners: dict[str, list[tuple[str, str]]] = {}
    for group in report.duplicates:
        for a in group:
            partners.setdefault(a, []).extend((b, "duplicate") for b in group if b != a)
    for leak in report.leakage:
        partners.setdefault(leak.a, []).append((leak.b, f"leak:{leak.kind}"))
        partners.setdefault(leak.b, []).append((leak.a, f"leak:{leak.kind}"))
    kept: list[Case] = []
    kept_ids: set[str] = set()
    for draft in fresh:
        mine = sorted(partners.get(draft.id, []))
        leaks = [(o, k) for o, k in mine if k.startswith("leak:") and (o in known or o in kept_ids)]
        copies = [o for o, k in mine if k == "duplicate" and o in known]
        if leaks:
            other, kind = leaks[0]
            message = (
                f"{kind.removeprefix('leak:').replace('_', ' ')} of case {other} ({splits[other]}) "
                f"in another split ({splits[draft.id]})"
            )
            excluded.append(Exclusion(draft.id, "leakage", message))
        elif copies:
            excluded.append(Exclusion(draft.id, "duplicate", f"asks what case {copies[0]} asks"))
        else:
            kept.append(draft)
            kept_ids.add(draft.id)
    return kept, excluded, report
