"""Evaluation runs: create, execute and resume (the API behind ``ragpipe eval``; reading and
verifying a run folder is ``run_folder.py``).

    spec = EvaluationSpec.build(suite, plan, bundle_path, retriever.bundle_id, mode="hybrid")
    result = run_evaluation(spec, Path("runs/x"), retriever_factory=lambda _: retriever)
    result = resume_evaluation(Path("runs/x"))       # runs only the cells the ledger lacks

Run folder: ``ledger.jsonl`` + ``ledger.head`` (custody, ``ledger.py``), ``inputs/`` (canonical
copies of the suite, the query plan and the spec body, each bound by an ``InputBound`` record with
its digest), ``traces/`` (``traces.py``), ``report.json`` / ``report.md`` (``report.py``). A fourth
``InputBound`` record, ``bundle``, binds the evaluated bundle without copying it: its material
digest, its ID and its build figures (``bundle_binding``), which the gate's cost phase reads. The folder
is published atomically holding its inputs and first records, so a run folder without its inputs
never exists. Cells run in expected order, in groups of ``cells_per_commit`` (a group commit):
the group's ``CellStarted`` records are appended with one fsync, its cells executed, their traces
published as one file (``traces.write_traces``, on a writer thread while the next group runs),
then their closing records appended with one fsync, after the next group's starts. A crash at any
point leaves each cell closed or not (never half-closed): the closing records are a prefix of the
group's, and a cell whose record is not durable is simply run again on resume (at most two groups). When none is missing, ``RunCompleted`` is appended and the reports are written.
A closed cell is never rerun. The group size is operational: it changes where records and rows
are stored, never what they say.

Pending answers: in a run that generates answers with a model, each cell's answer is kept in
``answers/<cell digest>/`` (``pending_answers``) by the generator's own answer cache until the
cell's closing record is durable, then removed (a closed cell is never run again, so nothing
needs it); the folder goes before ``RunCompleted`` is appended, so no crash leaves one in a
completed run. A cell run again on resume — its group stopped by a judge
budget, an interrupt or a crash — thus reuses the answer it was given: an entry is served only
when it names the key this cell's question, certified evidence, prompt and provider
configuration make now and its value's digest recomputes (else it is set aside and the model
asked again), and the cell's record says ``answer_usage.cached``. A failed call is never kept.
"""

from __future__ import annotations

import gc
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragpipe.bundle.manifest import BundleManifest
from ragpipe.evaluation.cell import CellRun, run_cell, score_group
from ragpipe.evaluation.eval_spec import EvaluationSpec, SpecBody, searches_approximately
from ragpipe.evaluation.judging import Judging, judge_cells
from ragpipe.evaluation.ledger import LEDGER, MAX_CELLS_PER_COMMIT, Ledger
from ragpipe.evaluation.report import build_report, write_reports
from ragpipe.evaluation.run_folder import (
    BUNDLE_INPUT,
    INPUTS,
    JUDGE_INPUT,
    RunError,
    load_inputs,
    rebuild_report,
)
from ragpipe.evaluation.run_state import CellKey, RunState, cell_dict
from ragpipe.evaluation.suite import check_against_bundle, suite_bytes
from ragpipe.evaluation.traces import TRACES, trace_name, write_traces
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import bytes_digest
from ragpipe.kernel.publish import PublishOutcome, publish_directory
from ragpipe.retrieval.retriever import Retriever
from ragpipe.retrieval.vector_engine import VectorEngine

RetrieverFactory = Callable[[EvaluationSpec], Retriever]
Progress = Callable[[int, int, CellKey], None]  # (cells done, cells expected, cell just closed)
# Cells closed by one group commit: 32 puts the commit's fsyncs and file publication below 1 % of a
# k = 1000 SciFact cell (docs/benchmarks.md, "Group commit"); a crash loses at most two groups' work.
CELLS_PER_COMMIT = 32
ANSWERS = "answers"  # the pending answers of cells not closed yet (module docstring)


@dataclass(frozen=True)
class EvaluationResult:
    """``report``: rebuilt from the ledger; ``vector_engine``: which engine served the vector
    channel in this process and why (``ragpipe.retrieval.vector_engine``; operational, not in the
    ledger; None when no query ran here or the bundle has no vectors)."""

    report: dict[str, Any]
    out: Path
    vector_engine: VectorEngine | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``eval --json`` object: the report plus where the run folder is."""
        return {**self.report, "out": str(self.out)}


def new_run_id() -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, version 7, variant 10, 74 random bits."""
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    value = (value & ~(0xF << 76)) | (0x7 << 76)
    value = (value & ~(0x3 << 62)) | (0x2 << 62)
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def pending_answers(run: Path, key: CellKey) -> Path:
    """The folder keeping cell ``key``'s answer until the cell closes: one per cell, so the
    repeats of a case never share an answer."""
    return run / ANSWERS / bytes_digest(canonical_bytes(cell_dict(key))).split(":", 1)[1]


def default_factory(spec: EvaluationSpec) -> Retriever:
    return Retriever(spec.bundle_path, plan=spec.plan)


def _check_retriever(retriever: Retriever, body: SpecBody) -> None:
    if retriever.bundle_id != body.bundle_id:
        raise RunError(f"bundle {retriever.bundle_id} is not the spec's bundle {body.bundle_id}")
    if retriever.plan.plan_id != body.plan_id:
        raise RunError(f"query plan {retriever.plan.plan_id} is not the spec's plan {body.plan_id}")
    if searches_approximately(retriever.plan, body.mode):
        # a bundle without an ANN index refuses every query of this mode: refused before the run
        # exists (``QueryError``), not cell by cell; a lexical run of the same plan is served
        retriever.check_mode(body.mode)


def _input_bytes(spec: EvaluationSpec) -> dict[str, bytes]:
    plan = canonical_bytes(spec.plan.model_dump(mode="json", by_alias=True)) + b"\n"
    data = {"suite": suite_bytes(spec.suite), "query_plan": plan, "spec": canonical_bytes(spec.body.as_json()) + b"\n"}
    if spec.judge is not None:  # the whole judge spec, prompt text included: a verifier rebuilds each request
        data["judge"] = canonical_bytes(spec.judge.record()) + b"\n"
    return data


def bundle_binding(manifest: BundleManifest) -> dict[str, Any]:
    """The ``InputBound`` payload of the evaluated bundle: ``digest`` its material digest (the
    exact bytes evaluated), ``content_id`` its bundle ID, and the deterministic figures of its
    build cost taken from the verified manifest — ``vectors`` (the embedded representations: a
    cold build's dominant cost) and ``payload_bytes`` (every listed file: serving and storage).
    Facts about the bundle, never about the attempt, and outside the spec ID (the bundle ID binds
    the vector count, the material digest the sizes)."""
    return {
        "name": BUNDLE_INPUT,
        "digest": manifest.material_digest,
        "content_id": manifest.bundle_id,
        "vectors": manifest.semantic.counts.vectors,
        "payload_bytes": manifest.payload_bytes,
    }


def create_run(spec: EvaluationSpec, out: Path, retriever: Retriever, run_id: str | None = None) -> None:
    """Publish the run folder with its inputs and the records RunCreated + InputBound×4 (the
    three copied inputs, then the bundle). RunCreated lists each case's run tags (``Case.run_tags``)
    and, when the suite has any, its ``provisional`` cases (reports mark them)."""
    body = spec.body
    statuses = check_against_bundle(spec.suite, retriever.scopes.keys(), retriever.chunks.keys())
    cells = [cell_dict((s.case_id, r, body.arm)) for s in statuses if s.evaluable for r in range(body.repeats)]
    created = {
        "run_id": run_id or new_run_id(),
        "spec_id": spec.spec_id,
        "spec": body.as_json(),
        "cases": len(spec.suite.cases),
        "cells": cells,
        "skipped": [
            {"case_id": s.case_id, "reason": s.reason, "missing": list(s.missing)} for s in statuses if not s.evaluable
        ],
        # a case's stratum is a tag ``stratum:<name>``, so per-tag slices and regression limits cover it
        "tags": {c.id: tags for c in spec.suite.cases if (tags := c.run_tags())},
        # only when the suite has one, so a run of an adjudicated suite records what it always did
        **({"provisional": list(provisional)} if (provisional := spec.suite.provisional()) else {}),
        # Operational: where to reopen the bundle on resume — relative to the run folder, so a home
        # (its evaluations/ and bundles/) that is copied or moved still finds it.
        "bundle_path": os.path.relpath(Path(spec.bundle_path).resolve(), out.resolve()),
    }
    content_ids = {"suite": body.suite_digest, "query_plan": body.plan_id, "spec": spec.spec_id, "judge": body.judge}
    paths = {**INPUTS, **JUDGE_INPUT}

    def write_data(tmp: Path) -> None:
        (tmp / "inputs").mkdir()
        (tmp / TRACES).mkdir()
        with Ledger.create(tmp) as ledger:
            ledger.append("RunCreated", created)
            for name, data in _input_bytes(spec).items():
                (tmp / paths[name]).write_bytes(data)
                ledger.append(
                    "InputBound",
                    {"name": name, "path": paths[name], "digest": bytes_digest(data), "content_id": content_ids[name]},
                )
            ledger.append("InputBound", bundle_binding(retriever.bundle.manifest))

    if out.exists() or out.is_symlink():
        raise RunError(f"{out}: already exists (a run folder is created once; use --resume to continue it)")
    if publish_directory(out, write_data, lambda tmp: None) is PublishOutcome.existing:
        raise RunError(f"{out}: already exists (a run folder is created once; use --resume to continue it)")


@contextmanager
def long_lived_heap_frozen() -> Iterator[None]:
    """While the cells run: freeze the collector's view of the objects alive now (the retriever's
    tables: ~760k tracked objects on SciFact; a full collection rescans them all, ~0.45 s each) and
    raise the young generation's threshold to 100,000 allocations; afterwards restore both. The
    cells' short-lived trace objects otherwise cost ~5 ms a cell in collector pauses (measured on
    SciFact, docs/benchmarks.md). A heap the process owner froze already stays frozen."""
    thresholds = gc.get_threshold()
    # A cell allocates ~10^5 short-lived objects (its trace's hits and rows), all garbage once the
    # cell ends and none in a reference cycle: a young-generation pass every 700 allocations
    # (the default) only re-traces them while they are alive.
    gc.set_threshold(max(thresholds[0], 100_000), *thresholds[1:])
    frozen = not gc.get_freeze_count()
    if frozen:
        gc.freeze()
    try:
        yield
    finally:
        if frozen:
            gc.unfreeze()
        gc.set_threshold(*thresholds)


def _check_judging(spec: EvaluationSpec, judging: Judging | None) -> None:
    """A run whose answers are judged is given how to reach its judge, that very judge (by spec ID:
    the timeout is operational), and only such a run is."""
    if spec.judge is None and judging is not None:
        raise RunError("judging was given, but the run's answers are not judged (its spec names no judge)")
    if spec.judge is not None and judging is None:
        raise RunError("the run's answers are judged: pass judging, how to reach its judge (ragpipe eval does)")
    if spec.judge is not None and judging is not None and judging.spec.spec_id != spec.judge.spec_id:
        raise RunError(f"the judge given ({judging.spec.spec_id}) is not the run's judge ({spec.judge.spec_id})")


def _execute(
    run: Path,
    ledger: Ledger,
    spec: EvaluationSpec,
    retriever: Retriever,
    on_progress: Progress | None,
    cells_per_commit: int = CELLS_PER_COMMIT,
    judging: Judging | None = None,
) -> EvaluationResult:
    if not 1 <= cells_per_commit <= MAX_CELLS_PER_COMMIT:
        raise RunError(f"cells per commit must be 1 to {MAX_CELLS_PER_COMMIT}, got {cells_per_commit}")
    _check_judging(spec, judging)
    with long_lived_heap_frozen():
        return _execute_cells(run, ledger, spec, retriever, on_progress, cells_per_commit, judging)


def _closing(runs: Sequence[CellRun], refs: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The closing records of a group: each traced cell's payload with its trace reference."""
    given = iter(refs)
    return [(r.kind, r.payload if r.rows is None else {**r.payload, "trace": next(given)}) for r in runs]


def _referenced(state: RunState) -> set[str]:
    return {str(p["trace"]["file"]) for p in state.terminal.values() if "trace" in p}


@dataclass(frozen=True)
class _Written:
    """A group whose trace file a writer thread is publishing; its cells close once it is durable."""

    group: Sequence[CellKey]
    runs: Sequence[CellRun]
    refs: Future[list[dict[str, Any]]] | None  # None: no cell of the group has a trace


def _publish(
    writer: ThreadPoolExecutor, run: Path, ledger: Ledger, name: str, group: Sequence[CellKey], runs: Sequence[CellRun]
) -> _Written:
    """Hand the group's trace file to ``writer``. A group's first cell is not closed, so no closed
    cell's rows can be in a file of its name (a file of a group none of whose cells closed is
    replaced); checked, as replacing it would lose them."""
    if name in _referenced(ledger.state):
        raise RunError(f"{run / name}: holds rows of closed cells; it is not replaced")
    traced = [(r.rows, r.described) for r in runs if r.rows is not None]
    return _Written(group, runs, writer.submit(write_traces, run, name, traced) if traced else None)


def _close(ledger: Ledger, written: _Written) -> None:
    """Wait until the group's trace file is durable, then append its closing records (one fsync)."""
    refs = written.refs.result() if written.refs is not None else []
    ledger.append_group(_closing(written.runs, refs))
    if (ledger.folder / ANSWERS).is_dir():
        for key in written.group:  # closed: never run again
            shutil.rmtree(pending_answers(ledger.folder, key), ignore_errors=True)


def _salvage(ledger: Ledger, written: _Written, error: BaseException) -> None:
    """Close ``written`` while ``error`` stops the run, once its trace file is durable: its cells
    are done, and an interruption elsewhere (never inside a ledger append) must not cost them. A
    write that failed too is noted on ``error``, not lost."""
    try:
        _close(ledger, written)
    except Exception as also:
        error.add_note(f"the trace file of the group before could not be written either: {also}")


def _execute_cells(
    run: Path,
    ledger: Ledger,
    spec: EvaluationSpec,
    retriever: Retriever,
    on_progress: Progress | None,
    cells_per_commit: int,
    judging: Judging | None,
) -> EvaluationResult:
    """Run the missing cells group by group. A group's trace file is encoded, written and fsynced
    by a second thread while this one runs the next group's queries (Parquet encoding, zstd and
    fsync release the GIL); its closing records follow the next group's ``CellStarted`` records,
    appended here, so the ledger keeps one writer and one order: starts of group n + 1, then the
    closes of group n. A crash therefore loses at most two groups' work, never a closed cell."""
    state = ledger.state
    cases = spec.suite.by_id()
    position = {key: i for i, key in enumerate(state.expected, start=1)}
    done, missing = len(state.terminal), state.missing()

    def kept(key: CellKey) -> Path | None:
        return pending_answers(run, key) if spec.body.answers else None

    def closed(written: _Written) -> None:
        nonlocal done
        _close(ledger, written)
        for key in written.group:
            done += 1
            if on_progress is not None:
                on_progress(done, len(state.expected), key)

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragpipe-traces") as writer:
        pending: _Written | None = None
        for start in range(0, len(missing), cells_per_commit):
            group = missing[start : start + cells_per_commit]
            if pending is not None and pending.refs is not None and pending.refs.done():
                pending.refs.result()  # a failed write stops the run before another group starts
            ledger.append_group([("CellStarted", {"cell": cell_dict(key)}) for key in group])
            try:
                runs = [run_cell(retriever, spec.body, cases[key[0]], key, kept(key)) for key in group]
                score_group(runs, cases, spec.body)
                if judging is not None:
                    judge_cells([(r.judge_item, r.payload, r.described) for r in runs if r.judge_item], judging)
            except BaseException as exc:  # an interrupt, a cancelled run: keep what is on disk
                if pending is not None:
                    _salvage(ledger, pending, exc)
                raise
            if pending is not None:
                closed(pending)
            pending = _publish(writer, run, ledger, trace_name(position[group[0]]), group, runs)
        if pending is not None:
            closed(pending)
    final = ledger.state
    failed = sum(1 for p in final.terminal.values() if p["outcome"] in ("failure", "cancelled"))
    shutil.rmtree(run / ANSWERS, ignore_errors=True)  # every cell is closed: before the run is
    ledger.append(
        "RunCompleted", {"cells": len(final.expected), "completed": len(final.terminal) - failed, "failed": failed}
    )
    report = build_report(run, ledger.records, ledger.state, spec.suite.quality_labels())
    write_reports(run, report)
    return EvaluationResult(report, run, getattr(retriever, "vector_engine", None))


def run_evaluation(
    spec: EvaluationSpec,
    out: Path,
    *,
    retriever_factory: RetrieverFactory | None = None,
    on_progress: Progress | None = None,
    run_id: str | None = None,
    cells_per_commit: int = CELLS_PER_COMMIT,
    judging: Judging | None = None,
) -> EvaluationResult:
    """Create the run folder ``out`` for ``spec`` (run ID ``run_id`` or a fresh UUIDv7) and
    execute every expected cell, ``cells_per_commit`` at a time (module docstring); ``judging``:
    how to reach the judge of a spec that names one (``ragpipe.evaluation.judging``)."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise RunError(f"{out}: already exists (a run folder is created once; use --resume to continue it)")
    retriever = (retriever_factory or default_factory)(spec)
    _check_retriever(retriever, spec.body)
    _check_judging(spec, judging)  # before the run folder exists
    create_run(spec, out, retriever, run_id)
    with Ledger.open(out) as ledger:
        return _execute(out, ledger, spec, retriever, on_progress, cells_per_commit, judging)


def resume_evaluation(
    out: Path,
    *,
    retriever_factory: RetrieverFactory | None = None,
    on_progress: Progress | None = None,
    cells_per_commit: int = CELLS_PER_COMMIT,
    judging: Callable[[EvaluationSpec], Judging] | None = None,
) -> EvaluationResult:
    """Verify ``out`` (chain, head, inputs, spec ID) and run only the missing cells. A completed
    run is not touched (its report is rebuilt from the ledger); a failed run is refused.
    ``judging`` makes, from the run's bound judge spec, how to reach it this time."""
    out = Path(out)
    with Ledger.open(out) as ledger:
        spec = load_inputs(out, ledger.records, ledger.state)
        if ledger.state.status == "completed":
            return EvaluationResult(rebuild_report(out), out)
        if ledger.state.status == "failed":
            raise RunError(
                f"{out / LEDGER}: record {len(ledger.records)}: the run failed ({ledger.state.outcome['reason']}); it cannot be resumed"
            )
        retriever = (retriever_factory or default_factory)(spec)
        _check_retriever(retriever, spec.body)
        reached = judging(spec) if judging is not None and spec.judge is not None else None
        return _execute(out, ledger, spec, retriever, on_progress, cells_per_commit, reached)


__all__ = [
    "CELLS_PER_COMMIT",
    "EvaluationResult",
    "bundle_binding",
    "create_run",
    "new_run_id",
    "pending_answers",
    "resume_evaluation",
    "run_evaluation",
]
