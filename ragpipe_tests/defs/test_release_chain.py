"""The evaluation → gate → release chain through Dagster, on both sample revisions.

Revision 1 is built through the whole chain (bootstrap gate: no release is active), its release is
activated on staging with the ``activate_release`` job, then revision 2 is built and gated against
it (paired). Each sample revision is built once for the module.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import AssetKey, AssetRecordsFilter, DagsterEventType, DagsterInstance

from ragpipe.api import retriever_for_release
from ragpipe.corpus.registry import register_revision
from ragpipe.defs import build_definitions
from ragpipe.evaluation.ledger import read_ledger
from ragpipe.evaluation.run_folder import verify_run
from ragpipe.experiment.decision import Decision
from ragpipe.experiment.gate_policy import policy_document
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.publish import FILE_STEPS
from ragpipe.kernel.workspace import Workspace
from ragpipe.orchestration.materialize import materialize_revision
from ragpipe.release import bound_run
from ragpipe.release.activation import activate
from ragpipe.release.bound_run import load_run
from ragpipe.release.kept_decision import evidence_path, gate_problems
from ragpipe.release.manifest import load_manifest
from ragpipe.release.status import resolve_active
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.targets import load_targets
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages.chain_plan import chain_plan
from ragpipe.stages.eval_steps import attempt_version, check_evaluation_run, run_evaluation_run
from ragpipe.stages.gate_steps import run_gate_decision
from ragpipe.stages.release_steps import run_release_manifest
from ragpipe.stages.stage_store import StageError, publish_output
from ragpipe.stages.steps import read_stage_record
from ragpipe_tests.support.paths import REPO, SAMPLE

CHAIN = ["evaluation_run", "gate_decision", "release_manifest"]


def latest(instance: DagsterInstance, asset: str, rev: str):
    (rec,) = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[rev]), limit=1
    ).records
    return rec.asset_materialization


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("chain")
    ws = Workspace(root / "ragpipe")
    (root / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(root / "dagster"))
    spec = load_pipeline_spec()
    summaries, activation = {}, None
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAGPIPE_HOME", str(ws.home))
        defs = build_definitions()
        for rev, path in (("scifact-1", SAMPLE / "rev-1.jsonl"), ("scifact-2", SAMPLE / "rev-2.jsonl")):
            register_revision(ws.registry, rev, path, "beir", "public")
            summaries[rev] = materialize_revision(rev, ws, instance=instance, spec=spec)
            if rev == "scifact-1":
                config = {
                    "ops": {"activate": {"config": {"release_id": summaries[rev].release_id, "target": "staging"}}}
                }
                activation = defs.resolve_job_def("activate_release").execute_in_process(
                    run_config=config, instance=instance
                )
        yield ws, instance, spec, summaries, activation, defs
    instance.dispose()


def test_build_summary_carries_the_release_fields(chain):
    ws, _, _, summaries, _, _ = chain
    s1, s2 = summaries["scifact-1"], summaries["scifact-2"]
    assert (s1.eligible, s1.decisive_phase) == (True, None)
    for s in (s1, s2):
        assert s.release_id == read_stage_record(ws, s.revision, "release_manifest").data_version
        assert {"release_id", "eligible", "decisive_phase"} <= set(s.as_dict())


def test_evaluation_run_materializes_per_partition_with_its_run(chain):
    ws, instance, spec, summaries, _, _ = chain
    plan = chain_plan(spec)
    for rev, summary in summaries.items():
        m = latest(instance, "evaluation_run", rev)
        record = read_stage_record(ws, rev, "evaluation_run")
        facts = record.facts
        assert m.tags["dagster/code_version"] == plan.evaluation_code_version == record.spec_id
        assert m.tags["dagster/data_version"] == facts["spec_id"]
        assert record.data_version == attempt_version(str(facts["spec_id"]), str(facts["run_id"]))
        assert record.inputs == {"index_bundle": summary.bundle_id}
        md = m.metadata
        assert (md["run_id"].value, md["ledger_head"].value) == (facts["run_id"], facts["ledger_head"])
        # suite-stable: the 99 cases evaluable in both revisions, and 2 judging documents only
        # revision 3 adds (skipped here: their judged documents are missing), none failed
        assert (md["cases"].value, md["evaluated"].value, md["skipped"].value, md["failed"].value) == (101, 99, 2, 0)
        rows = {r.data["metric"]: r.data for r in md["metrics"].value.records}
        assert {"ndcg@10", "recall@100", "mrr@10", "unauthorized_disclosures"} <= set(rows)
        assert rows["ndcg@10"]["n"] == 99 and rows["unauthorized_disclosures"]["value"] == 0.0
        state = verify_run(ws.located(str(facts["run_path"])))
        assert (state.status, state.run_id) == ("completed", facts["run_id"])
        checks = instance.all_logs(summary.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        assert ("evaluation_ledger_verifies", True) in [
            (e.dagster_event.event_specific_data.asset_check_key.name, e.dagster_event.event_specific_data.passed)
            for e in checks
        ]


def test_gate_bootstraps_revision_1_and_pairs_revision_2_with_its_active_release(chain):
    ws, instance, spec, summaries, activation, _ = chain
    assert activation.success
    r1 = summaries["scifact-1"].release_id
    g1, g2 = read_stage_record(ws, "scifact-1", "gate_decision"), read_stage_record(ws, "scifact-2", "gate_decision")
    assert (g1.facts["mode"], g1.facts["incumbent_release"], g1.facts["comparison_id"]) == ("bootstrap", None, None)
    assert (g2.facts["mode"], g2.facts["incumbent_release"], g2.facts["incumbent_reevaluated"]) == ("paired", r1, None)
    # only the corpus differs (same stage specs, scope, plans and policy): a refresh
    assert (g1.facts["change"], g2.facts["change"], g2.facts["changed"]) == ("bootstrap", "refresh", None)
    assert (g2.facts["new_coverage_cases"], g2.facts["lost_coverage_cases"]) == (0, 0)
    assert g2.facts["incumbent_run"] == read_stage_record(ws, "scifact-1", "evaluation_run").facts["run_id"]
    assert g2.facts["comparison_id"] is not None
    for rev, g in (("scifact-1", g1), ("scifact-2", g2)):
        m = latest(instance, "gate_decision", rev)
        assert m.tags["dagster/data_version"] == g.data_version == g.facts["decision_id"]
        decision = json.loads(
            (ws.stage_dir(rev, "gate_decision") / g.data_version.split(":")[1] / "decision.json").read_text()
        )
        shown = [
            (key.removeprefix("checks "), r.data["verdict"])
            for key, entry in m.metadata.items()
            if key.startswith("checks ")
            for r in entry.value.records
        ]
        assert shown == [(c["phase"], c["verdict"]) for c in decision["checks"]]  # every check, in order
        assert m.metadata["decisive_phase"].value == (decision["decisive_phase"] or "none")
    deltas = {
        (r.data["slice"], r.data["metric"])
        for r in latest(instance, "gate_decision", "scifact-2").metadata["deltas"].value.records
    }
    assert ("all", "ndcg@10") in deltas
    # Revision 2 repairs 24 judged abstracts revision 1 holds cut after their first sentence
    # (data/scifact-sample/changes.json): paired with revision 1 on the stable suite, its nDCG@10
    # improves beyond noise: the refresh's non-inferiority bound (the interval's lower bound) is
    # above 0, not only above -margin, so every quality phase passes. The checked-in policy's one wall-clock
    # check (p95 latency against the incumbent's, measured earlier) is advisory: whatever its
    # verdict on this machine's load, revision 2 is eligible.
    decision = json.loads(
        (ws.stage_dir("scifact-2", "gate_decision") / g2.data_version.split(":")[1] / "decision.json").read_text()
    )
    target = {c["name"]: c for c in decision["checks"] if c["phase"] == "target"}
    assert list(target) == ["non_inferiority"] and target["non_inferiority"]["value"] > 0
    verdicts = {(c["phase"], c["name"], c["metric"]): c["verdict"] for c in decision["checks"]}
    latency = verdicts.pop(("cost", "p95_latency_relative", None))
    assert set(verdicts.values()) <= {"pass", "skipped"} and latency in ("pass", "advisory")
    assert (summaries["scifact-2"].eligible, summaries["scifact-2"].decisive_phase) == (True, None)


def test_release_manifest_binds_what_was_gated(chain):
    ws, instance, spec, summaries, _, _ = chain
    plan = chain_plan(spec)
    for rev, summary in summaries.items():
        manifest = load_manifest(ReleaseStore(ws), summary.release_id)
        ev, gate = read_stage_record(ws, rev, "evaluation_run"), read_stage_record(ws, rev, "gate_decision")
        assert manifest.revision == rev and manifest.bundle_id == summary.bundle_id
        assert (manifest.evaluation.spec_id, manifest.evaluation.run_id, manifest.evaluation.ledger_head) == (
            ev.facts["spec_id"],
            ev.facts["run_id"],
            ev.facts["ledger_head"],
        )
        assert (manifest.gate.decision_id, manifest.gate.eligible, manifest.comparison_id) == (
            gate.data_version,
            gate.facts["eligible"],
            gate.facts["comparison_id"],
        )
        assert (manifest.query_plan_id, manifest.gate_policy_id) == (plan.query_plan_id, plan.policy.policy_id)
        m = latest(instance, "release_manifest", rev)
        assert m.tags["dagster/data_version"] == summary.release_id
        assert m.tags["dagster/code_version"] == plan.release_code_version
    active, _ = resolve_active(ws, "staging")
    assert active.revision == "scifact-1"


def test_release_manifest_follows_the_gate_it_reads_not_a_later_evaluation(chain, tmp_path: Path):
    """A run of the same partition that evaluates again between this run's gate and its release
    (two runs racing) does not mix in: the manifest binds the evaluation run the gate decided on.
    Works on a copy of the workspace, so the module's state stays as built."""
    ws, _, spec, summaries, _, _ = chain
    copy = Workspace(tmp_path / "ragpipe")
    shutil.copytree(ws.home, copy.home)
    gated = read_stage_record(copy, "scifact-1", "evaluation_run")
    later = run_evaluation_run(copy, "scifact-1", spec)
    assert later.record.facts["run_id"] != gated.facts["run_id"]
    release = run_release_manifest(copy, "scifact-1", spec)
    assert (release.data_version, release.metadata["publication"]) == (summaries["scifact-1"].release_id, "existing")
    assert release.record.inputs["evaluation_run"] == gated.data_version
    assert load_manifest(ReleaseStore(copy), release.data_version).evaluation.run_id == gated.facts["run_id"]

    gate = read_stage_record(copy, "scifact-1", "gate_decision")
    decision_file = copy.stage_dir("scifact-1", "gate_decision") / gate.data_version.split(":")[1] / "decision.json"
    original = decision_file.read_bytes()
    decision_file.write_bytes(original.replace(b'"reasons": []', b'"reasons": ["forged"]', 1))
    with pytest.raises(
        StageError,
        match=rf"^gate_decision {gate.data_version} of revision 'scifact-1': decision.json hashes to sha256:",
    ):
        run_release_manifest(copy, "scifact-1", spec)
    decision_file.write_bytes(original)

    # A forgery with a recomputed digest: a decision about another run, published as a new gate
    # version whose ID is that decision's ID. The hash holds; the link to the evaluation does not.
    body = {k: v for k, v in json.loads(original).items() if k != "decision_id"}
    body["challenger"] = {**body["challenger"], "run_id": "forged-run"}
    forged_id = Decision.model_validate(body).decision_id
    forged = gate.model_copy(update={"data_version": forged_id})
    publish_output(
        copy, forged, lambda tmp: (tmp / "decision.json").write_text(json.dumps({**body, "decision_id": forged_id}))
    )
    with pytest.raises(StageError) as refused:
        run_release_manifest(copy, "scifact-1", spec)
    assert str(refused.value) == (
        f"gate_decision {forged_id} of revision 'scifact-1' decided on evaluation run forged-run, "
        f"not on {gated.facts['run_id']}: re-materialize gate_decision"
    )

    folder = copy.stage_dir("scifact-1", "evaluation_run") / gated.data_version.split(":")[1]
    shutil.rmtree(folder)
    with pytest.raises(StageError) as refused:
        run_release_manifest(copy, "scifact-1", spec)
    assert str(refused.value) == (
        f"evaluation_run {gated.data_version} of revision 'scifact-1', which gate_decision was built from, is not in "
        f"{folder.parent}: re-materialize gate_decision"
    )


def test_releases_keep_their_gate_decision_and_comparison(chain, tmp_path: Path):
    """release_manifest copies the decision (and, paired, the comparison) with the policy into the
    release store; activation reads that copy and makes the decision again from the runs, so it
    survives the stage folder and refuses an edited one. Works on a copy of the workspace."""
    ws, _, spec, summaries, _, _ = chain
    copy = Workspace(tmp_path / "ragpipe")
    shutil.copytree(ws.home, copy.home)
    store = ReleaseStore(copy)

    def problems(manifest) -> list[str]:
        arm = load_run(copy, manifest.evaluation.run_id)
        return gate_problems(store, manifest, arm, lambda run_id: load_run(copy, run_id))

    for rev in ("scifact-1", "scifact-2"):
        manifest = load_manifest(store, summaries[rev].release_id)
        gate = read_stage_record(copy, rev, "gate_decision")
        folder = copy.stage_dir(rev, "gate_decision") / gate.data_version.split(":")[1]
        kept = json.loads(evidence_path(store, manifest.gate.decision_id).read_bytes())
        assert kept["decision"] == json.loads((folder / "decision.json").read_bytes())
        assert kept["comparison"] == (
            json.loads((folder / "comparison.json").read_bytes()) if rev == "scifact-2" else None
        )
        assert kept["policy"] == policy_document(chain_plan(spec).policy)
        shutil.rmtree(folder)  # what gc may do once the release exists
        assert problems(manifest) == []

    manifest = load_manifest(store, summaries["scifact-2"].release_id)
    path = evidence_path(store, manifest.gate.decision_id)
    original = path.read_bytes()
    # An edited comparison statistic under an unchanged comparison ID.
    kept = json.loads(original)
    kept["comparison"]["slices"]["all"]["metrics"]["ndcg@10"]["stats"]["mean"] = 0.5
    path.write_bytes(canonical_bytes(kept) + b"\n")
    (problem,) = problems(manifest)
    assert problem.startswith(
        f"gate decision {manifest.gate.decision_id}: {path}: comparison_id {manifest.comparison_id} is not its content ID sha256:"
    )
    path.write_bytes(original)
    assert problems(manifest) == []

    # Activation reads the kept file too (revision 1's release: its bootstrap eligibility does not
    # depend on a latency measurement, unlike revision 2's paired one).
    r1 = load_manifest(store, summaries["scifact-1"].release_id)
    kept1 = evidence_path(store, r1.gate.decision_id)
    kept1_bytes = kept1.read_bytes()
    kept1.unlink()
    with pytest.raises(ReleaseError) as refused:
        activate(copy, r1.release_id, "staging")
    assert str(refused.value) == (
        f"release {r1.release_id} failed verification; not activated:\n"
        f"  gate decision {r1.gate.decision_id}: {kept1} is missing"
    )
    kept1.write_bytes(kept1_bytes)
    assert activate(copy, r1.release_id, "staging").changed is False  # verifies again; already active


KILL_RELEASE = """
import os, signal, sys
from pathlib import Path
from ragpipe.spec import load_pipeline_spec
from ragpipe.release import kept_decision, manifest
from ragpipe.stages import release_steps
from ragpipe.kernel.workspace import Workspace

home, at = sys.argv[1], sys.argv[2]
def kill(step):
    if step == at:
        os.kill(os.getpid(), signal.SIGKILL)
def hooked(real, prefix):
    return lambda path, data, **kw: real(path, data, **kw, on_step=lambda s: kill(prefix + s))
kept_decision.write_file_atomic = hooked(kept_decision.write_file_atomic, "evidence:")
manifest.write_file_atomic = hooked(manifest.write_file_atomic, "manifest:")
release_steps.run_release_manifest(Workspace(Path(home)), "scifact-2", load_pipeline_spec())
raise SystemExit("never killed at " + at)
"""
KILL_STEPS = [f"{what}:{step}" for what in ("evidence", "manifest") for step in FILE_STEPS]


@pytest.mark.parametrize("at", KILL_STEPS)
def test_release_manifest_killed_at_each_step_publishes_nothing_partial(chain, tmp_path: Path, at: str):
    """SIGKILL at each step of the two publications (the kept decision, then the manifest): no
    manifest ever exists without its kept decision, readers see the old state or the new one, and
    a rerun publishes exactly the release an uninterrupted run published. On a copy."""
    ws, _, _, summaries, _, _ = chain
    copy = Workspace(tmp_path / "ragpipe")
    shutil.copytree(ws.home, copy.home)
    store = ReleaseStore(copy)
    release = summaries["scifact-2"].release_id
    decision = load_manifest(store, release).gate.decision_id
    store.manifest_path(release).unlink()
    evidence_path(store, decision).unlink()
    proc = subprocess.run(
        [sys.executable, "-c", KILL_RELEASE, str(copy.home), at],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "RAGPIPE_HOME": str(copy.home)},
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    manifest_there = store.manifest_path(release).exists()
    assert manifest_there == (at in ("manifest:file_renamed", "manifest:file_parent_fsynced"))
    assert evidence_path(store, decision).exists() == (manifest_there or at != "evidence:file_temp_written")
    if manifest_there:  # published whole: it verifies, and so does its kept decision
        manifest = load_manifest(store, release)
        assert gate_problems(store, manifest, None, lambda run_id: load_run(copy, run_id)) == []
    again = run_release_manifest(copy, "scifact-2", load_pipeline_spec())
    assert again.data_version == release
    assert problems_of(copy, load_manifest(store, release)) == []


def problems_of(ws: Workspace, manifest) -> list[str]:
    return gate_problems(
        ReleaseStore(ws), manifest, load_run(ws, manifest.evaluation.run_id), lambda run_id: load_run(ws, run_id)
    )


def test_an_incumbent_run_without_build_figures_is_measured_again(
    chain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """An active release whose evaluation run predates the build figures (simulated: its arm loads
    without them) cannot answer the policy's relative build bounds; gate_decision re-evaluates the
    incumbent's bundle instead of failing revision 2 on a missing figure. Works on a copy."""
    ws, _, spec, summaries, _, _ = chain
    copy = Workspace(tmp_path / "ragpipe")
    shutil.copytree(ws.home, copy.home)
    old_run = load_manifest(ReleaseStore(copy), summaries["scifact-1"].release_id).evaluation.run_id
    real = bound_run.load_arm

    def load_arm(path: Path):
        arm = real(path)
        return arm.model_copy(update={"build": None}) if arm.run_id == old_run else arm

    # the incumbent arm is the reading of the release's own verification (release.bound_run)
    monkeypatch.setattr(bound_run, "load_arm", load_arm)
    gate = run_gate_decision(copy, "scifact-2", spec)
    facts = gate.record.facts
    assert facts["incumbent_run"] != old_run and facts["incumbent_reevaluated"] == facts["incumbent_run"]
    assert facts["incumbent_release"] == summaries["scifact-1"].release_id
    decision = json.loads(
        (copy.stage_dir("scifact-2", "gate_decision") / gate.data_version.split(":")[1] / "decision.json").read_text()
    )
    build = {c["name"]: c["verdict"] for c in decision["checks"] if c["name"].startswith(("build_", "bundle_"))}
    assert build == {"build_vectors_relative": "pass", "bundle_bytes_relative": "pass"}


def test_a_missing_or_tampered_incumbent_run_stops_the_gate(chain, tmp_path: Path):
    """The incumbent arm is the active release's run as its verification read it: with the run
    folder gone, or one trace changed, gate_decision fails closed naming the release and the run
    (each on a copy of the workspace)."""
    ws, _, spec, summaries, _, _ = chain
    release = summaries["scifact-1"].release_id
    target, _ = load_targets().get(None)
    for damage in ("missing", "tampered"):
        copy = Workspace(tmp_path / damage / "ragpipe")
        shutil.copytree(ws.home, copy.home)
        run_id = load_manifest(ReleaseStore(copy), release).evaluation.run_id
        run = copy.home / "evaluations" / run_id
        if damage == "missing":
            shutil.rmtree(run)
        else:
            trace = sorted((run / "traces").iterdir())[0]
            trace.write_bytes(trace.read_bytes() + b"\0")
        with pytest.raises(ReleaseError) as refused:
            run_gate_decision(copy, "scifact-2", spec)
        head = f"target {target!r}: release {release} failed verification: evaluation run {run_id}: "
        assert str(refused.value).startswith(head) and "\n" not in str(refused.value)
        if damage == "missing":
            assert str(refused.value) == f"{head}{run} is missing"
        else:
            assert str(refused.value).endswith(f"{trace} does not match the digest in the ledger")


def test_a_run_put_in_place_of_the_recorded_one_stops_the_gate(chain, tmp_path: Path):
    """The challenger's run is read by ID (fetched from the store on another machine): a complete,
    verifying run in its folder that is not the one the evaluation step recorded is refused."""
    ws, _, spec, _, _, _ = chain
    copy = Workspace(tmp_path / "ragpipe")
    shutil.copytree(ws.home, copy.home)
    recorded = read_stage_record(copy, "scifact-2", "evaluation_run").facts["run_id"]
    latest = copy.stage_dir("scifact-2", "evaluation_run") / "latest.json"
    kept = latest.read_bytes()
    other = run_evaluation_run(copy, "scifact-2", spec).record.facts["run_id"]
    latest.write_bytes(kept)  # the recorded run is the latest again, its folder now holds the other
    shutil.rmtree(copy.home / "evaluations" / recorded)
    shutil.copytree(copy.home / "evaluations" / other, copy.home / "evaluations" / recorded)
    with pytest.raises(StageError) as refused:
        run_gate_decision(copy, "scifact-2", spec)
    assert str(refused.value) == f"evaluation run {recorded}: run ID {other} is not the recorded {recorded}"
    where, problems = check_evaluation_run(copy, "scifact-2")  # the blocking check says so too
    head = read_ledger(copy.home / "evaluations" / recorded).records[-1].hash
    recorded_head = read_stage_record(copy, "scifact-2", "evaluation_run").facts["ledger_head"]
    assert problems == [
        f"{where}: run ID {other} is not the recorded {recorded}",
        f"{where}: ledger head {head} is not the recorded {recorded_head}",
    ]


def test_a_rebuild_of_an_up_to_date_revision_runs_nothing(chain):
    ws, instance, spec, summaries, _, _ = chain
    again = materialize_revision("scifact-2", ws, instance=instance, spec=spec)
    assert (again.up_to_date, again.run_id, again.release_id) == (True, None, summaries["scifact-2"].release_id)


def test_query_serves_the_active_release_with_its_gated_plan(chain, cli):
    """`ragpipe query` without a bundle serves the default target's active release (revision 1's,
    activated above) with the plan it was gated with, and says which release answered."""
    ws, _, _, summaries, _, _ = chain
    s1 = summaries["scifact-1"]
    manifest = load_manifest(ReleaseStore(ws), s1.release_id)

    def ragpipe(*args: str) -> subprocess.CompletedProcess:
        return cli(*args, home=ws.home, unset=("RAGPIPE_TARGETS",))

    done = ragpipe("query", "aspirin and cardiovascular events", "--k", "3", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["release_id"], data["bundle_id"], data["plan_id"]) == (
        s1.release_id,
        s1.bundle_id,
        manifest.query_plan_id,
    )
    assert [h["rank"] for h in data["hits"]] == [1, 2, 3]

    retriever = retriever_for_release(home=ws.home)
    assert (retriever.release_id, retriever.bundle_id, retriever.plan.plan_id) == (
        s1.release_id,
        s1.bundle_id,
        manifest.query_plan_id,
    )
    retriever.close()

    refusals = {
        (
            "--target",
            "production",
        ): "target 'production' has no active release: query a built revision with ragpipe query --revision KEY \"...\", or activate an eligible release (ragpipe release list) with ragpipe release activate RELEASE_ID --target production",
        (
            "--plan",
            "ragpipe/specs/query_plan.yaml",
        ): "--plan applies to --bundle or --revision; a release serves the plan it was gated with",
        (
            "--release",
            s1.release_id,
            "--revision",
            "scifact-1",
        ): "give a bundle (--bundle or --revision) or a release (--release or --target), not both",
    }
    for args, message in refusals.items():
        done = ragpipe("query", "aspirin", *args)
        assert (done.returncode, done.stdout, done.stderr) == (1, "", f"error: {message}\n")


def test_the_blocking_check_fails_for_a_tampered_ledger(chain, monkeypatch: pytest.MonkeyPatch):
    """A ledger altered after the run (one byte of record 2) fails the blocking check in the same run,
    so gate_decision and release_manifest are not materialized."""
    ws, instance, _, _, _, defs = chain
    from ragpipe.stages import eval_steps

    real = eval_steps.run_evaluation

    def run_then_tamper(spec, out, **kw):
        result = real(spec, out, **kw)
        ledger = out / "ledger.jsonl"
        data = ledger.read_bytes()
        ledger.write_bytes(data.replace(b'"name":"suite"', b'"name":"suitf"', 1))
        return result

    monkeypatch.setattr(eval_steps, "run_evaluation", run_then_tamper)
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(
        partition_key="scifact-2", instance=instance, raise_on_error=False, asset_selection=[AssetKey(a) for a in CHAIN]
    )
    run = ws.located(str(read_stage_record(ws, "scifact-2", "evaluation_run").facts["run_path"]))
    (evaluation,) = result.get_asset_check_evaluations()
    assert (evaluation.check_name, evaluation.passed) == ("evaluation_ledger_verifies", False)
    assert (
        evaluation.description
        == f"evaluation run {run}: {run / 'ledger.jsonl'}: record 2: hash does not match the record's content"
    )
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events() if e.asset_key}
    assert materialized == {"evaluation_run"}
