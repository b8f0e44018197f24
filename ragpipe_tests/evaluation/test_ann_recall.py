"""ANN recall as evidence: every evaluation of an approximate plan measures ``ann_recall@10``,
records both top-10 lists in the cell's trace, and the run verifier recomputes it; the gate bounds
it like any metric.

lance's builds are not seeded, so no assertion depends on the recall a real build happens to
reach: runs whose recall is fixed by construction carry the value assertions — ``refine_factor``
100 (the candidates cover every row of this bundle: recall 1 for any build) and an index that
returns the rows exact search ranks last (recall 0) — and the run of a narrow plan only laws.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragpipe.evaluation.ann import ANN_RECALL, APPROXIMATE_STAGE, EXACT_STAGE
from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import LEDGER, read_ledger
from ragpipe.evaluation.run_folder import verify_run
from ragpipe.evaluation.runner import run_evaluation
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.evaluation.traces import TraceError
from ragpipe.experiment.arm_source import load_arm
from ragpipe.experiment.comparison import compare
from ragpipe.experiment.decision import GateError, decide
from ragpipe.experiment.gate_policy import parse_policy
from ragpipe.experiment.pairing import pair
from ragpipe.index.hits import recall_of
from ragpipe.retrieval.plan import ApproximateVectorSearchPlan, load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.evaluation.test_recompute import Payloads, completed, retrace, rewrite
from ragpipe_tests.support.ann_support import ann_bundle  # noqa: F401  (fixture)
from ragpipe_tests.support.eval_support import EVALUABLE, eval_bundle  # noqa: F401  (fixture)
from ragpipe_tests.support.gate_support import policy_doc

HARD = {
    "unauthorized_disclosures": {"max": 0},
    ANN_RECALL: {"min": 0.95},
}


def approximate_plan(**parameters):
    plan = load_plan()
    return plan.model_copy(update={"vector_search": ApproximateVectorSearchPlan(kind="approximate", **parameters)})


class FarthestRows:
    """An ANN index that returns the ``limit`` visible rows exact search ranks *last*: its top 10
    never meets exact search's (recall 0) when more than ``limit + 10`` rows are visible."""

    def __init__(self, exact):
        self.exact = exact
        self.position = {row[0]: i for i, row in enumerate(exact.rows)}

    def ann_rows(self, vector, limit, where, *, nprobes, ef):
        ranked = self.exact.search(vector, len(self.exact.rows), where)
        return np.array([self.position[h.representation_id] for h in ranked[-limit:]], dtype=np.intp)

    def close(self):
        pass


@pytest.fixture(scope="module")
def runs(ann_bundle, eval_bundle, tmp_path_factory):  # noqa: F811
    """Runs at k = 20 of the same suite: the exact plan on the bundle without an ANN index, and
    on the ANN bundle a narrow approximate plan, a perfect one and an adversarial index."""
    ann_path, suite_path = ann_bundle
    exact_path, _ = eval_bundle
    suite = load_suite(suite_path)
    root = tmp_path_factory.mktemp("ann-runs")
    exact = Retriever(exact_path, plan=load_plan())
    embedder = exact.embedder()
    retrievers = {
        "exact": exact,
        "narrow": Retriever(ann_path, plan=approximate_plan(nprobes=1, ef=10, refine_factor=1), embedder=embedder),
        "perfect": Retriever(ann_path, plan=approximate_plan(refine_factor=100), embedder=embedder),
        "adversarial": Retriever(ann_path, plan=approximate_plan(), embedder=embedder),
    }
    adversarial = retrievers["adversarial"].vector
    adversarial.index.close()
    adversarial.index = FarthestRows(adversarial.exact)
    out = {}
    for name, retriever in retrievers.items():
        bundle = exact_path if name == "exact" else ann_path
        spec = EvaluationSpec.build(suite, retriever.plan, bundle, retriever.bundle_id, k=20)
        run_evaluation(spec, root / name, retriever_factory=lambda _, r=retriever: r)
        out[name] = root / name
    out["retrievers"] = retrievers
    yield out
    for retriever in retrievers.values():
        retriever.close()


def cell_lists(run: Path, payload: dict) -> tuple[list[str], list[str]]:
    ref = payload["trace"]
    rows = pq.read_table(run / ref["file"]).slice(ref["first_row"], ref["rows"]).to_pylist()
    approximate = sorted((r["rank"], r["representation_id"]) for r in rows if r["stage"] == APPROXIMATE_STAGE)
    exact = sorted((r["rank"], r["representation_id"]) for r in rows if r["stage"] == EXACT_STAGE)
    return [i for _, i in approximate], [i for _, i in exact]


def cells(run: Path) -> list[dict]:
    return [r.payload for r in read_ledger(run).records if r.kind == "CellCompleted"]


def test_only_an_approximate_plan_with_a_vector_channel_declares_ann_recall(runs, ann_bundle):  # noqa: F811
    def declared(run: Path) -> list[str]:
        return [m["name"] for m in read_ledger(run).records[0].payload["spec"]["metrics"]]

    assert ANN_RECALL not in declared(runs["exact"])
    for name in ("narrow", "perfect", "adversarial"):
        assert declared(runs[name])[-1] == ANN_RECALL  # after the ranking and safety metrics
    approximate = runs["retrievers"]["narrow"]
    suite = load_suite(ann_bundle[1])
    lexical = EvaluationSpec.build(suite, approximate.plan, ann_bundle[0], approximate.bundle_id, mode="lexical")
    assert ANN_RECALL not in [m.name for m in lexical.body.metrics]


def test_every_cell_records_the_recall_of_its_two_top_10_lists(runs):
    run, retriever = runs["narrow"], runs["retrievers"]["narrow"]
    assert verify_run(run).status == "completed"
    payloads = cells(run)
    assert len(payloads) == EVALUABLE
    suite = {c.id: c for c in load_suite(run / "inputs" / "suite.jsonl").cases}
    values = []
    for payload in payloads:
        approximate, exact = cell_lists(run, payload)
        assert len(approximate) == len(exact) == 10
        assert payload["metrics"][ANN_RECALL] == recall_of(approximate, exact)
        values.append(payload["metrics"][ANN_RECALL])
    # exact search's list is what the retriever computes for the case now (it does not depend on the build)
    for payload in payloads[:3]:
        case = suite[payload["cell"]["case"]]
        assert cell_lists(run, payload)[1] == retriever.ann_comparison(case.query, k=10).exact_ids
    report = (run / "report.json").read_text()
    assert f'"{ANN_RECALL}"' in report
    assert load_arm(run).coordinates.metric(ANN_RECALL).direction == "higher"
    aggregate = json.loads(report)["metrics"][ANN_RECALL]
    assert (aggregate["n"], aggregate["value"]) == (EVALUABLE, pytest.approx(sum(values) / len(values)))


def test_recall_is_one_when_the_candidates_cover_every_row_and_zero_against_the_farthest_rows(runs):
    assert {p["metrics"][ANN_RECALL] for p in cells(runs["perfect"])} == {1.0}
    assert {p["metrics"][ANN_RECALL] for p in cells(runs["adversarial"])} == {0.0}
    for payload in cells(runs["exact"]):
        assert ANN_RECALL not in payload["metrics"]


@pytest.fixture
def adversarial(runs, tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs["adversarial"], tmp_path / "adversarial"))


def test_a_forged_recall_is_refused(adversarial: Path):
    seqs = []

    def edit(payloads: Payloads) -> None:
        payload = completed(payloads)
        seqs.append(next(i for i, (_, p) in enumerate(payloads, start=1) if p is payload))
        payload["metrics"][ANN_RECALL] = 1.0
        retrace(adversarial, payloads, payload, lambda t: t, lambda m: m["metrics"].update({ANN_RECALL: 1.0}))

    rewrite(adversarial, edit)
    with pytest.raises(TraceError) as err:
        verify_run(adversarial)
    assert str(err.value) == (
        f"{adversarial / LEDGER}: record {seqs[0]}: {ANN_RECALL} is 1 in the ledger, 0.0 recomputed from its "
        "trace and the suite"
    )
    with pytest.raises(ValueError, match=f"{ANN_RECALL} is 1 in the ledger"):
        load_arm(adversarial)  # the gate's one way to a run


def test_lists_no_comparison_could_give_are_refused(adversarial: Path):
    """An approximate row scored above exact search's row of the same rank: exact search ranks
    every visible row, so its i-th best is never below a subset's i-th best."""

    def raise_first(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        first = next(r for r in rows if r["stage"] == APPROXIMATE_STAGE and r["rank"] == 1)
        first["score"] = 2.0
        return pa.Table.from_pylist(rows, schema=table.schema)

    rewrite(adversarial, lambda p: retrace(adversarial, p, completed(p), raise_first, lambda m: None))
    with pytest.raises(TraceError, match=r"record \d+: ann_approximate row 1 scores above ann_exact row 1"):
        verify_run(adversarial)


def test_an_exact_run_cannot_claim_ann_recall(runs, tmp_path: Path):
    run = Path(shutil.copytree(runs["exact"], tmp_path / "exact"))

    def edit(payloads: Payloads) -> None:
        payload = completed(payloads)
        payload["metrics"][ANN_RECALL] = 1.0
        retrace(run, payloads, payload, lambda t: t, lambda m: m["metrics"].update({ANN_RECALL: 1.0}))

    rewrite(run, edit)
    with pytest.raises(TraceError, match=rf"record \d+: metric '{ANN_RECALL}' is claimed but not computed"):
        verify_run(run)


def test_the_gate_bounds_ann_recall(runs):
    bound = parse_policy(policy_doc(hard=HARD), "p.yaml")

    def ann_check(decision):
        (check,) = [c for c in decision.checks if c.metric == ANN_RECALL]
        return check.verdict, check.value, check.reason

    # alone (bootstrap): a low recall blocks at the hard phase, a full one passes it
    low = decide(bound, None, load_arm(runs["adversarial"]))
    assert (low.eligible, low.decisive_phase) == (False, "hard")
    assert ann_check(low) == ("fail", 0.0, f"hard min {ANN_RECALL}: 0 is not >= 0.95")
    assert ann_check(decide(bound, None, load_arm(runs["perfect"])))[:2] == ("pass", 1.0)
    # an exact run does not measure it: refused, unless the bound applies only if measured
    with pytest.raises(GateError, match=f"the policy names metric '{ANN_RECALL}', which the run does not measure"):
        decide(bound, None, load_arm(runs["exact"]))
    optional = parse_policy(policy_doc(hard={**HARD, ANN_RECALL: {"min": 0.95, "if_measured": True}}), "p.yaml")
    assert ann_check(decide(optional, None, load_arm(runs["exact"])))[0] == "skipped"
    # paired: an exact incumbent and an approximate challenger pair; the challenger's recall is bounded
    incumbent = load_arm(runs["exact"])
    for name, verdict in (("adversarial", "fail"), ("perfect", "pass")):
        comparison = compare(pair(incumbent, load_arm(runs[name])))
        assert comparison.coordinates.metric(ANN_RECALL) is None  # not a paired metric
        decision = decide(bound, comparison, load_arm(runs[name]))
        assert ann_check(decision)[0] == verdict
        if verdict == "fail":
            assert decision.decisive_phase == "hard"


def test_an_approximate_run_that_leaves_out_its_recall_is_refused(runs, ann_bundle, tmp_path: Path):  # noqa: F811
    """A run of an approximate plan whose spec drops ``ann_recall@10`` would pass a gate bound with
    ``if_measured`` unmeasured: its bound inputs are refused, whether the run is made or verified."""
    from ragpipe.evaluation.run_folder import RunError

    retriever = runs["retrievers"]["adversarial"]
    spec = EvaluationSpec.build(load_suite(ann_bundle[1]), retriever.plan, ann_bundle[0], retriever.bundle_id, k=20)
    body = spec.body.model_copy(update={"metrics": tuple(m for m in spec.body.metrics if m.name != ANN_RECALL)})
    out = tmp_path / "no-recall"
    with pytest.raises(RunError) as info:
        run_evaluation(
            EvaluationSpec(body, spec.suite, spec.plan, spec.bundle_path), out, retriever_factory=lambda _: retriever
        )
        verify_run(out)
    assert str(info.value) == (
        f"{out / 'inputs' / 'spec.json'}: mode 'hybrid' under plan {retriever.plan.plan_id} "
        f"searches approximately but does not measure {ANN_RECALL}"
    )


def test_lists_shorter_than_the_vector_channel_allows_are_refused(adversarial: Path):
    """Both lists dropped and recall 1.0 claimed: the cell's vector channel ranked at least ten
    units, so exact search's list cannot have been shorter than ten."""

    def drop_lists(table: pa.Table) -> pa.Table:
        rows = [r for r in table.to_pylist() if r["stage"] not in (APPROXIMATE_STAGE, EXACT_STAGE)]
        return pa.Table.from_pylist(rows, schema=table.schema)

    def edit(payloads: Payloads) -> None:
        payload = completed(payloads, lambda p: p["metrics"].get(ANN_RECALL) == 0.0)
        payload["metrics"][ANN_RECALL] = 1.0
        retrace(adversarial, payloads, payload, drop_lists, lambda m: m["metrics"].update({ANN_RECALL: 1.0}))

    rewrite(adversarial, edit)
    with pytest.raises(
        TraceError,
        match=r"record \d+: the trace lists 0 ann_exact rows, but its vector channel ranked \d+ units: exact search returns 10",
    ):
        verify_run(adversarial)


def test_a_non_finite_score_in_the_lists_is_refused(adversarial: Path):
    def nan_score(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        next(r for r in rows if r["stage"] == EXACT_STAGE and r["rank"] == 3)["score"] = float("nan")
        return pa.Table.from_pylist(rows, schema=table.schema)

    rewrite(adversarial, lambda p: retrace(adversarial, p, completed(p), nan_score, lambda m: None))
    with pytest.raises(TraceError, match=r"record \d+: the trace's ann_exact rows lack a finite score"):
        verify_run(adversarial)
