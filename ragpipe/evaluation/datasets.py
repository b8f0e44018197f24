"""Datasets: cases people adjudicate, frozen into immutable, content-addressed versions (docs/lab.md).

A dataset lives in ``<home>/datasets/<name>/``: ``ledger.jsonl`` (``kernel.ledger``, domain
``dataset-record`` v1, hash-chained, one writer at a time under ``.lock``) and ``versions/<n>.json``.
Its records:

* ``created`` — the release target whose approvers may adjudicate, the splits and their fractions,
  and a random salt. A case's split is ``split_of(salt, case_id)``: fixed by its ID, so a case
  never moves between splits from one version to the next;
* ``cases_added`` — cases (canonical suite cases, every rule of ``suite_rules`` checked) put up for
  adjudication, drafted by a model or written by a person; IDs are never reused;
* ``adjudicated`` — one signed decision on one case: ``accept``, ``edit`` (the edited fields;
  the result must meet every case rule and keep its ID) or ``reject``. The approver signs
  ``adjudication_statement`` — dataset, case, the digest of the case decided on (``from_digest``),
  the decision, the digest of the resulting case, who and when — with the Ed25519 key the target
  lists for them. A decision always names the case as it currently is, so a stale decision (the
  case was edited meanwhile) is refused;
* ``version_registered`` — a version's number and content ID.

``freeze`` makes the next version: every accepted case (its latest decision ``accept`` or
``edit``) with its split; pending and rejected cases are left out and counted. It refuses when a
signature does not verify against the target's approvers *now* (a key removed from the target
revokes the decisions it signed), when the cases leak between splits (``audit``: the same or a
near-identical question in two splits), or when nothing changed since the last version. The
version file is ``canonical_bytes`` of its body; its ID is ``content_id("dataset-version", 1,
body)``, recomputed whenever it is read. Evaluation sees a version as a suite
(``version_suite``), each case's ``split`` set to its split.

Approvers are passed in (``{name: "ed25519:…"}``): this floor does not read release targets.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from ragpipe.evaluation.audit import audit_cases
from ragpipe.evaluation.suite import Case, Suite
from ragpipe.evaluation.suite_rules import SuiteError
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.files import read_regular
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.ledger import Domain, Ledger, LedgerError, Record, read_ledger
from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.kernel.signatures import sign, verify

DOMAIN = Domain("dataset-record", 1)
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")
APPROVER = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}\Z")  # release targets' approver names
MAX_NOTE_CHARS = 500
MAX_VERSION_BYTES = 256 * 2**20
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
Decision = Literal["accept", "edit", "reject"]
Status = Literal["pending", "accepted", "rejected"]


class DatasetError(ValueError):
    """A dataset refused an operation; ``str(e)`` names the dataset (or file) and the rule."""


def case_digest(case: Mapping[str, Any]) -> str:
    """Content ID of one canonical case (what a decision names)."""
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
    dataset: str, case_id: str, from_digest: str, decision: str, result_digest: str | None, by: str, at: str
) -> bytes:
    """The bytes an approver signs for one decision (RFC 8785 JSON)."""
    return canonical_bytes(
        {
            "domain": "ragpipe.case-adjudication",
            "version": 1,
            "dataset": dataset,
            "case_id": case_id,
            "from_digest": from_digest,
            "decision": decision,
            "result_digest": result_digest,
            "by": by,
            "at": at,
        }
    )


@dataclass
class CaseState:
    """One case of a dataset as its records leave it."""

    case: dict[str, Any]  # the current canonical case (after the latest edit)
    digest: str
    status: Status = "pending"
    decisions: list[int] = field(default_factory=list)  # record numbers of its adjudications


@dataclass
class DatasetState:
    name: str
    target: str
    splits: tuple[tuple[str, float], ...]
    salt: str
    cases: dict[str, CaseState] = field(default_factory=dict)
    versions: list[tuple[int, str]] = field(default_factory=list)  # (number, version ID)


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
    if not NAME.match(name):
        raise DatasetError(f"dataset name {name!r}: 1-64 of a-z 0-9 . _ - (starting with a letter or digit)")
    return Path(home) / "datasets" / name


def _ledger_path(home: Path, name: str) -> Path:
    return dataset_dir(home, name) / "ledger.jsonl"


def _check_case(value: Any, where: str) -> dict[str, Any]:
    try:
        return Case(**value).canonical() if isinstance(value, dict) else Case.model_validate(value).canonical()
    except (SuiteError, ValueError) as exc:
        raise DatasetError(f"{where}: {_first_line(exc)}") from None


def _first_line(exc: Exception) -> str:
    text = str(exc)
    if hasattr(exc, "errors"):  # pydantic: the rule, not the model's name and a documentation link
        errors = exc.errors()  # type: ignore[attr-defined]
        if errors:
            return str(errors[0].get("msg", text)).removeprefix("Value error, ")
    return text.splitlines()[0]


def _adjudicated(case: dict[str, Any]) -> dict[str, Any]:
    """The case once a person decided it: a ``review`` state, where the case carries one, becomes
    ``adjudicated``."""
    return {**case, "review": "adjudicated"} if "review" in case else dict(case)


def _step(state: DatasetState | None, record: Record) -> DatasetState:
    """Fold one record into the state (the rules every writer checked; a ledger edited by hand
    that breaks one is refused here with its record number)."""
    p, where = record.payload, f"record {record.seq}"
    if record.kind == "created":
        if state is not None:
            raise DatasetError(f"{where}: a dataset is created once")
        return DatasetState(p["name"], p["target"], tuple((s, f) for s, f in p["splits"]), p["salt"])
    if state is None:
        raise DatasetError(f"{where}: {record.kind} before the dataset was created")
    if record.kind == "cases_added":
        for value in p["cases"]:
            case = _check_case(value, where)
            if case != value or case["id"] in state.cases:
                raise DatasetError(f"{where}: case {value.get('id')!r} is not canonical or already in the dataset")
            state.cases[case["id"]] = CaseState(case, case_digest(case))
    elif record.kind == "adjudicated":
        entry = state.cases.get(p["case_id"])
        if entry is None or entry.digest != p["from_digest"]:
            raise DatasetError(f"{where}: decision on case {p['case_id']!r} names a case the dataset does not hold")
        if p["decision"] == "reject":
            entry.status = "rejected"
        else:
            result = _check_case(p["result"], where)
            if result != p["result"] or case_digest(result) != p["result_digest"] or result["id"] != p["case_id"]:
                raise DatasetError(f"{where}: the result of the decision on case {p['case_id']!r} does not match")
            entry.case, entry.digest, entry.status = result, p["result_digest"], "accepted"
        entry.decisions.append(record.seq)
    elif record.kind == "version_registered":
        expected = len(state.versions) + 1
        if p["number"] != expected:
            raise DatasetError(f"{where}: version {p['number']} registered where {expected} was next")
        state.versions.append((p["number"], p["version_id"]))
    else:
        raise DatasetError(f"{where}: unknown record kind {record.kind!r}")
    return state


def _fold(records: tuple[Record, ...] | list[Record], where: str) -> DatasetState:
    state: DatasetState | None = None
    try:
        for record in records:
            state = _step(state, record)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        if isinstance(exc, DatasetError):
            raise DatasetError(f"{where}: {exc}") from None
        raise DatasetError(f"{where}: a record is malformed ({type(exc).__name__}: {exc})") from None
    if state is None:
        raise DatasetError(f"{where}: the dataset has no records")
    return state


def read_dataset(home: Path, name: str) -> tuple[DatasetState, tuple[Record, ...]]:
    """The dataset's state and records, the ledger verified (chain, head, seal)."""
    path = _ledger_path(home, name)
    try:
        read = read_ledger(path, DOMAIN, missing=f"no dataset {name!r}")
    except LedgerError as exc:
        raise DatasetError(str(exc)) from None
    return _fold(read.records, str(path)), read.records


def _writer(home: Path, name: str) -> Ledger:
    path = _ledger_path(home, name)
    try:
        return Ledger.open(path, DOMAIN, missing=f"no dataset {name!r}")
    except LedgerError as exc:
        raise DatasetError(str(exc)) from None


def _lock(home: Path, name: str):
    return file_lock(dataset_dir(home, name) / ".lock", exclusive=True)


def create_dataset(home: Path, name: str, target: str, splits: Mapping[str, float]) -> DatasetState:
    """A new dataset whose cases ``target``'s approvers adjudicate, split by ``splits`` (fractions
    summing to 1, in the order given)."""
    directory = dataset_dir(home, name)
    if not splits:
        raise DatasetError(f"dataset {name!r}: at least one split")
    for split, fraction in splits.items():
        if not NAME.match(split):
            raise DatasetError(f"dataset {name!r}: split name {split!r}: 1-64 of a-z 0-9 . _ -")
        if not 0 < fraction <= 1:
            raise DatasetError(f"dataset {name!r}: split {split!r}: a fraction in (0, 1], not {fraction}")
    if abs(sum(splits.values()) - 1) > 1e-9:
        raise DatasetError(f"dataset {name!r}: the split fractions sum to {sum(splits.values()):g}, not 1")
    directory.mkdir(parents=True, exist_ok=True)
    with _lock(home, name):
        try:
            ledger = Ledger.create(_ledger_path(home, name), DOMAIN)
        except LedgerError:
            raise DatasetError(f"dataset {name!r} already exists") from None
        with ledger:
            payload = {"name": name, "target": target, "splits": [[s, f] for s, f in splits.items()]}
            record = ledger.append("created", {**payload, "salt": os.urandom(16).hex()})
    return _fold([record], str(_ledger_path(home, name)))


def add_cases(home: Path, name: str, cases: list[Case] | tuple[Case, ...]) -> int:
    """Put ``cases`` up for adjudication (all or none: an ID already in the dataset is refused)."""
    canonical = [c.canonical() for c in cases]
    if not canonical:
        raise DatasetError(f"dataset {name!r}: no cases to add")
    with _lock(home, name), _writer(home, name) as ledger:
        state = _fold(ledger.records, str(ledger.path))
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
    case_id: str
    from_digest: str
    decision: Decision
    result: dict[str, Any] | None
    result_digest: str | None
    by: str
    at: str

    def statement(self) -> bytes:
        return adjudication_statement(
            self.dataset, self.case_id, self.from_digest, self.decision, self.result_digest, self.by, self.at
        )


def propose(
    home: Path, name: str, case_id: str, decision: Decision, by: str, edited: Mapping[str, Any] | None = None
) -> Proposal:
    """The decision ``by`` would sign on ``case_id`` as it is now (``edited``: the fields an
    ``edit`` changes; the ID cannot change)."""
    if not APPROVER.match(by):
        raise DatasetError(f"approver {by!r}: a name is 1-64 of a-z 0-9 . _ @ - (starting with a letter or digit)")
    state, _ = read_dataset(home, name)
    entry = state.cases.get(case_id)
    if entry is None:
        raise DatasetError(f"dataset {name!r}: no case {case_id!r}")
    if decision not in ("accept", "edit", "reject"):
        raise DatasetError(f"decision {decision!r}: one of accept, edit, reject")
    if (decision == "edit") != bool(edited):
        raise DatasetError("an edit names the fields it changes; accept and reject change none")
    result: dict[str, Any] | None = None
    if decision != "reject":
        edited = dict(edited or {})
        if edited.get("id", case_id) != case_id:
            raise DatasetError(f"case {case_id!r}: an edit cannot change the case ID")
        result = _check_case(_adjudicated({**entry.case, **edited}), f"case {case_id!r}")
        if decision == "edit" and result == _adjudicated(entry.case):
            raise DatasetError(f"case {case_id!r}: the edit changes nothing (accept it instead)")
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    digest = None if result is None else case_digest(result)
    return Proposal(name, case_id, entry.digest, decision, result, digest, by, at)


def record_decision(
    home: Path, proposal: Proposal, signature: str, approvers: Mapping[str, str], note: str = ""
) -> Record:
    """Append ``proposal`` signed with ``signature``: refused unless its approver is listed and the
    signature verifies, and unless the case is still the one it names (under the dataset's lock)."""
    if _CONTROL.search(note) or len(note) > MAX_NOTE_CHARS:
        raise DatasetError(f"the note must be at most {MAX_NOTE_CHARS} characters without control characters")
    key = approvers.get(proposal.by)
    if key is None:
        listed = ", ".join(sorted(approvers)) or "none"
        raise DatasetError(f"{proposal.by!r} is not an approver of this dataset's target (approvers: {listed})")
    if not verify(key, proposal.statement(), signature):
        raise DatasetError(f"decision on case {proposal.case_id!r} by {proposal.by!r}: the signature does not verify")
    with _lock(home, proposal.dataset), _writer(home, proposal.dataset) as ledger:
        state = _fold(ledger.records, str(ledger.path))
        entry = state.cases.get(proposal.case_id)
        if entry is None or entry.digest != proposal.from_digest:
            raise DatasetError(
                f"dataset {proposal.dataset!r}: case {proposal.case_id!r} changed since this decision was "
                "proposed; decide on it as it is now"
            )
        return ledger.append(
            "adjudicated",
            {
                "case_id": proposal.case_id,
                "from_digest": proposal.from_digest,
                "decision": proposal.decision,
                "result": proposal.result,
                "result_digest": proposal.result_digest,
                "by": proposal.by,
                "at": proposal.at,
                "note": note,
                "signature": signature,
            },
        )


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


def _refuse_unverified(name: str, records: tuple[Record, ...], approvers: Mapping[str, str]) -> None:
    for record in records:
        if record.kind != "adjudicated":
            continue
        p = record.payload
        key = approvers.get(p["by"])
        statement = adjudication_statement(
            name, p["case_id"], p["from_digest"], p["decision"], p["result_digest"], p["by"], p["at"]
        )
        if key is None or not verify(key, statement, p["signature"]):
            why = "is no longer an approver of the target" if key is None else "signature does not verify"
            raise DatasetError(
                f"dataset {name!r}: record {record.seq}: decision on case {p['case_id']!r} by {p['by']!r}: {why}"
            )


def _version_body(name: str, number: int, parent: str | None, state: DatasetState, audit_id: str) -> dict[str, Any]:
    accepted = sorted((e for e in state.cases.values() if e.status == "accepted"), key=lambda e: e.case["id"])
    return {
        "name": name,
        "number": number,
        "parent": parent,
        "cases": [e.case for e in accepted],
        "splits": {e.case["id"]: split_of(state.salt, e.case["id"], state.splits) for e in accepted},
        "decisions": {e.case["id"]: e.decisions for e in accepted},
        "excluded": {
            "pending": sum(e.status == "pending" for e in state.cases.values()),
            "rejected": sum(e.status == "rejected" for e in state.cases.values()),
        },
        "audit": audit_id,
    }


def freeze(
    home: Path, name: str, approvers: Mapping[str, str], on_step: Callable[[str], None] | None = None
) -> DatasetVersion:
    """Register the next version of ``name`` (module docstring: what it holds, what it refuses).
    The file is published before its record, so a crash between leaves an unregistered file the
    next freeze overwrites; the version exists only once registered."""
    with _lock(home, name), _writer(home, name) as ledger:
        state = _fold(ledger.records, str(ledger.path))
        _refuse_unverified(name, tuple(ledger.records), approvers)
        accepted = [e for e in state.cases.values() if e.status == "accepted"]
        if not accepted:
            raise DatasetError(f"dataset {name!r}: no accepted case to freeze")
        splits = {e.case["id"]: split_of(state.salt, e.case["id"], state.splits) for e in accepted}
        report = audit_cases((Case(**e.case) for e in accepted), splits)
        if report.leakage:
            leak = report.leakage[0]
            raise DatasetError(
                f"dataset {name!r}: cases {leak.a!r} ({leak.splits[0]}) and {leak.b!r} ({leak.splits[1]}) ask the "
                f"same question ({leak.kind.replace('_', '-')}) in two splits; reject or edit one of them"
                + (f" ({len(report.leakage) - 1} more such pairs)" if len(report.leakage) > 1 else "")
            )
        number = len(state.versions) + 1
        parent = state.versions[-1][1] if state.versions else None
        body = _version_body(name, number, parent, state, report.id)
        if parent is not None:
            previous = load_version(home, name, number - 1)
            if [c for c in body["cases"]] == list(previous.cases):
                raise DatasetError(f"dataset {name!r}: nothing changed since version {number - 1}")
        data = canonical_bytes(body)
        version_id = content_id("dataset-version", 1, body)
        path = dataset_dir(home, name) / "versions" / f"{number}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(path, data)
        if on_step is not None:
            on_step("published")
        ledger.append("version_registered", {"number": number, "version_id": version_id})
    return DatasetVersion(name, number, version_id, tuple(body["cases"]), body["splits"])


def load_version(
    home: Path, name: str, number: int | None = None, approvers: Mapping[str, str] | None = None
) -> DatasetVersion:
    """Version ``number`` (None: the latest) of ``name``, its file's ID recomputed and compared with
    the registered one, and every case checked against the suite rules again. With ``approvers``
    (what evaluation passes), each case must also be the result of a decision in the ledger whose
    signature verifies: a ledger rewritten with every hash recomputed cannot smuggle a case in
    without an approver's key."""
    state, records = read_dataset(home, name)
    if not state.versions:
        raise DatasetError(f"dataset {name!r} has no version yet (ragpipe dataset freeze {name})")
    number = state.versions[-1][0] if number is None else number
    registered = dict(state.versions).get(number)
    if registered is None:
        raise DatasetError(f"dataset {name!r} has no version {number} (latest: {state.versions[-1][0]})")
    path = dataset_dir(home, name) / "versions" / f"{number}.json"
    try:
        data = read_regular(path, MAX_VERSION_BYTES)
        body = json.loads(data)
    except (OSError, ValueError, RecursionError) as exc:
        raise DatasetError(f"{path}: cannot read the version ({type(exc).__name__})") from None
    if not isinstance(body, dict) or content_id("dataset-version", 1, body) != registered:
        raise DatasetError(f"{path}: the file is not version {number} as registered ({registered})")
    cases = tuple(_check_case(c, f"{path}: case {c.get('id')!r}") for c in body["cases"])
    if approvers is not None:
        _refuse_unbacked(name, number, cases, body["decisions"], records, approvers)
    return DatasetVersion(name, number, registered, cases, dict(body["splits"]))


def _refuse_unbacked(
    name: str,
    number: int,
    cases: tuple[dict[str, Any], ...],
    decisions: Mapping[str, list[int]],
    records: tuple[Record, ...],
    approvers: Mapping[str, str],
) -> None:
    """Every case of a version is the result of its last listed decision, signed by an approver."""
    by_seq = {r.seq: r for r in records}
    for case in cases:
        seqs = decisions.get(case["id"]) or [0]
        record = by_seq.get(seqs[-1])
        p = record.payload if record is not None and record.kind == "adjudicated" else None
        if p is None or p["case_id"] != case["id"] or p["result_digest"] != case_digest(case):
            raise DatasetError(f"dataset {name!r} version {number}: case {case['id']!r} is not backed by a decision")
    _refuse_unverified(name, tuple(by_seq[s] for c in cases for s in decisions[c["id"]][-1:]), approvers)


def parse_reference(text: str) -> tuple[str, int | None, str | None]:
    """``NAME[@N][:SPLIT]`` → (name, version or None for the latest, split or None)."""
    match = re.fullmatch(r"([^@:]+)(?:@(\d+))?(?::([^@:]+))?", text)
    if match is None:
        raise DatasetError(f"dataset reference {text!r}: NAME[@VERSION][:SPLIT], e.g. claims@2:holdout")
    name, number, split = match.groups()
    return name, None if number is None else int(number), split
