"""The gate's build-cost bounds (phase ``cost``): the figures an evaluation run records
about its bundle, the policy's bounds on them, and the checks of the decision.

Synthetic arms (``gate_support``) for the decision's logic; real runs on the sample bundle for
what a run records; and a real build-side candidate (representations ``[raw]`` ->
``[raw, title_breadcrumb]``) for a doubled vector count reaching the comparison."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import rfc8785

from ragpipe.bundle.manifest import BundleManifest
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import HEAD, LEDGER, Ledger, read_ledger
from ragpipe.evaluation.run_folder import RunError, verify_run
from ragpipe.evaluation.runner import run_evaluation
from ragpipe.evaluation.suite import Suite, check_against_bundle
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.experiment.arm_source import ArmSourceError, load_arm
from ragpipe.experiment.arms import ArmRun, BuildCost
from ragpipe.experiment.comparison import compare, load_comparison, write_comparison
from ragpipe.experiment.decision import decide
from ragpipe.experiment.gate_policy import DEFAULT_POLICY_PATH, PolicyError, load_policy, parse_policy
from ragpipe.experiment.pairing import pair
from ragpipe.index.vector import vector_row_count
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.experiment.test_gate_policy import BASE, GOLDEN_ID
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401
from ragpipe_tests.support.gate_support import arm, policy_doc
from ragpipe_tests.support.paths import SAMPLE

# ---------------------------------------------------------------------------------------------
# Synthetic arms: the decision
# ---------------------------------------------------------------------------------------------

CASES = {f"c{i:02d}": 0.3 + i / 100 for i in range(20)}
BETTER = {c: v + 0.1 for c, v in CASES.items()}  # every quality phase passes by a wide margin
LATENCY = {"max_p95_latency_ratio": 1.5, "latency_slack_ms": 5.0, "max_p95_latency_ms": None}


def cost(**bounds: float | None) -> dict:
    return {**LATENCY, **bounds}


def with_build(run: ArmRun, vectors: int | None, payload_bytes: int = 1_000_000) -> ArmRun:
    build = (
        None
        if vectors is None
        else BuildCost(material_digest="sha256:" + "d" * 64, vectors=vectors, payload_bytes=payload_bytes)
    )
    return run.model_copy(update={"build": build})


def paired(inc: tuple[int | None, int], ch: tuple[int | None, int], doc: dict, **challenger):
    incumbent = with_build(arm("run-1", CASES), *inc)
    chal = with_build(arm("run-2", BETTER, **challenger), *ch)
    return decide(parse_policy(doc, "p.yaml"), compare(pair(incumbent, chal)))


def cost_checks(decision) -> list[tuple]:
    return [(c.name, c.value, c.op, c.threshold, c.verdict, c.reason) for c in decision.checks if c.phase == "cost"]


def test_build_vectors_alone_failing_makes_cost_decisive():
    d = paired(
        (1000, 10_000), (2500, 10_000), policy_doc(cost=cost(max_build_vectors_ratio=2.0, max_bundle_bytes_ratio=2.0))
    )
    assert (d.eligible, d.decisive_phase, d.reasons) == (
        False,
        "cost",
        ("cost build_vectors_relative: 2500 is not <= 2000",),
    )
    assert {c.phase for c in d.checks if c.verdict == "fail"} == {"cost"}
    assert cost_checks(d) == [
        ("p95_latency_relative", 10.0, "<=", 15.0, "pass", None),
        ("build_vectors_relative", 2500.0, "<=", 2000.0, "fail", "cost build_vectors_relative: 2500 is not <= 2000"),
        ("bundle_bytes_relative", 10_000.0, "<=", 20_000.0, "pass", None),
    ]


def test_bundle_bytes_alone_failing_makes_cost_decisive():
    d = paired(
        (1000, 10_000), (1000, 30_001), policy_doc(cost=cost(max_build_vectors_ratio=2.0, max_bundle_bytes_ratio=3.0))
    )
    assert (d.eligible, d.decisive_phase, d.reasons) == (
        False,
        "cost",
        ("cost bundle_bytes_relative: 30001 is not <= 30000",),
    )
    assert [c[:5] for c in cost_checks(d)][1:] == [
        ("build_vectors_relative", 1000.0, "<=", 2000.0, "pass"),
        ("bundle_bytes_relative", 30_001.0, "<=", 30_000.0, "fail"),
    ]


def test_exactly_the_allowed_ratio_passes_and_every_cost_check_is_in_order():
    bounds = cost(
        max_p95_latency_ms=50.0,
        max_build_vectors_ratio=2.0,
        max_build_vectors=2000,
        max_bundle_bytes_ratio=1.0,
        max_bundle_bytes=10_000,
    )
    d = paired((1000, 10_000), (2000, 10_000), policy_doc(cost=bounds))
    assert (d.eligible, d.decisive_phase) == (True, None)
    assert cost_checks(d) == [
        ("p95_latency_relative", 10.0, "<=", 15.0, "pass", None),
        ("p95_latency_absolute", 10.0, "<=", 50.0, "pass", None),
        ("build_vectors_relative", 2000.0, "<=", 2000.0, "pass", None),
        ("build_vectors_absolute", 2000.0, "<=", 2000.0, "pass", None),
        ("bundle_bytes_relative", 10_000.0, "<=", 10_000.0, "pass", None),
        ("bundle_bytes_absolute", 10_000.0, "<=", 10_000.0, "pass", None),
    ]
    assert d.checks[-1].phase == "cost"  # cost is the last phase: the build checks close the decision


def test_an_earlier_phase_stays_decisive_over_build_cost():
    d = paired(
        (1000, 10_000),
        (5000, 90_000),
        policy_doc(cost=cost(max_build_vectors_ratio=2.0, max_bundle_bytes_ratio=2.0)),
        disclosures={"c03": 1},
    )
    assert (d.eligible, d.decisive_phase) == (False, "hard")
    assert [c.name for c in d.checks if c.verdict == "fail"] == [
        "max",
        "build_vectors_relative",
        "bundle_bytes_relative",
    ]


def test_absolute_ceilings_decide_a_bootstrap_without_an_incumbent():
    doc = policy_doc(
        cost=cost(
            max_build_vectors_ratio=2.0, max_build_vectors=1000, max_bundle_bytes_ratio=2.0, max_bundle_bytes=5_000_000
        )
    )
    run = with_build(arm("run-2", BETTER), 1500, 4_000_000)
    d = decide(parse_policy(doc, "p.yaml"), None, run)
    assert (d.mode, d.eligible, d.decisive_phase, d.reasons) == (
        "bootstrap",
        False,
        "cost",
        ("cost build_vectors_absolute: 1500 is not <= 1000",),
    )
    # no incumbent: the ratios have nothing to compare with, only the ceilings are checked
    assert [c[:5] for c in cost_checks(d)] == [
        ("build_vectors_absolute", 1500.0, "<=", 1000.0, "fail"),
        ("bundle_bytes_absolute", 4_000_000.0, "<=", 5_000_000.0, "pass"),
    ]
    assert decide(parse_policy(doc, "p.yaml"), None, with_build(run, 1000, 5_000_000)).eligible is True


def test_runs_without_build_figures_fail_the_check_closed():
    doc = policy_doc(cost=cost(max_build_vectors_ratio=2.0, max_bundle_bytes_ratio=2.0))
    d = paired((None, 0), (1000, 10_000), doc)
    assert (d.eligible, d.decisive_phase) == (False, "cost")
    assert cost_checks(d)[1:] == [
        (
            "build_vectors_relative",
            None,
            "<=",
            0.0,
            "fail",
            "cost build_vectors_relative: the incumbent run records no build figures",
        ),
        (
            "bundle_bytes_relative",
            None,
            "<=",
            0.0,
            "fail",
            "cost bundle_bytes_relative: the incumbent run records no build figures",
        ),
    ]
    d = paired((1000, 10_000), (None, 0), doc)
    assert cost_checks(d)[1:] == [
        (
            "build_vectors_relative",
            None,
            "<=",
            2000.0,
            "fail",
            "cost build_vectors_relative: the challenger run records no build figures",
        ),
        (
            "bundle_bytes_relative",
            None,
            "<=",
            20_000.0,
            "fail",
            "cost bundle_bytes_relative: the challenger run records no build figures",
        ),
    ]
    # unlike a run without a latency sample, which is only advisory (latency never decides)
    no_latency = paired((1000, 10_000), (1000, 10_000), doc, failed={(c, 0): "TimeoutError" for c in BETTER})
    assert [(c.verdict, c.reason) for c in no_latency.checks if c.name == "p95_latency_relative"] == [
        (
            "advisory",
            "cost p95_latency_relative: no latency sample (advisory: the arms' latencies were measured at "
            "different times, so they decide nothing)",
        )
    ]
    ceiling = decide(parse_policy(policy_doc(cost=cost(max_bundle_bytes=1e9)), "p.yaml"), None, arm("run-2", BETTER))
    assert cost_checks(ceiling) == [
        (
            "bundle_bytes_absolute",
            None,
            "<=",
            1e9,
            "fail",
            "cost bundle_bytes_absolute: the challenger run records no build figures",
        )
    ]


def test_a_policy_without_build_bounds_ignores_the_figures_and_old_runs_pass():
    d = paired((None, 0), (None, 0), policy_doc())
    assert (d.eligible, [c[0] for c in cost_checks(d)]) == (True, ["p95_latency_relative"])
    d = paired((10, 10), (1_000_000, 10**9), policy_doc())
    assert (d.eligible, [c[0] for c in cost_checks(d)]) == (True, ["p95_latency_relative"])


def test_the_comparison_carries_both_arms_figures_and_omits_absent_ones(tmp_path: Path):
    inc = with_build(arm("run-1", CASES), 1000, 10_000)
    ch = with_build(arm("run-2", BETTER), 2000, 15_000)
    comparison = compare(pair(inc, ch))
    assert (comparison.incumbent.build, comparison.challenger.build) == (inc.build, ch.build)
    write_comparison(comparison, tmp_path / "cmp.json")
    stored = json.loads((tmp_path / "cmp.json").read_text())
    assert stored["challenger"]["build"] == {
        "material_digest": "sha256:" + "d" * 64,
        "vectors": 2000,
        "payload_bytes": 15_000,
    }
    assert load_comparison(tmp_path / "cmp.json") == comparison
    # runs without figures: no key at all, so a comparison written before the figures existed
    # keeps its content and its ID
    old = compare(pair(arm("run-1", CASES), arm("run-2", BETTER)))
    body = old.as_json()
    assert "build" not in body["incumbent"] and "build" not in body["challenger"]
    write_comparison(old, tmp_path / "old.json")
    assert load_comparison(tmp_path / "old.json").comparison_id == old.comparison_id


# ---------------------------------------------------------------------------------------------
# The policy: bounds, validation, identity
# ---------------------------------------------------------------------------------------------

LATENCY_LINES = "  max_p95_latency_ratio: 1.5\n  latency_slack_ms: 5.0\n  max_p95_latency_ms: null\n"
BUILD_LINES = "  max_build_vectors_ratio: 2.0\n  max_build_vectors: null\n  max_bundle_bytes_ratio: 2.0\n  max_bundle_bytes: 5000000000\n"
WITH_BUILD = BASE.replace(LATENCY_LINES, LATENCY_LINES + BUILD_LINES)  # the build keys on lines 21-24


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_build_bounds_load_and_enter_the_policy_id(tmp_path: Path):
    assert WITH_BUILD != BASE
    policy = load_policy(write(tmp_path, WITH_BUILD))
    c = policy.cost
    assert (c.max_build_vectors_ratio, c.max_build_vectors, c.max_bundle_bytes_ratio, c.max_bundle_bytes) == (
        2.0,
        None,
        2.0,
        5e9,
    )
    canonical = {
        "schema": "ragpipe.gate_policy/v1",
        "human_apply_required": True,
        "hard": {
            "unauthorized_disclosures": {"min": None, "max": 0.0, "if_measured": False},
            "answer_contract_valid_rate": {"min": 0.99, "max": None, "if_measured": True},
        },
        "coverage": {"max_failed_rate": 0.0, "min_cases": 10},
        "target": {"metric": "ndcg@10", "min_improvement": 0.01, "evidence": "ci_lower", "alpha": 0.05},
        "regression": {"overall": {"recall@100": 0.02}, "tags": {}},
        "cost": {
            "max_p95_latency_ratio": 1.5,
            "latency_slack_ms": 5.0,
            "max_p95_latency_ms": None,
            "max_build_vectors_ratio": 2.0,
            "max_bundle_bytes_ratio": 2.0,
            "max_bundle_bytes": 5e9,
        },
        "bootstrap_floors": {"ndcg@10": 0.3, "recall@100": 0.3},
    }
    expected = "sha256:" + hashlib.sha256(b"ragpipe/gate-policy/v1\0" + rfc8785.dumps(canonical)).hexdigest()
    assert policy.policy_id == expected == "sha256:fd95269f2c2ae9daa5f2f060f673464ee57158a77c6fb7d90735b89e882c8c11"
    assert (
        load_policy(write(tmp_path, WITH_BUILD.replace("5000000000", "5.0e+9"))).policy_id == expected
    )  # number spelling
    assert (
        load_policy(
            write(tmp_path, WITH_BUILD.replace("max_bundle_bytes_ratio: 2.0", "max_bundle_bytes_ratio: 2.5"))
        ).policy_id
        != expected
    )


def test_unset_build_bounds_leave_the_policy_id_as_it_was(tmp_path: Path):
    nulls = BASE.replace(
        LATENCY_LINES,
        LATENCY_LINES + "  max_build_vectors_ratio: null\n  max_build_vectors: null\n"
        "  max_bundle_bytes_ratio: null\n  max_bundle_bytes: null\n",
    )
    assert nulls != BASE
    assert load_policy(write(tmp_path, nulls)).policy_id == load_policy(write(tmp_path, BASE)).policy_id == GOLDEN_ID


def test_the_default_policy_bounds_build_cost():
    c = load_policy().cost
    assert (c.max_build_vectors_ratio, c.max_build_vectors, c.max_bundle_bytes_ratio, c.max_bundle_bytes) == (
        2.0,
        None,
        2.0,
        None,
    )
    assert (
        load_policy(DEFAULT_POLICY_PATH).policy_id
        == "sha256:388b55a0d3a70d7bd566eaa98786acf2e3cf4166ed5cbb30a8bf5a843a5d9265"
    )


MALFORMED = [
    (
        "NaN ratio",
        ("max_build_vectors_ratio: 2.0", "max_build_vectors_ratio: .nan"),
        "21: cost.max_build_vectors_ratio: threshold must be finite, got nan",
    ),
    (
        "infinite ceiling",
        ("max_build_vectors: null", "max_build_vectors: .inf"),
        "22: cost.max_build_vectors: threshold must be finite, got inf",
    ),
    (
        "zero ratio",
        ("max_build_vectors_ratio: 2.0", "max_build_vectors_ratio: 0"),
        "21: cost.max_build_vectors_ratio: must be > 0, got 0",
    ),
    (
        "negative ratio",
        ("max_bundle_bytes_ratio: 2.0", "max_bundle_bytes_ratio: -1.5"),
        "23: cost.max_bundle_bytes_ratio: must be > 0, got -1.5",
    ),
    (
        "ratio below 1",
        ("max_bundle_bytes_ratio: 2.0", "max_bundle_bytes_ratio: 0.5"),
        "23: cost.max_bundle_bytes_ratio: contradictory bound: a ratio of 0.5 is below 1, so a challenger on the incumbent's own bundle could never pass",
    ),
    (
        "zero ceiling",
        ("max_bundle_bytes: 5000000000", "max_bundle_bytes: 0"),
        "24: cost.max_bundle_bytes: must be > 0, got 0",
    ),
    (
        "negative ceiling",
        ("max_build_vectors: null", "max_build_vectors: -10"),
        "22: cost.max_build_vectors: must be > 0, got -10",
    ),
    (
        "fractional ceiling",
        ("max_build_vectors: null", "max_build_vectors: 1000.5"),
        "22: cost.max_build_vectors: must be a whole number (a count), got 1000.5",
    ),
    (
        "boolean ratio",
        ("max_build_vectors_ratio: 2.0", "max_build_vectors_ratio: yes"),
        "21: cost.max_build_vectors_ratio: must be a number, got True",
    ),
    (
        "string ceiling",
        ("max_bundle_bytes: 5000000000", "max_bundle_bytes: 5GB"),
        "24: cost.max_bundle_bytes: must be a number, got '5GB'",
    ),
    (
        "unknown build key",
        ("max_build_vectors: null", "max_vectors: 10"),
        "22: cost.max_vectors: unknown key (allowed: max_p95_latency_ratio, latency_slack_ms, max_p95_latency_ms, "
        "max_build_vectors_ratio, max_build_vectors, max_bundle_bytes_ratio, max_bundle_bytes, "
        "max_answer_tokens_per_case, max_answer_micros_per_case)",
    ),
    (
        "duplicate build key",
        ("  max_bundle_bytes: 5000000000\n", "  max_bundle_bytes: 5000000000\n  max_bundle_bytes: 1\n"),
        "25: cost.max_bundle_bytes: duplicate key (first at line 24)",
    ),
]


@pytest.mark.parametrize(("change", "message"), [(c, m) for _, c, m in MALFORMED], ids=[n for n, _, _ in MALFORMED])
def test_malformed_build_bounds_are_refused_with_file_line_and_rule(
    tmp_path: Path, change: tuple[str, str], message: str
):
    old, new = change
    assert WITH_BUILD.count(old) == 1, old
    path = write(tmp_path, WITH_BUILD.replace(old, new))
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert str(info.value) == f"{path}:{message}"


# ---------------------------------------------------------------------------------------------
# Real runs: what a run records, old runs, a tampered binding
# ---------------------------------------------------------------------------------------------


def bundle_figures(bundle: Path) -> tuple[int, int]:
    """(vectors, payload bytes) measured on the bundle itself: the lance table's rows, and the
    size of every file but the manifest."""
    sizes = [
        os.path.getsize(Path(d) / f)
        for d, _, files in os.walk(bundle)
        for f in files
        if (Path(d) / f) != bundle / "manifest.json"
    ]
    return vector_row_count(bundle / "vector"), sum(sizes)


@pytest.fixture(scope="module")
def real_runs(eval_bundle, tmp_path_factory):  # noqa: F811
    """Two completed runs (arms a and b) of the sample bundle on 8 evaluable cases."""
    bundle, suite_path = eval_bundle
    full = load_suite(suite_path)
    retriever = Retriever(bundle, plan=load_plan())
    status = {
        s.case_id: s.evaluable for s in check_against_bundle(full, retriever.scopes.keys(), retriever.chunks.keys())
    }
    suite = Suite.of([c for c in full.cases if status[c.id] and c.id != "x-forbidden"][:8], "build-cost")
    root = tmp_path_factory.mktemp("build-cost-runs")
    runs = {}
    for label in ("a", "b"):
        spec = EvaluationSpec.build(suite, retriever.plan, bundle, retriever.bundle_id, k=20, arm=label)
        run_evaluation(spec, root / label, retriever_factory=lambda _: retriever)
        runs[label] = root / label
    retriever.close()
    return bundle, runs


def test_a_real_run_records_the_bundles_figures_outside_its_spec(real_runs):
    bundle, runs = real_runs
    manifest = BundleManifest.model_validate_json((bundle / "manifest.json").read_bytes())
    vectors, payload = bundle_figures(bundle)
    assert vectors == manifest.semantic.counts.representations > 0 and payload > 0
    records = read_ledger(runs["a"]).records
    assert [r.kind for r in records[:6]] == [
        "RunCreated",
        "InputBound",
        "InputBound",
        "InputBound",
        "InputBound",
        "CellStarted",
    ]
    assert records[4].payload == {
        "name": "bundle",
        "digest": manifest.material_digest,
        "content_id": manifest.bundle_id,
        "vectors": vectors,
        "payload_bytes": payload,
    }
    arm_a = load_arm(runs["a"])
    assert arm_a.build == BuildCost(material_digest=manifest.material_digest, vectors=vectors, payload_bytes=payload)
    # execution-independent facts about the bundle, never part of the spec (the bundle ID binds them)
    spec = json.loads((runs["a"] / "inputs" / "spec.json").read_bytes())
    assert spec == records[0].payload["spec"] and not {"vectors", "payload_bytes", "material_digest"} & set(spec)
    assert spec["bundle_id"] == manifest.bundle_id
    comparison = compare(pair(arm_a, load_arm(runs["b"])))
    assert comparison.incumbent.build == comparison.challenger.build == arm_a.build
    d = decide(load_policy(), comparison)
    assert [c[:5] for c in cost_checks(d)][1:] == [
        ("build_vectors_relative", float(vectors), "<=", 2.0 * vectors, "pass"),
        ("bundle_bytes_relative", float(payload), "<=", 2.0 * payload, "pass"),
    ]


def rechained(run: Path, dst: Path, change: Callable[[str, dict], dict | None]) -> Path:
    """A copy of ``run`` whose ledger is written anew, record by record, through ``change`` (None
    drops the record): a consistent chain, as a run made that way would have."""
    shutil.copytree(run, dst)
    (dst / LEDGER).unlink()
    (dst / HEAD).unlink()
    with Ledger.create(dst) as ledger:
        for record in read_ledger(run).records:
            payload = change(record.kind, dict(record.payload))
            if payload is not None:
                ledger.append(record.kind, payload)
    return dst


def is_bundle(kind: str, payload: dict) -> bool:
    return kind == "InputBound" and payload["name"] == "bundle"


def test_a_run_made_before_the_figures_loads_and_its_checks_report_them_missing(real_runs, tmp_path: Path):
    _, runs = real_runs
    old = rechained(runs["a"], tmp_path / "old", lambda kind, p: None if is_bundle(kind, p) else p)
    assert [r.payload["name"] for r in read_ledger(old).records if r.kind == "InputBound"] == [
        "suite",
        "query_plan",
        "spec",
    ]
    assert verify_run(old).status == "completed"
    old_arm = load_arm(old)
    assert old_arm.build is None and old_arm.cells == load_arm(runs["a"]).cells
    comparison = compare(pair(old_arm, load_arm(runs["b"])))
    assert "build" not in comparison.as_json()["incumbent"] and comparison.challenger.build is not None
    d = decide(load_policy(), comparison)
    assert cost_checks(d)[1:] == [
        (
            "build_vectors_relative",
            None,
            "<=",
            0.0,
            "fail",
            "cost build_vectors_relative: the incumbent run records no build figures",
        ),
        (
            "bundle_bytes_relative",
            None,
            "<=",
            0.0,
            "fail",
            "cost bundle_bytes_relative: the incumbent run records no build figures",
        ),
    ]


def test_a_binding_that_contradicts_the_spec_is_refused(real_runs, tmp_path: Path):
    _, runs = real_runs
    ledger = str(tmp_path / "other" / LEDGER)
    spec_bundle = load_arm(runs["a"]).variant.bundle_id
    other = rechained(
        runs["a"],
        tmp_path / "other",
        lambda kind, p: {**p, "content_id": "sha256:" + "9" * 64} if is_bundle(kind, p) else p,
    )
    message = (
        f"{ledger}: record 5: InputBound 'bundle' names bundle sha256:{'9' * 64}, not the spec's bundle {spec_bundle}"
    )
    with pytest.raises(RunError) as info:
        verify_run(other)
    assert str(info.value) == message
    with pytest.raises(ArmSourceError) as info:
        load_arm(other)
    assert str(info.value) == message
    negative = rechained(
        runs["a"], tmp_path / "negative", lambda kind, p: {**p, "vectors": -1} if is_bundle(kind, p) else p
    )
    with pytest.raises(RunError) as info:
        verify_run(negative)
    assert (
        str(info.value)
        == f"{tmp_path / 'negative' / LEDGER}: record 5: InputBound 'bundle': vectors must be an integer >= 0, got -1"
    )
    text = rechained(
        runs["a"], tmp_path / "text", lambda kind, p: {**p, "payload_bytes": "12"} if is_bundle(kind, p) else p
    )
    with pytest.raises(RunError) as info:
        verify_run(text)
    assert (
        str(info.value)
        == f"{tmp_path / 'text' / LEDGER}: record 5: InputBound 'bundle': payload_bytes must be an integer >= 0, got '12'"
    )


# ---------------------------------------------------------------------------------------------
# A build-side candidate that doubles the representations
# ---------------------------------------------------------------------------------------------

STAGES = (
    "run_source_snapshot",
    "run_chunks",
    "run_representations",
    "run_embeddings",
    "run_lexical_index",
    "run_vector_index",
    "run_index_bundle",
)


def raw_only_pipeline(path: Path) -> Path:
    """The checked-in pipeline spec with representations ``[raw]`` and no evaluation section."""
    text = (Path(DEFAULT_POLICY_PATH).parent / "pipeline.yaml").read_text(encoding="utf-8")
    text = text.split("\n# The evaluation ")[0] + "\n"
    assert text.count("kinds: [raw, title_breadcrumb]") == 1
    path.write_text(text.replace("kinds: [raw, title_breadcrumb]", "kinds: [raw]"), encoding="utf-8")
    return path


def build_here(ws):
    """A candidate ``Build`` running every stage in this process (the stage functions the Dagster
    assets call; ``test_candidate_run`` covers the build through Dagster)."""
    from ragpipe.candidates.run import BuiltBundle
    from ragpipe.spec import load_pipeline_spec
    from ragpipe.stages import steps

    def build(revision: str, pipeline: Path) -> BuiltBundle:
        spec = load_pipeline_spec(pipeline)
        for name in STAGES:
            getattr(steps, name)(ws, revision, spec)
        facts = steps.read_stage_record(ws, revision, "index_bundle", spec).facts
        embedded = steps.read_stage_record(ws, revision, "embeddings", spec).facts
        return BuiltBundle(
            revision=revision,
            bundle_id=str(facts["bundle_id"]),
            bundle_path=ws.located(str(facts["bundle_path"])),
            embedded=int(embedded["encoded"]),
            cache_hits=int(embedded["cache_hits"]),
            up_to_date=False,
            dagster_run_id=None,
        )

    return build


def test_a_candidate_doubling_the_representations_doubles_the_vectors_in_the_comparison(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from ragpipe.candidates.asset_ids import EvaluatorSettings
    from ragpipe.candidates.create import new_candidate, parent_from_revision
    from ragpipe.candidates.run import run_candidate
    from ragpipe.spec import load_pipeline_spec

    monkeypatch.delenv("RAGPIPE_PIPELINE_SPEC", raising=False)
    corpus = tmp_path / "rev-1-head.jsonl"
    corpus.write_text(
        "".join((SAMPLE / "rev-1.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:60]), encoding="utf-8"
    )
    pipeline = raw_only_pipeline(tmp_path / "pipeline-raw.yaml")
    ws, _, parent_bundle = build_all_stages(
        tmp_path / "ragpipe", "s1", corpus, "beir", spec=load_pipeline_spec(pipeline)
    )
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        (Path(DEFAULT_POLICY_PATH).parent / "query_plan.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    parent = parent_from_revision(
        ws, "s1", pipeline, plan, load_suite(SAMPLE / "suite.jsonl"), DEFAULT_POLICY_PATH, EvaluatorSettings(k=50)
    )
    candidate = new_candidate(parent, ["representations.kinds=[raw, title_breadcrumb]"], tmp_path / "c-build")
    result = run_candidate(ws, candidate, build_here(ws))
    assert result.build is not None and result.build.bundle_path != parent_bundle

    comparison = load_comparison(result.out / "comparison.json")
    inc, ch = comparison.incumbent.build, comparison.challenger.build
    parent_vectors, parent_bytes = bundle_figures(parent_bundle)
    child_vectors, child_bytes = bundle_figures(result.build.bundle_path)
    assert (inc.vectors, inc.payload_bytes, ch.vectors, ch.payload_bytes) == (
        parent_vectors,
        parent_bytes,
        child_vectors,
        child_bytes,
    )
    assert ch.vectors == 2 * inc.vectors > 0  # one title_breadcrumb representation per chunk next to each raw one
    assert inc.payload_bytes < ch.payload_bytes < 2 * inc.payload_bytes  # the chunk and document tables do not double
    decision = json.loads((result.out / "decision.json").read_text())
    checks = {c["name"]: c for c in decision["checks"] if c["phase"] == "cost"}
    assert {k: checks["build_vectors_relative"][k] for k in ("value", "op", "threshold", "verdict")} == {
        "value": float(ch.vectors),
        "op": "<=",
        "threshold": 2.0 * inc.vectors,
        "verdict": "pass",
    }  # exactly the default ratio
    assert checks["bundle_bytes_relative"]["verdict"] == "pass"
    strict = decide(parse_policy(_default_doc_with(max_build_vectors_ratio=1.5), "tight.yaml"), comparison)
    assert [c.reason for c in strict.checks if c.name == "build_vectors_relative"] == [
        f"cost build_vectors_relative: {ch.vectors} is not <= {1.5 * inc.vectors:.6g}"
    ]


def _default_doc_with(**bounds: float) -> dict:
    """The default policy document with the given cost bounds changed."""
    import yaml

    doc = yaml.safe_load(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"))
    doc["cost"] = {**doc["cost"], **bounds}
    return doc
