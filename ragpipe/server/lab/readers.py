"""What the lab's pages show, read from the workspace through the evaluation run readers.

Every name a URL carries is looked up, never joined into a path: a run ID must be the name of a
folder in ``$RAGPIPE_HOME/evaluations/``, a case one of the run's expected cells, a file one the
run folder holds (found by walking it, symbolic links left out), a revision one the registry lists.
Anything else is ``NotFound`` — which is also how ``..``, ``/`` and encoded separators end.

A run is verified (``verify_run``: chain, head, inputs, every trace, every metric recomputed) before
any of it is shown; the verification is remembered per run by its ledger head, so a page re-reads
a run only when it changed. Evidence text comes from the evaluated bundle (its content-addressed
folder ``bundles/<bundle hex>/``) and is shown only where the reader's scopes allow it
(``ScopePolicy.allows``, the retrieval authorization's own rule); an item the reader may not see is
listed by rank with its ID, title and text withheld.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import HEAD, LEDGER, read_ledger, reduce_records
from ragpipe.evaluation.report import answer_quality, evaluated_cases
from ragpipe.evaluation.run_folder import load_inputs, verify_run
from ragpipe.evaluation.run_state import RunState
from ragpipe.evaluation.suite import Case
from ragpipe.evaluation.traces import TraceReader
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.arms import ArmRun
from ragpipe.experiment.comparison import Comparison, compare
from ragpipe.experiment.pairing import Pairing, pair
from ragpipe.kernel.workspace import Workspace
from ragpipe.retrieval.authz import ScopePolicy, Subject
from ragpipe.server.redact import PathRedactor

SNAPSHOT_STAGE = "source_snapshot"
COUNT_STAGES = ("chunks", "representations", "embeddings")
# Ranked lists (channels, fused, final) are shown to this depth: a run at k = 1000 has thousands of
# rows a cell, which the trace file holds whole (linked from the page).
ROWS_SHOWN = 50
POLICY = ScopePolicy()


class NotFound(LookupError):
    """No such run, case, file or revision (the message names what was asked for)."""


class Unverified(ValueError):
    """The run exists but does not verify (the message is the verifier's, naming file and record)."""


@dataclass(frozen=True)
class RunRow:
    run_id: str
    status: str
    bundle_id: str | None = None
    plan_id: str | None = None
    mode: str | None = None
    answers: bool = False
    cells: int = 0
    completed: int = 0
    failed: int = 0
    problem: str | None = None  # why the ledger cannot be read (the row is listed anyway)


@dataclass(frozen=True)
class VerifiedRun:
    run_id: str
    folder: Path
    head: str
    state: RunState
    spec: EvaluationSpec
    records: tuple[Any, ...]
    arm: ArmRun | None  # completed runs only (what comparisons read)
    traces: TraceReader  # parses each trace file once (checked against its digest on first read)

    @property
    def cases(self) -> dict[str, Case]:
        return {c.id: c for c in self.spec.suite.cases}


@dataclass
class Item:
    """One ranked row of a trace as the reader may see it."""

    rank: int
    chunk_id: str | None
    document_id: str | None
    score: float | None = None
    channel: str | None = None
    scopes: tuple[str, ...] | None = None
    title: str | None = None
    text: str | None = None
    label: str | None = None
    visible: bool = True


@dataclass
class CaseTrace:
    run: VerifiedRun
    case: Case
    repeat: int
    record: dict[str, Any]
    description: dict[str, Any]
    channels: dict[str, list[Item]] = field(default_factory=dict)
    fused: list[Item] = field(default_factory=list)
    final: list[Item] = field(default_factory=list)
    context: list[Item] = field(default_factory=list)
    citations: list[Item] = field(default_factory=list)
    judged: dict[str, int] = field(default_factory=dict)
    seq: int | None = None  # the ledger record that closed the cell
    # A judged cell's judge entry (``ragpipe.evaluation.judging``): outcome, the answer's text and
    # the verdict — None when the run judges nothing, or when the reviewer may not read every item
    # the answer cites (the text and the verdict quote them)
    judge: dict[str, Any] | None = None
    judge_withheld: bool = False
    totals: dict[str, int] = field(default_factory=dict)  # rows in the trace per list, before ROWS_SHOWN


def _bounded_put(cache: OrderedDict, key, value, capacity: int = 64) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > capacity:
        cache.popitem(last=False)


class LabReader:
    """The workspace as the lab reads it (thread-safe caches keyed by ledger heads)."""

    def __init__(self, ws: Workspace, redact: PathRedactor):
        self.ws = ws
        self.redact = redact
        self._lock = threading.Lock()
        self._runs: OrderedDict[tuple[str, str], VerifiedRun] = OrderedDict()
        self._rows: OrderedDict[tuple[str, str, int, int], RunRow] = OrderedDict()
        self._comparisons: OrderedDict[tuple[str, str], tuple[Pairing, Comparison]] = OrderedDict()

    # ---- runs -------------------------------------------------------------------------------
    @property
    def evaluations(self) -> Path:
        return self.ws.evaluations

    def run_ids(self) -> list[str]:
        """The run folders present, newest first (run IDs are UUIDv7: they sort by creation)."""
        if not self.evaluations.is_dir():
            return []
        return sorted(
            (
                p.name
                for p in self.evaluations.iterdir()
                if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
            ),
            reverse=True,
        )

    def folder(self, run_id: str) -> Path:
        if run_id not in self.run_ids():
            raise NotFound(f"no evaluation run {run_id!r}")
        return self.evaluations / run_id

    def runs(self) -> list[RunRow]:
        """Each run's ledger state (chain checked; traces are verified when the run is opened)."""
        return [self._row(run_id) for run_id in self.run_ids()]

    def _row(self, run_id: str) -> RunRow:
        """One run's row, remembered until its ledger or head file changes (size, time, head)."""
        folder = self.evaluations / run_id
        try:
            stat = (folder / LEDGER).stat()
            key = (run_id, (folder / HEAD).read_text(encoding="utf-8"), stat.st_size, stat.st_mtime_ns)
        except OSError:
            key = None
        with self._lock:
            cached = self._rows.get(key) if key else None
        if cached is not None:
            return cached
        row = self._read_row(run_id, folder)
        if key is not None:
            with self._lock:
                _bounded_put(self._rows, key, row, capacity=4096)
        return row

    def _read_row(self, run_id: str, folder: Path) -> RunRow:
        """One run's row from its ledger (chain checked; traces are verified when the run is opened)."""
        try:
            state = reduce_records(read_ledger(folder).records, str(folder / LEDGER))
        except ValueError as exc:
            return RunRow(run_id, "unreadable", problem=self.redact(str(exc)))
        spec = state.created.get("spec", {})
        outcomes = [t.get("outcome") for t in state.terminal.values()]
        return RunRow(
            run_id,
            state.status,
            spec.get("bundle_id"),
            spec.get("plan_id"),
            spec.get("mode"),
            bool(spec.get("answers")),
            len(state.expected),
            sum(o in ("success", "abstained") for o in outcomes),
            sum(o in ("failure", "cancelled") for o in outcomes),
        )

    def run(self, run_id: str) -> VerifiedRun:
        """The verified run ``run_id`` (``NotFound``; ``Unverified`` with the verifier's message)."""
        folder = self.folder(run_id)
        try:
            head = (folder / HEAD).read_text(encoding="utf-8")
        except OSError:
            head = ""
        with self._lock:
            cached = self._runs.get((run_id, head))
        if cached is not None:
            return cached
        try:
            records = tuple(read_ledger(folder).records)
            state = reduce_records(records, str(folder / LEDGER))
            if state.status == "completed":  # a completed run's ledger takes no more records
                arm = load_arm(folder)  # verify_run, then the arm comparisons read (verified once)
            else:
                state, arm = verify_run(folder), None
            spec = load_inputs(folder, records, state)
        except ValueError as exc:  # LedgerError, RunError, TraceError, ArmSourceError
            raise Unverified(self.redact(str(exc))) from None
        verified = VerifiedRun(run_id, folder, head, state, spec, records, arm, TraceReader(folder))
        with self._lock:
            _bounded_put(self._runs, (run_id, head), verified)
        return verified

    def run_file(self, run_id: str, name: str) -> Path:
        """A regular file of the run folder named by its relative POSIX path (walked, not joined)."""
        folder = self.folder(run_id)
        found = {rel: path for rel, path in _regular_files(folder)}.get(name)
        if found is None:
            raise NotFound(f"run {run_id} has no file {name!r}")
        return found

    def files(self, run: VerifiedRun) -> list[str]:
        return [rel for rel, _ in _regular_files(run.folder)]

    # ---- one case ----------------------------------------------------------------------------
    def case(self, run_id: str, case_id: str, repeat: int, subject: Subject) -> CaseTrace:
        """One cell of a verified run with its trace, evidence text only where ``subject`` may read."""
        run = self.run(run_id)
        arm = run.spec.body.arm
        terminal = run.state.terminal.get((case_id, repeat, arm))
        case = run.cases.get(case_id)
        if case is None or (case_id, repeat, arm) not in run.state.expected_set:
            raise NotFound(f"run {run_id} has no case {case_id!r} repeat {repeat}")
        record = dict(terminal or {})
        trace = CaseTrace(run, case, repeat, record, {}, judged=dict(case.judgments))
        closing = {"case": case_id, "repeat": repeat, "arm": arm}
        trace.seq = next(
            (
                r.seq
                for r in run.records
                if r.kind in ("CellCompleted", "CellFailed") and r.payload.get("cell") == closing
            ),
            None,
        )
        ref = record.get("trace")
        if not ref:
            return trace  # a failed, cancelled or pending cell has no rows
        rows, described = run.traces.cell(ref, record["cell"], f"{run.folder / LEDGER}")
        trace.description = described
        items: dict[str, list[Item]] = {}
        for row in sorted(rows.to_pylist(), key=lambda r: (r["stage"], r["channel"] or "", r["rank"])):
            scopes = tuple(json.loads(row["access_scopes"])) if row["access_scopes"] else None
            item = Item(row["rank"], row["chunk_id"], row["document_id"], row["score"], row["channel"], scopes)
            key = f"channel:{row['channel']}" if row["stage"] == "channel" else row["stage"]
            items.setdefault(key, []).append(item)
        trace.totals = {k: len(v) for k, v in items.items()}
        trace.channels = {
            k.split(":", 1)[1]: v[:ROWS_SHOWN] for k, v in sorted(items.items()) if k.startswith("channel:")
        }
        trace.fused = items.get("fused", [])[:ROWS_SHOWN]
        trace.final = items.get("final", [])[:ROWS_SHOWN]
        answer = described.get("answer") or {}
        citations = answer.get("citations") or []
        shown = items.get("shown", [])
        context_n = len(shown) - len(citations)
        trace.context = shown[:context_n]
        for i, item in enumerate(trace.context, start=1):
            item.label = f"E{i}"  # the context's labels (ragpipe.retrieval.context): E1, E2, … in order
        trace.citations = shown[context_n:]
        for number, (item, cited) in enumerate(zip(trace.citations, citations), start=1):
            item.rank, item.label = number, str(cited.get("label"))  # the answer's order, not the shown row's
        self._hydrate(run, trace, subject)
        self._judge(trace, subject)
        return trace

    @staticmethod
    def _judge(trace: CaseTrace, subject: Subject) -> None:
        """The cell's judge entry (verified with its run), shown only to a reviewer who may read
        every cited item: the answer's text and the verdict's claims quote them."""
        text = trace.description.get("judge")
        if not isinstance(text, str):
            return
        entry = json.loads(text)
        cited = (entry.get("item") or {}).get("cited_evidence") or []
        if all(POLICY.allows(subject, tuple(e.get("access_scopes") or ())) for e in cited):
            trace.judge = entry
        else:
            trace.judge_withheld = True

    def _hydrate(self, run: VerifiedRun, trace: CaseTrace, subject: Subject) -> None:
        """Titles, texts and scopes from the evaluated bundle; withheld outside ``subject``'s scopes."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        every = [*trace.final, *trace.fused, *trace.context, *trace.citations]
        every += [i for ranked in trace.channels.values() for i in ranked]
        bundle = self.ws.bundles / run.spec.body.bundle_id.removeprefix("sha256:")
        documents: dict[str, tuple[str, tuple[str, ...]]] = {}
        texts: dict[str, str] = {}
        doc_ids = sorted({i.document_id for i in every if i.document_id})
        chunk_ids = sorted({i.chunk_id for i in every if i.chunk_id})
        try:
            table = pq.read_table(bundle / "documents.parquet", columns=["document_id", "title", "access_scopes"])
            table = table.filter(pc.is_in(table["document_id"], value_set=_strings(doc_ids)))
            documents = {r["document_id"]: (r["title"], tuple(r["access_scopes"])) for r in table.to_pylist()}
            table = pq.read_table(bundle / "chunks.parquet", columns=["chunk_id", "text"])
            table = table.filter(pc.is_in(table["chunk_id"], value_set=_strings(chunk_ids)))
            texts = {r["chunk_id"]: r["text"] for r in table.to_pylist()}
        except OSError:
            pass  # the bundle left this home: IDs stay, texts are absent (the scopes rule still holds)
        for item in every:
            title, scopes = documents.get(item.document_id or "", (None, item.scopes or ()))
            item.scopes = item.scopes or scopes
            item.visible = bool(item.scopes) and POLICY.allows(subject, item.scopes)
            if item.visible:
                item.title, item.text = title, texts.get(item.chunk_id or "")
            else:
                item.chunk_id = item.document_id = None

    # ---- comparison --------------------------------------------------------------------------
    def comparison(self, incumbent: str, challenger: str) -> tuple[Pairing, Comparison]:
        """The experiment's pairing and comparison of two completed runs (cached by both heads),
        new and lost coverage accepted and listed (``pair(coverage_change=True)``);
        ``ValueError`` (``PairingError``) when they cannot be paired, ``Unverified`` when one
        does not verify or is not completed."""
        a, b = self.run(incumbent), self.run(challenger)
        for run in (a, b):
            if run.arm is None:
                raise Unverified(f"run {run.run_id} is {run.state.status}, not completed: only completed runs compare")
        key = (f"{a.run_id}@{a.head}", f"{b.run_id}@{b.head}")
        with self._lock:
            cached = self._comparisons.get(key)
        if cached is None:
            # as a refresh is gated: cases a corpus change adds or loses are listed, not refused
            pairing = pair(a.arm, b.arm, coverage_change=True)  # type: ignore[arg-type]
            cached = (pairing, compare(pairing))
            with self._lock:
                _bounded_put(self._comparisons, key, cached)
        return cached

    def answer_quality(self, run_id: str) -> dict[str, Any] | None:
        """A judged run's answer quality (``ragpipe.evaluation.report.answer_quality``: the label
        distributions over cells and cases, judge failures, agreement with reference labels),
        computed from its verified ledger; None when the run judges nothing."""
        run = self.run(run_id)
        if run.spec.body.judge is None:
            return None
        return answer_quality(run.state, evaluated_cases(run.state), run.spec.suite.quality_labels())

    def corpus_digest(self, bundle_id: str) -> str | None:
        """The corpus digest the bundle's manifest records, None when the bundle is not here."""
        try:
            manifest = json.loads((self.ws.bundles / bundle_id.removeprefix("sha256:") / "manifest.json").read_bytes())
            return str(manifest["semantic"]["corpus_digest"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    # ---- corpus -------------------------------------------------------------------------------
    def revisions(self) -> list[str]:
        if not self.ws.registry.is_dir():
            return []
        return sorted(p.stem for p in self.ws.registry.glob("*.json") if p.is_file() and not p.is_symlink())

    def corpus(self, revision: str) -> dict[str, Any]:
        """A revision's registration, its latest snapshot (digest, documents, exclusions with
        reasons), the latest counts of the stages after it, and the bundles built from it."""
        if revision not in self.revisions():
            raise NotFound(f"no corpus revision {revision!r}")
        registered = _json(self.ws.registry / f"{revision}.json") or {}
        pointer = _json(self.ws.stage_dir(revision, SNAPSHOT_STAGE) / "latest.json") or {}
        snapshot: dict[str, Any] = {}
        version = str(pointer.get("data_version", ""))
        if version.startswith("sha256:") and "/" not in version:
            snapshot = _json(self.ws.stage_dir(revision, SNAPSHOT_STAGE) / version[7:] / "snapshot.json") or {}
        counts = {}
        for stage in COUNT_STAGES:
            record = _json(self.ws.stage_dir(revision, stage) / "latest.json") or {}
            counts[stage] = dict(record.get("facts") or {})
        digest = snapshot.get("corpus_digest")
        bundles = []
        if digest and self.ws.bundles.is_dir():
            for folder in sorted(self.ws.bundles.iterdir()):
                manifest = _json(folder / "manifest.json") if folder.is_dir() else None
                semantic = (manifest or {}).get("semantic") or {}
                if semantic.get("corpus_digest") == digest:
                    bundles.append({"bundle_id": manifest["bundle_id"], "counts": semantic.get("counts", {})})
        runs = {b["bundle_id"]: [r.run_id for r in self.runs() if r.bundle_id == b["bundle_id"]] for b in bundles}
        return {
            "revision": revision,
            "registered": self.redact.tree(registered),
            "snapshot": self.redact.tree(snapshot),
            "snapshot_version": version,
            "counts": counts,
            "bundles": bundles,
            "runs": runs,
        }


def _regular_files(folder: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, path) of every regular file under ``folder``, sorted; a symbolic link
    (file or folder) and everything below one is left out (``rglob`` does not descend into them)."""
    found = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        chain = [folder / rel.parents[i] for i in range(len(rel.parts) - 1)]
        if path.is_symlink() or any(p.is_symlink() for p in chain) or not path.is_file():
            continue
        found.append((rel.as_posix(), path))
    return found


def _strings(values: list[str]):
    import pyarrow as pa

    return pa.array(values, type=pa.string())


def _json(path: Path) -> dict[str, Any] | None:
    """A JSON object file of the workspace, None when it is absent, unreadable or not an object."""
    try:
        if path.is_symlink():
            return None
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
