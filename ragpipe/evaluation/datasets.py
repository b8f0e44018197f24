"""Datasets: cases people adjudicate, frozen into immutable, content-addressed versions (docs/lab.md).

A dataset lives in ``<home>/datasets/<name>/``: ``ledger.jsonl`` (``kernel.ledger``, domain
``dataset-record`` v1, hash-chained, one writer at a time under ``.lock``) and ``versions/<n>.json``.
Its records, each payload checked against its model when read:

* ``created`` — the release target whose approvers decide, the splits and their fractions, and a
  random salt. A case's split is ``split_of(salt, case_id)``: fixed by its ID, so a case never
  moves between splits from one version to the next (a case carrying a ``split`` of its own is
  refused: the dataset assigns it);
* ``cases_added`` — cases (canonical suite cases, every rule of ``suite_rules`` checked) put up for
  adjudication, drafted by a model or written by a person; IDs are never reused;
* ``adjudicated`` — one signed decision on one case: ``accept``, ``edit`` (the edited fields; the
  result must meet every case rule and keep its ID) or ``reject``;
* ``version_registered`` — a version's number and content ID.

**What a signature binds.** The approver signs ``adjudication_statement``: the dataset's name and
the hash of its ``created`` record (so its salt, splits and target: a dataset recreated under the
same name, or with another salt or target, accepts none of the old decisions), the case, the hash
of the case's previous record (its ``cases_added`` record or its previous decision: a decision
can be neither replayed, reordered nor applied to a case someone decided on meanwhile), the digest
of the case decided on, the decision, the digest of the resulting case, who and when. Because
ledger hashes chain, a decision also pins every record before it. What no signature can stop is
the ledger's tail being cut off; the keyed head seal does (docs/trust.md).

**Versions.** ``freeze`` makes the next version from the ledger alone: every case whose latest
decision is ``accept`` or ``edit`` *and verifies* against the target's approvers now (a removed or
rotated key revokes what it signed: such a case counts as ``unverified`` until decided again),
with its split; pending, rejected and unverified cases are left out and counted. It refuses when
the cases leak between splits (``audit``: the same or a near-identical question in two splits) or
when nothing changed since the last version. The version file is ``canonical_bytes`` of its body;
its ID is ``content_id("dataset-version", 1, body)``. ``load_version`` rebuilds the body from the
ledger up to the version's record and requires the file's bytes to be exactly it, so the file can
change nothing — which cases, their content, their splits — that the signed ledger does not say.

Approvers are passed in (``{name: "ed25519:…"}``): this floor does not read release targets.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError, field_validator

from ragpipe.evaluation.audit import audit_cases
from ragpipe.evaluation.suite import Case, Suite
from ragpipe.evaluation.suite_rules import SuiteError
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.ledger import Domain, Ledger, LedgerError, Record, head_path, read_ledger
from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.signatures import sign, verify
from ragpipe.kernel.workspace import Workspace

DOMAIN = Domain("dataset-record", 1)
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
APPROVER = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}\Z")  # release targets' approver names
DIGEST = r"^sha256:[0-9a-f]{64}$"  # pydantic's (Rust) regex: $ is the end of the text only
MAX_NOTE_CHARS = 500
MAX_VERSION_BYTES = 256 * 2**20
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
Decision = Literal["accept", "edit", "reject"]
Status = Literal["pending", "accepted", "rejected"]


class DatasetError(ValueError):
    """A dataset refused an operation; ``str(e)`` names the dataset (or file) and the rule."""


class StaleDecision(DatasetError):
    """The case a decision names is no longer the case's latest record (someone decided meanwhile)."""


class _Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Created(_Payload):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    target: str = Field(min_length=1, max_length=200)
    splits: tuple[tuple[StrictStr, StrictFloat], ...] = Field(min_length=1)
    salt: str = Field(pattern=r"^[0-9a-f]{32}$")

    @field_validator("splits")
    @classmethod
    def _splits(cls, splits: tuple[tuple[str, float], ...]) -> tuple[tuple[str, float], ...]:
        names = [name for name, _ in splits]
        if len(set(names)) != len(names):
            raise ValueError("a split is named twice")
        for name, fraction in splits:
            if not NAME.match(name):
                raise ValueError(f"split name {name!r}: 1-64 of a-z 0-9 . _ -")
            if not (math.isfinite(fraction) and 0 < fraction <= 1):
                raise ValueError(f"split {name!r}: a fraction in (0, 1], not {fraction}")
        if abs(sum(f for _, f in splits) - 1) > 1e-9:
            raise ValueError(f"the split fractions sum to {sum(f for _, f in splits):g}, not 1")
        return splits


class CasesAdded(_Payload):
    cases: tuple[dict[str, Any], ...] = Field(min_length=1)


class Adjudicated(_Payload):
    created: str = Field(pattern=DIGEST)
    case_id: str
    after: str = Field(pattern=DIGEST)
    from_digest: str = Field(pattern=DIGEST)
    decision: Decision
    result: dict[str, Any] | None
    result_digest: str | None = Field(pattern=DIGEST)
    by: str = Field(pattern=r"^[a-z0-9][a-z0-9._@-]{0,63}$")
    at: str = Field(min_length=1, max_length=64)
    note: str = Field(max_length=MAX_NOTE_CHARS)
    signature: str = Field(max_length=200)


class VersionRegistered(_Payload):
    number: StrictInt = Field(ge=1)
    version_id: str = Field(pattern=DIGEST)
    cases: str = Field(pattern=DIGEST)  # the cases and splits it holds (``_cases_digest``)


PAYLOADS: dict[str, type[_Payload]] = {
    "created": Created,
    "cases_added": CasesAdded,
    "adjudicated": Adjudicated,
    "version_registered": VersionRegistered,
}


def case_digest(case: Mapping[str, Any]) -> str:
    """Content ID of one canonical case (``Case.digest``: what a decision names)."""
    return content_id("suite-case", 1, dict(case))


def split_of(salt: str, case_id: str, splits: tuple[tuple[str, float], ...]) -> str:
    """The split of ``case_id``: SHA-256 of salt and ID as a number in [0, 1), placed against the
    cumulative fractions in the order the dataset lists them (the last split takes the rest)."""
    point = int.from_bytes(hashlib.sha256(f"{salt}\n{case_id}".encode()).digest()[:8], "big") / 2**64
    total = 0.0
    for name, fraction in splits[:-1]:
        total += fraction
        if point < total:
            return name
    return splits[-1][0]


def adjudication_statement(
    dataset: str,
    created: str,
    case_id: str,
    after: str,
    from_digest: str,
    decision: str,
    result_digest: str | None,
    by: str,
    at: str,
) -> bytes:
    """The bytes an approver signs for one decision (RFC 8785 JSON; module docstring)."""
    return canonical_bytes(
        {
            "domain": "ragpipe.case-adjudication",
            "version": 1,
            "dataset": dataset,
            "created": created,
            "case_id": case_id,
            "after": after,
            "from_digest": from_digest,
            "decision": decision,
            "result_digest": result_digest,
            "by": by,
            "at": at,
        }
    )


def _statement_of(name: str, p: Adjudicated) -> bytes:
    return adjudication_statement(
        name, p.created, p.case_id, p.after, p.from_digest, p.decision, p.result_digest, p.by, p.at
    )


@dataclass
class CaseState:
    """One case of a dataset as its records leave it."""

    case: dict[str, Any]  # the current canonical case (after the latest edit)
    digest: str
    last: str  # hash of the case's latest record: its cases_added record or its latest decision
    status: Status = "pending"
    decision: Adjudicated | None = None  # the latest decision
    decision_seq: int | None = None


@dataclass
class DatasetState:
    created: Created
    created_hash: str
    cases: dict[str, CaseState] = field(default_factory=dict)
    versions: list[tuple[int, str]] = field(default_factory=list)  # (number, version ID)

    @property
    def name(self) -> str:
        return self.created.name

    @property
    def target(self) -> str:
        return self.created.target

    @property
    def splits(self) -> tuple[tuple[str, float], ...]:
        return self.created.splits

    def split(self, case_id: str) -> str:
        return split_of(self.created.salt, case_id, self.created.splits)


@dataclass(frozen=True)
class DatasetVersion:
    name: str
    number: int
    id: str
    cases: tuple[dict[str, Any], ...]
    splits: dict[str, str]  # case ID → split

    def suite(self, split: str | None = None) -> Suite:
        """The version's cases as a suite (``split``: only that split's), each tagged with its split."""
        chosen = [c for c in self.cases if split is None or self.splits[c["id"]] == split]
        if not chosen:
            raise DatasetError(f"dataset {self.name!r} version {self.number}: no case in split {split!r}")
        return Suite.of(
            (Case(**{**c, "split": [self.splits[c["id"]]]}) for c in chosen),
            f"dataset:{self.name}@{self.number}" + (f":{split}" if split else ""),
        )


def dataset_dir(home: Path, name: str) -> Path:
    if not isinstance(name, str) or not NAME.match(name):
        raise DatasetError(f"dataset name {name!r}: 1-64 of a-z 0-9 . _ - (starting with a letter or digit)")
    return Workspace(Path(home)).datasets / name


def _ledger_path(home: Path, name: str) -> Path:
    return dataset_dir(home, name) / "ledger.jsonl"


def _rule(exc: Exception) -> str:
    """One line for a refused case or payload: pydantic's first error with its field, else the text."""
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error.get("loc", ()))
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        return f"{where}: {message}" if where else message
    return str(exc).splitlines()[0]


def _check_case(value: Any, where: str) -> dict[str, Any]:
    """The canonical form of a case value, every suite rule checked; a dataset assigns splits."""
    if not isinstance(value, dict):
        raise DatasetError(f"{where}: a case is a JSON object")
    if value.get("split"):
        raise DatasetError(f"{where}: the dataset assigns each case its split by ID; remove 'split'")
    try:
        return Case(**value).canonical()
    except (SuiteError, ValueError, TypeError) as exc:
        rule = _rule(exc).removeprefix(f"case {value.get('id')!r}: ")  # a card rule names the case already
        raise DatasetError(f"{where}: {rule}") from None


def _payload(record: Record, where: str) -> _Payload:
    model = PAYLOADS.get(record.kind)
    if model is None:
        raise DatasetError(f"{where}: unknown record kind {record.kind!r}")
    try:
        return model.model_validate(record.payload)
    except ValidationError as exc:
        raise DatasetError(f"{where}: {record.kind}: {_rule(exc)}") from None


def _step(state: DatasetState | None, record: Record, where: str) -> DatasetState:
    """Fold one record into the state: the rules every writer checked, so a ledger edited by hand
    that breaks one is refused here with its record number. Signatures are checked where
    approvers are known (``freeze``, ``load_version``, ``record_decision``)."""
    p = _payload(record, where)
    if isinstance(p, Created):
        if state is not None or record.seq != 1:
            raise DatasetError(f"{where}: a dataset is created once, by its first record")
        return DatasetState(p, record.hash)
    if state is None:
        raise DatasetError(f"{where}: {record.kind} before the dataset was created")
    if isinstance(p, CasesAdded):
        for value in p.cases:
            case = _check_case(value, f"{where}: case {value.get('id')!r}")
            if case != value or case["id"] in state.cases:
                raise DatasetError(f"{where}: case {value.get('id')!r} is not canonical or already in the dataset")
            state.cases[case["id"]] = CaseState(case, case_digest(case), record.hash)
    elif isinstance(p, Adjudicated):
        entry = state.cases.get(p.case_id)
        if entry is None or p.created != state.created_hash or p.after != entry.last or p.from_digest != entry.digest:
            raise DatasetError(
                f"{where}: the decision on case {p.case_id!r} does not follow the case's previous record"
            )
        if p.decision == "reject":
            if p.result is not None or p.result_digest is not None:
                raise DatasetError(f"{where}: a rejection has no result")
            entry.status = "rejected"
        else:
            result = _check_case(p.result, f"{where}: result")
            if result != p.result or case_digest(result) != p.result_digest or result["id"] != p.case_id:
                raise DatasetError(f"{where}: the result of the decision on case {p.case_id!r} does not match")
            entry.case, entry.digest, entry.status = result, case_digest(result), "accepted"
        entry.last, entry.decision, entry.decision_seq = record.hash, p, record.seq
    elif isinstance(p, VersionRegistered):
        expected = len(state.versions) + 1
        if p.number != expected:
            raise DatasetError(f"{where}: version {p.number} registered where {expected} was next")
        state.versions.append((p.number, p.version_id))
    return state


def _fold(records: Iterable[Record], path: Path) -> DatasetState:
    state: DatasetState | None = None
    for record in records:
        state = _step(state, record, f"{path}: record {record.seq}")
    if state is None:
        raise DatasetError(f"{path}: the dataset has no records")
    return state


def read_dataset(home: Path, name: str) -> tuple[DatasetState, tuple[Record, ...]]:
    """The dataset's state and records, the ledger verified (chain, head, seal)."""
    path = _ledger_path(home, name)
    try:
        read = read_ledger(path, DOMAIN, missing=f"no dataset {name!r}")
    except LedgerError as exc:
        raise DatasetError(str(exc)) from None
    return _fold(read.records, path), read.records


def _writer(home: Path, name: str) -> Ledger:
    try:
        return Ledger.open(_ledger_path(home, name), DOMAIN, missing=f"no dataset {name!r}")
    except LedgerError as exc:
        raise DatasetError(str(exc)) from None


def _lock(home: Path, name: str):
    return file_lock(dataset_dir(home, name) / ".lock", exclusive=True)


def create_dataset(
    home: Path, name: str, target: str, splits: Mapping[str, float], on_step: Callable[[str], None] | None = None
) -> DatasetState:
    """A new dataset whose cases ``target``'s approvers adjudicate, split by ``splits`` (fractions
    summing to 1, in the order given). A ledger a crash left empty (created, never written) is
    taken as no dataset."""
    directory = dataset_dir(home, name)
    try:
        created = Created(
            name=name, target=target, splits=tuple((s, float(f)) for s, f in splits.items()), salt=os.urandom(16).hex()
        )
    except (ValidationError, TypeError, ValueError) as exc:
        raise DatasetError(f"dataset {name!r}: {_rule(exc)}") from None
    directory.mkdir(parents=True, exist_ok=True)
    path = _ledger_path(home, name)
    with _lock(home, name):
        if path.exists() and path.stat().st_size == 0 and not head_path(path).exists():
            path.unlink()  # a crash between creating the file and its first record
        try:
            ledger = Ledger.create(path, DOMAIN)
        except LedgerError:
            raise DatasetError(f"dataset {name!r} already exists") from None
        if on_step is not None:
            on_step("created")
        with ledger:
            record = ledger.append("created", created.model_dump(mode="json"))
    return _fold([record], path)


def add_cases(home: Path, name: str, cases: Iterable[Case]) -> int:
    """Put ``cases`` up for adjudication (all or none: an ID already in the dataset is refused)."""
    canonical = [_check_case(c.canonical(), f"dataset {name!r}: case {c.id!r}") for c in cases]
    if not canonical:
        raise DatasetError(f"dataset {name!r}: no cases to add")
    with _lock(home, name), _writer(home, name) as ledger:
        state = _fold(ledger.records, ledger.path)
        seen: set[str] = set()
        for case in canonical:
            if case["id"] in state.cases or case["id"] in seen:
                raise DatasetError(f"dataset {name!r}: case {case['id']!r} is already in the dataset")
            seen.add(case["id"])
        ledger.append("cases_added", {"cases": canonical})
    return len(canonical)


@dataclass(frozen=True)
class Proposal:
    """What an approver is asked to sign for one decision, and the case it leads to."""

    dataset: str
    created: str
    case_id: str
    after: str
    from_digest: str
    decision: Decision
    result: dict[str, Any] | None
    result_digest: str | None
    by: str
    at: str

    def statement(self) -> bytes:
        return adjudication_statement(
            self.dataset,
            self.created,
            self.case_id,
            self.after,
            self.from_digest,
            self.decision,
            self.result_digest,
            self.by,
            self.at,
        )


def propose(
    home: Path, name: str, case_id: str, decision: Decision, by: str, edited: Mapping[str, Any] | None = None
) -> Proposal:
    """The decision ``by`` would sign on ``case_id`` as it is now (``edited``: the fields an
    ``edit`` changes; the ID cannot change, nor the split, which the dataset assigns)."""
    if not APPROVER.match(by):
        raise DatasetError(f"approver {by!r}: a name is 1-64 of a-z 0-9 . _ @ - (starting with a letter or digit)")
    if decision not in ("accept", "edit", "reject"):
        raise DatasetError(f"decision {decision!r}: one of accept, edit, reject")
    if (decision == "edit") != bool(edited):
        raise DatasetError("an edit names the fields it changes; accept and reject change none")
    state, _ = read_dataset(home, name)
    entry = state.cases.get(case_id)
    if entry is None:
        raise DatasetError(f"dataset {name!r}: no case {case_id!r}")
    result: dict[str, Any] | None = None
    if decision != "reject":
        edited = dict(edited or {})
        if edited.get("id", case_id) != case_id:
            raise DatasetError(f"case {case_id!r}: an edit cannot change the case ID")
        # a person decided: a draft's review state becomes adjudicated
        changes = {**edited, **({"review": "adjudicated"} if "review" in entry.case else {})}
        result = _check_case({**entry.case, **changes}, f"case {case_id!r}")
        if decision == "edit" and result == _check_case(
            {**entry.case, **({"review": "adjudicated"} if "review" in entry.case else {})}, f"case {case_id!r}"
        ):
            raise DatasetError(f"case {case_id!r}: the edit changes nothing (accept it instead)")
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    digest = None if result is None else case_digest(result)
    return Proposal(name, state.created_hash, case_id, entry.last, entry.digest, decision, result, digest, by, at)


def record_decision(
    home: Path, proposal: Proposal, signature: str, approvers: Mapping[str, str], note: str = ""
) -> Record:
    """Append ``proposal`` signed with ``signature``: refused unless its approver is listed and the
    signature verifies, and unless the case's latest record is still the one it names (under the
    dataset's lock: a decision on a case someone decided on meanwhile is stale)."""
    if _CONTROL.search(note) or len(note) > MAX_NOTE_CHARS:
        raise DatasetError(f"the note must be at most {MAX_NOTE_CHARS} characters without control characters")
    key = approvers.get(proposal.by)
    if key is None:
        listed = ", ".join(sorted(approvers)) or "none"
        raise DatasetError(f"{proposal.by!r} is not an approver of this dataset's target (approvers: {listed})")
    if not verify(key, proposal.statement(), signature):
        raise DatasetError(f"decision on case {proposal.case_id!r} by {proposal.by!r}: the signature does not verify")
    with _lock(home, proposal.dataset), _writer(home, proposal.dataset) as ledger:
        state = _fold(ledger.records, ledger.path)
        entry = state.cases.get(proposal.case_id)
        if state.created_hash != proposal.created or entry is None or entry.last != proposal.after:
            raise StaleDecision(
                f"dataset {proposal.dataset!r}: case {proposal.case_id!r} changed since this decision was "
                "proposed; decide on it as it is now"
            )
        payload = Adjudicated(
            created=proposal.created,
            case_id=proposal.case_id,
            after=proposal.after,
            from_digest=proposal.from_digest,
            decision=proposal.decision,
            result=proposal.result,
            result_digest=proposal.result_digest,
            by=proposal.by,
            at=proposal.at,
            note=note,
            signature=signature,
        )
        return ledger.append("adjudicated", payload.model_dump(mode="json"))


def adjudicate(
    home: Path,
    name: str,
    case_id: str,
    decision: Decision,
    *,
    by: str,
    key,
    approvers: Mapping[str, str],
    edited: Mapping[str, Any] | None = None,
    note: str = "",
) -> Record:
    """Propose, sign with ``key`` (the approver's Ed25519 private key) and record one decision."""
    proposal = propose(home, name, case_id, decision, by, edited)
    return record_decision(home, proposal, sign(key, proposal.statement()), approvers, note)


def unverified(state: DatasetState, approvers: Mapping[str, str]) -> dict[str, str]:
    """The accepted cases whose latest decision does not verify against ``approvers`` now, and why."""
    problems = {}
    for case_id, entry in state.cases.items():
        if entry.status != "accepted" or entry.decision is None:
            continue
        key = approvers.get(entry.decision.by)
        if key is None:
            problems[case_id] = f"{entry.decision.by!r} is no longer an approver of the target"
        elif not verify(key, _statement_of(state.name, entry.decision), entry.decision.signature):
            problems[case_id] = f"the signature by {entry.decision.by!r} does not verify"
    return problems


def _version_body(number: int, parent: str | None, state: DatasetState, approvers: Mapping[str, str]) -> dict[str, Any]:
    """The version ``freeze`` makes of ``state`` — a function of the ledger and the approvers alone."""
    revoked = unverified(state, approvers)
    kept = sorted(
        (e for i, e in state.cases.items() if e.status == "accepted" and i not in revoked), key=lambda e: e.case["id"]
    )
    return {
        "name": state.name,
        "number": number,
        "parent": parent,
        "created": state.created_hash,
        "cases": [e.case for e in kept],
        "splits": {e.case["id"]: state.split(e.case["id"]) for e in kept},
        "decisions": {e.case["id"]: e.decision_seq for e in kept},
        "excluded": {
            "pending": sum(e.status == "pending" for e in state.cases.values()),
            "rejected": sum(e.status == "rejected" for e in state.cases.values()),
            "unverified": len(revoked),
        },
    }


def _refuse_leakage(name: str, body: dict[str, Any]) -> str:
    """The audit's ID; refused when two splits share a question."""
    report = audit_cases((Case(**c) for c in body["cases"]), body["splits"])
    if report.leakage:
        leak = report.leakage[0]
        more = (
            f" ({len(report.leakage) - 1} more such pairs: ragpipe dataset audit {name})"
            if len(report.leakage) > 1
            else ""
        )
        raise DatasetError(
            f"dataset {name!r}: cases {leak.a!r} ({leak.splits[0]}) and {leak.b!r} ({leak.splits[1]}) ask the "
            f"same question ({leak.kind.replace('_', '-')}) in two splits; reject or edit one of them{more}"
        )
    return report.id


def _cases_digest(body: Mapping[str, Any]) -> str:
    """What ``freeze`` compares to tell whether anything changed: the cases and their splits."""
    return content_id("dataset-version-cases", 1, {"cases": body["cases"], "splits": body["splits"]})


def freeze(
    home: Path, name: str, approvers: Mapping[str, str], on_step: Callable[[str], None] | None = None
) -> DatasetVersion:
    """Register the next version of ``name`` (module docstring: what it holds, what it refuses).
    The file is published before its record, so a crash between leaves an unregistered file the
    next freeze overwrites; the version exists only once registered."""
    with _lock(home, name), _writer(home, name) as ledger:
        state = _fold(ledger.records, ledger.path)
        number = len(state.versions) + 1
        parent = state.versions[-1][1] if state.versions else None
        body = _version_body(number, parent, state, approvers)
        if not body["cases"]:
            revoked = body["excluded"]["unverified"]
            raise DatasetError(
                f"dataset {name!r}: no accepted case to freeze"
                + (f" ({revoked} accepted by keys the target no longer lists: decide on them again)" if revoked else "")
            )
        body["audit"] = _refuse_leakage(name, body)
        cases = _cases_digest(body)
        last = next((r for r in reversed(ledger.records) if r.kind == "version_registered"), None)
        if last is not None and last.payload["cases"] == cases:
            raise DatasetError(f"dataset {name!r}: nothing changed since version {number - 1}")
        version_id = content_id("dataset-version", 1, body)
        path = dataset_dir(home, name) / "versions" / f"{number}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, canonical_bytes(body))
        if on_step is not None:
            on_step("published")
        ledger.append("version_registered", {"number": number, "version_id": version_id, "cases": cases})
    return DatasetVersion(name, number, version_id, tuple(body["cases"]), body["splits"])


def load_version(home: Path, name: str, number: int | None, approvers: Mapping[str, str]) -> DatasetVersion:
    """Version ``number`` (None: the latest) of ``name``: refused unless the file's bytes are
    exactly the body the ledger, folded up to the version's record, gives under ``approvers``
    now (module docstring)."""
    state, records = read_dataset(home, name)
    if not state.versions:
        raise DatasetError(f"dataset {name!r} has no version yet (ragpipe dataset freeze {name})")
    number = state.versions[-1][0] if number is None else number
    at = next(
        (i for i, r in enumerate(records) if r.kind == "version_registered" and r.payload["number"] == number), None
    )
    if at is None:
        raise DatasetError(f"dataset {name!r} has no version {number} (latest: {state.versions[-1][0]})")
    path = dataset_dir(home, name) / "versions" / f"{number}.json"
    before = _fold(records[:at], _ledger_path(home, name))
    registered = records[at].payload["version_id"]
    revoked = unverified(before, approvers)
    if revoked:
        case_id, why = sorted(revoked.items())[0]
        raise DatasetError(f"dataset {name!r} version {number}: case {case_id!r}: {why}; the version no longer holds")
    body = _version_body(number, before.versions[-1][1] if before.versions else None, before, approvers)
    body["audit"] = audit_cases((Case(**c) for c in body["cases"]), body["splits"]).id
    try:
        data = read_regular(path, MAX_VERSION_BYTES)
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read the version: {exc.strerror or exc}") from None
    if data != canonical_bytes(body) or content_id("dataset-version", 1, body) != registered:
        raise DatasetError(f"{path}: the file is not version {number} as the ledger registers it ({registered})")
    return DatasetVersion(name, number, registered, tuple(body["cases"]), body["splits"])


def parse_reference(text: str) -> tuple[str, int | None, str | None]:
    """``NAME[@N][:SPLIT]`` → (name, version or None for the latest, split or None)."""
    match = re.fullmatch(r"([^@:]+)(?:@(\d{1,9}))?(?::([^@:]+))?", text)
    if match is None:
        raise DatasetError(f"dataset reference {text!r}: NAME[@VERSION][:SPLIT], e.g. claims@2:holdout")
    name, number, split = match.groups()
    return name, None if number is None else int(number), split
