"""What the review queue, in-browser signing, pairwise review and freezing read and write (docs/lab.md).

* **Queue** (``ReviewReader.queue``): the pending cases of every dataset under
  ``$RAGPIPE_HOME/datasets/`` (``ragpipe.evaluation.datasets``) — a dataset's provisional (model
  drafted) cases first, then the others, each in case-ID order — followed by the served answers of
  the followed target that received a ``disputed`` verdict (``server.tracing``), newest log first.
  The pages show one item at a time by its position in that list.
* **Signing**: the server never signs. ``Proposals`` keeps each ``datasets.Proposal`` under a
  random single-use token for ``PROPOSAL_TTL_S`` seconds, bound to the session that asked for it;
  the page signs ``Proposal.statement()`` with the approver's key (WebCrypto) and sends back the
  token and the signature, which ``record_decision`` verifies against the target's approvers as
  the targets config lists them *now* (read again on every decision).
* **Pairwise**: a reviewer's choice between two runs' answers to one case is one record of the
  home's ``lab/pairwise.jsonl`` (``kernel.ledger``, domain ``lab-pairwise`` v1, hash-chained,
  appended under ``lab/pairwise.lock``). The records are not signed: the chain shows what was
  recorded and in which order, the session's principal says who, nothing more.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ragpipe.evaluation.datasets import NAME, DatasetError, Proposal, read_dataset
from ragpipe.kernel.ledger import Domain, Ledger, Record, read_ledger
from ragpipe.kernel.locks import file_lock
from ragpipe.kernel.workspace import Workspace
from ragpipe.retrieval.authz import ScopePolicy, Subject
from ragpipe.server.tracing import TraceEntry, traces_with_feedback

PROPOSAL_TTL_S = 300.0
MAX_PROPOSALS = 1024
PAIRWISE_DOMAIN = Domain("lab-pairwise", 1)
CHOICES = {"1": "a", "2": "b", "0": "tie"}
TEXT_CHARS = 2000  # a source's text is shown up to this many characters
POLICY = ScopePolicy()


class ReviewRefusal(Exception):
    """A refused review request: its HTTP status, stable code and one-line message."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Source:
    """An expected or acceptable source of a case as the reviewer may see it."""

    target: str
    grade: Literal["expected", "acceptable"]
    visible: bool
    title: str | None = None
    text: str | None = None
    found: bool = True  # False: no bundle of this home holds it


@dataclass(frozen=True)
class QueueItem:
    kind: Literal["case", "answer"]
    dataset: str | None = None
    case: dict[str, Any] = field(default_factory=dict)
    entry: TraceEntry | None = None

    @property
    def provisional(self) -> bool:
        return self.case.get("review") == "provisional"


@dataclass
class _Held:
    proposal: Proposal
    session_csrf: str
    expires: float


class Proposals:
    """Proposals waiting for their signature: each under a random token, taken at most once, by the
    session that asked for it, before it expires (thread-safe, bounded: the oldest goes first)."""

    def __init__(self, ttl_s: float = PROPOSAL_TTL_S, clock=time.monotonic):
        self.ttl_s, self.clock = ttl_s, clock
        self._lock = threading.Lock()
        self._held: OrderedDict[str, _Held] = OrderedDict()

    def put(self, proposal: Proposal, session_csrf: str) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._held[token] = _Held(proposal, session_csrf, self.clock() + self.ttl_s)
            while len(self._held) > MAX_PROPOSALS:
                self._held.popitem(last=False)
        return token

    def take(self, token: str, session_csrf: str) -> Proposal:
        """The proposal of ``token`` (removed): ``unknown_token`` when it was never issued, was
        used already or belongs to another session; ``expired_token`` past its expiry."""
        with self._lock:
            held = self._held.get(token) if isinstance(token, str) else None
            if held is None or held.session_csrf != session_csrf:
                raise ReviewRefusal(409, "unknown_token", "no such proposal: it was used already or never issued")
            del self._held[token]
        if held.expires <= self.clock():
            raise ReviewRefusal(409, "expired_token", "the proposal expired: decide again")
        return held.proposal


class ReviewReader:
    """The home's datasets and disputed answers as the review pages read them."""

    def __init__(self, home: Path, target: str, targets_path: Path | None):
        self.home, self.target, self.targets_path = Path(home), target, targets_path

    def approvers(self, target: str) -> dict[str, str]:
        """The approvers ``target`` lists in the targets config now (read on every call)."""
        from ragpipe.release.store import ReleaseError
        from ragpipe.release.targets import load_targets

        try:
            _, spec = load_targets(self.targets_path).get(target)
        except ReleaseError as exc:
            raise ReviewRefusal(409, "no_target", str(exc).splitlines()[0]) from None
        return dict(spec.approvers)

    def datasets(self) -> list[str]:
        folder = Workspace(self.home).datasets
        if not folder.is_dir():
            return []
        return sorted(
            p.name
            for p in folder.iterdir()
            if p.is_dir() and not p.is_symlink() and NAME.match(p.name) and (p / "ledger.jsonl").is_file()
        )

    def dataset(self, name: str):
        """(state, counts by status) of dataset ``name``; ``LookupError`` when there is none."""
        if name not in self.datasets():
            raise LookupError(f"no dataset {name!r}")
        state, _ = read_dataset(self.home, name)
        counts = {"pending": 0, "accepted": 0, "rejected": 0}
        for entry in state.cases.values():
            counts[entry.status] += 1
        return state, counts

    def pending(self, name: str) -> list[QueueItem]:
        state, _ = read_dataset(self.home, name)
        waiting = [e.case for e in state.cases.values() if e.status == "pending"]
        waiting.sort(key=lambda c: (c.get("review") != "provisional", c["id"]))
        return [QueueItem("case", name, case) for case in waiting]

    def disputed(self) -> list[QueueItem]:
        return [QueueItem("answer", entry=e) for e in traces_with_feedback(self.home, self.target, verdict="disputed")]

    def queue(self, dataset: str | None = None) -> list[QueueItem]:
        """Every pending case (``dataset``: of that dataset only), then, for the whole queue, the
        disputed answers."""
        if dataset is not None:
            return self.pending(dataset)
        items = [item for name in self.datasets() for item in self.pending(name)]
        return items + self.disputed()

    def sources(self, case: Mapping[str, Any], subject: Subject) -> list[Source]:
        """The case's expected and acceptable sources with title and text from the newest bundle of
        the home that holds each, withheld outside ``subject``'s scopes."""
        wanted = [(t, "expected") for t in case.get("expected", ())] + [
            (t, "acceptable") for t in case.get("acceptable", ())
        ]
        if not wanted:
            return []
        chunk_level = case.get("target_level") == "chunk"
        found: dict[str, tuple[str | None, tuple[str, ...], str | None]] = {}
        for bundle in _bundles_newest_first(Workspace(self.home).bundles):
            missing = [t for t, _ in wanted if t not in found]
            if not missing:
                break
            found.update(_look_up(bundle, missing, chunk_level))
        shown = []
        for target, grade in wanted:
            if target not in found:
                shown.append(Source(target, grade, visible=False, found=False))
                continue
            title, scopes, text = found[target]
            if scopes and POLICY.allows(subject, scopes):
                shown.append(Source(target, grade, True, title, (text or "")[:TEXT_CHARS]))
            else:
                shown.append(Source(target, grade, False))
        return shown


def _bundles_newest_first(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    bundles = [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and (p / "documents.parquet").is_file()]
    return sorted(bundles, key=lambda p: p.stat().st_mtime_ns, reverse=True)


def _look_up(
    bundle: Path, targets: list[str], chunk_level: bool
) -> dict[str, tuple[str | None, tuple[str, ...], str | None]]:
    """(title, scopes, text) of each target the bundle holds: a document's text is its first chunk."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    values = pa.array(targets, type=pa.string())
    try:
        chunks = pq.read_table(bundle / "chunks.parquet", columns=["chunk_id", "document_id", "ordinal", "text"])
        column = "chunk_id" if chunk_level else "document_id"
        rows = chunks.filter(pc.is_in(chunks[column], value_set=values)).to_pylist()
        rows.sort(key=lambda r: r["ordinal"])
        docs = pq.read_table(bundle / "documents.parquet", columns=["document_id", "title", "access_scopes"])
        wanted_docs = pa.array(sorted({r["document_id"] for r in rows} | set(targets)), type=pa.string())
        meta = {
            r["document_id"]: (r["title"], tuple(r["access_scopes"] or ()))
            for r in docs.filter(pc.is_in(docs["document_id"], value_set=wanted_docs)).to_pylist()
        }
    except (OSError, KeyError, pa.ArrowException):
        return {}
    out: dict[str, tuple[str | None, tuple[str, ...], str | None]] = {}
    for row in rows:
        key = row[column]
        if key not in out and row["document_id"] in meta:
            title, scopes = meta[row["document_id"]]
            out[key] = (title, scopes, row["text"])
    if not chunk_level:
        for target in targets:
            if target not in out and target in meta:
                out[target] = (*meta[target], None)
    return out


def pairwise_path(home: Path) -> Path:
    return Workspace(Path(home)).lab / "pairwise.jsonl"


def record_choice(home: Path, payload: dict[str, Any]) -> Record:
    """Append one pairwise choice (``{a, b, case_id, repeat, choice, by, at}``) to the home's ledger."""
    path = pairwise_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_suffix(".lock"), exclusive=True):
        with Ledger.open(path, PAIRWISE_DOMAIN, create=True) as ledger:
            return ledger.append("choice", payload)


def choices(home: Path) -> tuple[Record, ...]:
    """The pairwise ledger's records, verified ((): none yet)."""
    path = pairwise_path(home)
    if not path.exists():
        return ()
    return tuple(read_ledger(path, PAIRWISE_DOMAIN).records)


def edited_fields(case: Mapping[str, Any], form: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``case`` the edit form changes. ``form`` holds strings: ``query``,
    ``stratum``, ``quality_label`` (empty: unset), ``tags`` (comma-separated), ``required_facts``,
    ``expected``, ``acceptable`` (one per line). When the expected or acceptable sources change,
    the judgments of every source listed before or after are dropped, so the new lists alone decide
    their grades."""
    if not isinstance(form, Mapping) or any(not isinstance(v, str) for v in form.values()):
        raise DatasetError("the edit is an object of text fields")
    proposed: dict[str, Any] = {}
    if "query" in form:
        proposed["query"] = form["query"].strip()
    for name in ("stratum", "quality_label"):
        if name in form:
            proposed[name] = form[name].strip() or None
    if "tags" in form:
        proposed["tags"] = [t.strip() for t in form["tags"].split(",") if t.strip()]
    for name in ("required_facts", "expected", "acceptable"):
        if name in form:
            proposed[name] = [line.strip() for line in form[name].splitlines() if line.strip()]
    unknown = sorted(
        set(form) - {"query", "stratum", "quality_label", "tags", "required_facts", "expected", "acceptable"}
    )
    if unknown:
        raise DatasetError(f"the edit form has no field {unknown[0]!r}")
    changed = {}
    for name, value in proposed.items():
        now = case.get(name)
        same = (list(now) if isinstance(now, list | tuple) else now) == value or (now is None and value in ([], None))
        if not same:
            changed[name] = value
    if {"expected", "acceptable"} & set(changed):
        changed.setdefault("expected", list(case.get("expected", ())))
        changed.setdefault("acceptable", list(case.get("acceptable", ())))
        listed = {*case.get("expected", ()), *case.get("acceptable", ()), *changed["expected"], *changed["acceptable"]}
        changed["judgments"] = {t: g for t, g in case.get("judgments", {}).items() if t not in listed}
    return {k: v for k, v in changed.items() if v is not None}
