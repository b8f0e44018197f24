"""A living corpus over ten nights, driven through Dagster's own schedule and sensor.

``NightlyLoop`` keeps a watched BEIR source and a suite that grows and shrinks with it, made from
the SciFact sample (``SAMPLE``): a base of judged and unjudged abstracts, and a pool of further
judged abstracts that later nights add. Each ``night`` writes the source (and suite, and perhaps
another pipeline spec), evaluates the real ``nightly_rebuild`` schedule tick
(``build_schedule_context``), executes the run it requests as the daemon would (same job,
partition and tags), then evaluates the real ``activation_sensor`` tick
(``build_sensor_context``) and executes its requests; it returns what happened (``Night``).
Used by the end-to-end test and by ``benchmarks/nightly_loop.py``.
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, build_schedule_context, build_sensor_context

from ragpipe.defs import build_definitions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.experiment.gate_policy import load_policy, policy_document
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.kept_decision import read_gate_evidence
from ragpipe.release.manifest import load_manifest
from ragpipe.release.pointer import read_pointer
from ragpipe.release.store import ReleaseStore
from ragpipe_tests.support.paths import REPO, SAMPLE

FIRST_NIGHT = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
TARGETS = """schema: ragpipe.targets/v1
default_target: staging
targets:
  staging: {approval_required: false, auto_activate: true, waive_human_apply: true, gate_policies: [policy.yaml]}
  production: {approval_required: true, auto_activate: false, gate_policies: [policy.yaml]}
"""


def sample_material() -> tuple[dict[str, dict], list[dict]]:
    """The sample's revision-1 documents by ID, and its suite cases that judge exactly one of them
    (sorted by case ID)."""
    docs = {}
    for line in (SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        docs[doc["_id"]] = doc
    cases = []
    for line in (SAMPLE / "suite.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        if len(case["judgments"]) == 1 and next(iter(case["judgments"])) in docs:
            cases.append({k: v for k, v in case.items() if k != "split"})
    return docs, sorted(cases, key=lambda c: c["id"])


def judged(case: dict) -> str:
    return next(iter(case["judgments"]))


@dataclass
class Night:
    """One night: the revision the schedule registered, the release its build published, the
    gate's change kind and reasons, what staging serves after the sensor, texts encoded and the
    night's wall time (schedule tick to the sensor's activation, seconds)."""

    number: int
    revision: str
    release_id: str
    change: str | None
    differs: tuple[str, ...]
    eligible: bool
    reasons: tuple[str, ...]
    new_coverage: tuple[str, ...]
    lost_coverage: tuple[str, ...]
    staging: str | None
    encoded: int
    seconds: float
    documents: int
    cases: int


@dataclass
class NightlyLoop:
    root: Path
    base_judged: int = 24
    base_unjudged: int = 16
    docs: dict[str, dict] = field(default_factory=dict)  # the source as it is now
    cases: list[dict] = field(default_factory=list)  # the suite as it is now
    pool: list[dict] = field(default_factory=list)  # judged cases (and their documents) to add later
    spare: list[str] = field(default_factory=list)  # unjudged documents to add later
    sample: dict[str, dict] = field(default_factory=dict)
    nights: list[Night] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sample, judged_cases = sample_material()
        judged_ids = {judged(c) for c in judged_cases}
        unjudged = sorted(d for d in self.sample if d not in judged_ids)
        self.cases = judged_cases[: self.base_judged]
        self.pool = judged_cases[self.base_judged :]
        self.docs = {judged(c): self.sample[judged(c)] for c in self.cases}
        self.docs |= {d: self.sample[d] for d in unjudged[: self.base_unjudged]}
        self.spare = unjudged[self.base_unjudged :]
        self.home = self.root / "home"
        (self.root / "src").mkdir(parents=True)
        (self.root / "dagster").mkdir()
        # entered, as the daemon's is: Dagster finds the instance's state storage through it
        self._stack = ExitStack()
        self.instance = self._stack.enter_context(DagsterInstance.local_temp(str(self.root / "dagster")))
        policy = policy_document(load_policy())
        policy["coverage"]["min_cases"] = 10  # the suite starts at 24 cases
        (self.root / "policy.yaml").write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
        (self.root / "targets.yaml").write_text(TARGETS, encoding="utf-8")
        (self.root / "sources.yaml").write_text(
            "schema: ragpipe.sources/v1\nsources:\n"
            "  - {name: kb, path: src/corpus.jsonl, format: beir, default_scope: public}\n",
            encoding="utf-8",
        )
        self.write_spec("pipeline.yaml", {})
        self._cursor: str | None = None  # the activation sensor's, tick to tick

    def env(self, spec: str = "pipeline.yaml") -> dict[str, str]:
        """The environment the code location and the commands read."""
        return {
            "RAGPIPE_HOME": str(self.home),
            "RAGPIPE_SOURCES": str(self.root / "sources.yaml"),
            "RAGPIPE_TARGETS": str(self.root / "targets.yaml"),
            "RAGPIPE_PIPELINE_SPEC": str(self.root / spec),
        }

    def write_spec(self, name: str, chunker: dict) -> None:
        """The checked-in pipeline spec with this suite and policy (and ``chunker`` edits)."""
        spec = yaml.safe_load((REPO / "ragpipe" / "specs" / "pipeline.yaml").read_text(encoding="utf-8"))
        spec["chunker"] |= chunker
        spec["evaluation"] |= {"suite": "suite.jsonl", "gate_policy": "policy.yaml", "query_plan": None}
        (self.root / name).write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")

    # -- the night's changes ---------------------------------------------------------------------

    def add_judged(self, n: int) -> list[str]:
        """Add the next ``n`` pooled cases and their documents; their case IDs."""
        added, self.pool = self.pool[:n], self.pool[n:]
        for case in added:
            self.docs[judged(case)] = self.sample[judged(case)]
            self.cases.append(case)
        return [c["id"] for c in added]

    def add_unjudged(self, n: int) -> None:
        added, self.spare = self.spare[:n], self.spare[n:]
        self.docs |= {d: self.sample[d] for d in added}

    def edit(self, n: int, night: int) -> None:
        """Append a sentence to the first ``n`` documents (in ID order)."""
        for doc_id in sorted(self.docs)[:n]:
            doc = self.docs[doc_id]
            self.docs[doc_id] = {**doc, "text": f"{doc['text']} Revised on night {night}."}

    def delete_unjudged(self, n: int) -> None:
        keep = {judged(c) for c in self.cases}
        for doc_id in [d for d in sorted(self.docs) if d not in keep][:n]:
            del self.docs[doc_id]

    def delete_judged(self, n: int, *, keep_case: bool) -> list[str]:
        """Delete the documents judged by the first ``n`` cases; their cases leave the suite too
        unless ``keep_case`` (then the incumbent alone can evaluate them: lost coverage)."""
        gone = self.cases[:n]
        for case in gone:
            del self.docs[judged(case)]
        if not keep_case:
            self.cases = self.cases[n:]
        return [judged(c) for c in gone]

    def truncate_judged_half(self) -> list[str]:
        """Cut half of the judged documents (every other one) to their first six words."""
        cut = sorted({judged(c) for c in self.cases if judged(c) in self.docs})[::2]
        for doc_id in cut:
            doc = self.docs[doc_id]
            self.docs[doc_id] = {**doc, "text": " ".join(doc["text"].split()[:6])}
        return cut

    def snapshot(self) -> tuple[dict[str, dict], list[dict]]:
        return {k: dict(v) for k, v in self.docs.items()}, [dict(c) for c in self.cases]

    def restore(self, state: tuple[dict[str, dict], list[dict]]) -> None:
        self.docs, self.cases = {k: dict(v) for k, v in state[0].items()}, [dict(c) for c in state[1]]

    # -- one night through Dagster ---------------------------------------------------------------

    def _write_inputs(self) -> None:
        lines = [json.dumps(self.docs[d], ensure_ascii=False, sort_keys=True) for d in sorted(self.docs)]
        (self.root / "src" / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        suite = [json.dumps(c, ensure_ascii=False, sort_keys=True) for c in self.cases]
        (self.root / "suite.jsonl").write_text("\n".join(suite) + "\n", encoding="utf-8")

    def latest(self, asset: str, revision: str):
        """The metadata of ``asset``'s latest materialization for ``revision``."""
        (record,) = self.instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[revision]), limit=1
        ).records
        return record.asset_materialization.metadata

    def night(self, monkeypatch, spec: str = "pipeline.yaml") -> Night:
        """Run tonight's schedule tick, its build, then the activation sensor's tick and runs."""
        # Dagster finds "the" instance's definitions-state storage through a context variable that
        # an instance sets when entered; an instance Dagster opens from the same home inside a run
        # leaves it pointing at that (later collected) instance, and a later definitions load then
        # fails with "undefined DagsterInstance weakref". A daemon enters its instance per tick;
        # each night does the same (a private Dagster name: test support only).
        from dagster._core.storage.defs_state.base import set_defs_state_storage

        with set_defs_state_storage(self.instance.defs_state_storage):
            return self._night(monkeypatch, spec)

    def _night(self, monkeypatch, spec: str) -> Night:
        number = len(self.nights) + 1
        self._write_inputs()
        for key, value in self.env(spec).items():
            monkeypatch.setenv(key, value)
        t0 = time.perf_counter()
        defs = build_definitions()
        resources = {"ragpipe": RagpipeHome(home=str(self.home))}
        when = FIRST_NIGHT + timedelta(days=number - 1)
        schedule = defs.get_schedule_def("nightly_rebuild").evaluate_tick(
            build_schedule_context(
                instance=self.instance,
                scheduled_execution_time=when,
                resources=resources,
                repository_def=defs.get_repository_def(),
            )
        )
        (request,) = schedule.run_requests
        build = defs.resolve_job_def("build_revision").execute_in_process(
            partition_key=request.partition_key,
            instance=self.instance,
            tags={**request.tags, "dagster/run_key": request.run_key},
        )
        assert build.success, f"night {number}: the build of {request.partition_key} failed"
        revision = request.partition_key
        sensor = defs.get_sensor_def("activation_sensor")
        tick = sensor.evaluate_tick(
            build_sensor_context(instance=self.instance, cursor=self._cursor, resources=resources, definitions=defs)
        )
        self._cursor = tick.cursor
        for run in tick.run_requests:
            result = defs.resolve_job_def("activate_release").execute_in_process(
                run_config=run.run_config,
                instance=self.instance,
                # the tags the daemon gives a run it launches for a sensor
                tags={**run.tags, "dagster/run_key": run.run_key, "dagster/sensor_name": "activation_sensor"},
            )
            assert result.success, f"night {number}: activation run {run.run_key} failed"
        seconds = time.perf_counter() - t0
        return self._record(number, revision, seconds)

    def _record(self, number: int, revision: str, seconds: float) -> Night:
        ws = Workspace(self.home)
        store = ReleaseStore(ws)
        release_id = str(self.latest("release_manifest", revision)["release_id"].value)
        manifest = load_manifest(store, release_id)
        decision, comparison, _ = read_gate_evidence(store, manifest.gate.decision_id)
        pointer = read_pointer(store, "staging")
        cert = comparison.certificate if comparison is not None else None
        night = Night(
            number=number,
            revision=revision,
            release_id=release_id,
            change=decision.change.kind if decision.change else None,
            differs=decision.change.differs if decision.change else (),
            eligible=decision.eligible,
            reasons=decision.reasons,
            new_coverage=tuple(c for c, _ in cert.new_coverage) if cert else (),
            lost_coverage=tuple(c for c, _ in cert.lost_coverage) if cert else (),
            staging=pointer.release_id if pointer else None,
            encoded=int(self.latest("embeddings", revision)["encoded"].value),
            seconds=seconds,
            documents=len(self.docs),
            cases=len(self.cases),
        )
        self.nights.append(night)
        return night

    def close(self) -> None:
        self._stack.close()
        shutil.rmtree(self.root / "dagster", ignore_errors=True)


@dataclass
class TenNights:
    """What the scenario changed: the cases added on a night, the judged documents deleted on
    night 5 (with their case) and night 6 (case kept), and those night 7 truncated."""

    added: dict[int, list[str]]
    removed_with_case: list[str]
    removed_case_kept: list[str]
    truncated: list[str]


def ten_nights(loop: NightlyLoop, monkeypatch) -> TenNights:
    """The scenario of ``test_nightly_loop`` and ``benchmarks/nightly_loop.py``, night by night."""
    added: dict[int, list[str]] = {}
    loop.night(monkeypatch)  # 1: the first revision, no incumbent
    added[2] = loop.add_judged(2)
    loop.night(monkeypatch)  # 2: two documents and their cases
    loop.edit(3, 3)
    loop.night(monkeypatch)  # 3: three documents edited
    loop.delete_unjudged(2)
    added[4] = loop.add_judged(1)
    loop.night(monkeypatch)  # 4: two deleted, one added with its case
    removed5 = loop.delete_judged(1, keep_case=False)
    loop.add_unjudged(2)
    loop.night(monkeypatch)  # 5: a judged document deleted with its case
    removed6 = loop.delete_judged(1, keep_case=True)
    added[6] = loop.add_judged(1)
    loop.night(monkeypatch)  # 6: a judged document deleted, its case kept (lost coverage)
    good = loop.snapshot()
    truncated = loop.truncate_judged_half()
    loop.night(monkeypatch)  # 7: half of the judged documents cut to six words
    loop.restore(good)
    added[8] = loop.add_judged(1)
    loop.night(monkeypatch)  # 8: repaired, one added
    loop.write_spec("chunker.yaml", {"max_bytes": 600, "overlap_bytes": 100})
    loop.add_unjudged(1)
    loop.night(monkeypatch, "chunker.yaml")  # 9: another chunker
    loop.edit(2, 10)
    loop.add_unjudged(2)
    loop.night(monkeypatch)  # 10: the checked-in chunker again, two edited, two added
    return TenNights(added, removed5, removed6, truncated)
