"""An evaluation run through the real Retriever: folder, ledger, traces, metrics, identity."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import HEAD, LEDGER, read_ledger, reduce_records
from ragpipe.evaluation.metrics import collapse, score_cases
from ragpipe.evaluation.run_folder import RunError, verify_run
from ragpipe.evaluation.runner import CELLS_PER_COMMIT, resume_evaluation, run_evaluation
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.evaluation.traces import TraceError
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.retrieval.plan import load_plan, parse_plan
from ragpipe.retrieval.retriever import MODES, Retriever
from ragpipe_tests.support.eval_support import EVALUABLE, FORBIDDEN, SUITE_CASES, eval_bundle  # noqa: F401


def grouped(cells: int, size: int) -> list[str]:
    """The record kinds of ``cells`` cells run ``size`` at a time: a group's closing records follow
    the next group's starts (its trace file is written while the next group runs)."""
    sizes = [min(size, cells - start) for start in range(0, cells, size)]
    kinds: list[str] = []
    for i, n in enumerate(sizes):
        kinds += ["CellStarted"] * n
        if i:
            kinds += ["CellCompleted"] * sizes[i - 1]
    return kinds + ["CellCompleted"] * sizes[-1] if sizes else kinds


@pytest.fixture(scope="module")
def evaluated(eval_bundle, tmp_path_factory):  # noqa: F811
    bundle, suite_path = eval_bundle
    retriever = Retriever(bundle, plan=load_plan())
    spec = EvaluationSpec.build(load_suite(suite_path), load_plan(), bundle, retriever.bundle_id, k=50)
    out = tmp_path_factory.mktemp("evalrun") / "run"
    result = run_evaluation(spec, out, retriever_factory=lambda _: retriever)
    return spec, out, result, retriever


def test_run_folder_and_ledger(evaluated):
    spec, out, result, _ = evaluated
    assert sorted(p.name for p in out.iterdir()) == [
        "inputs",
        "ledger.head",
        "ledger.jsonl",
        "report.json",
        "report.md",
        "traces",
    ]
    assert sorted(p.name for p in (out / "inputs").iterdir()) == ["query_plan.json", "spec.json", "suite.jsonl"]
    assert (out / "inputs" / "spec.json").read_bytes() == canonical_bytes(spec.body.as_json()) + b"\n"
    records = read_ledger(out).records
    kinds = [r.kind for r in records]
    assert EVALUABLE > CELLS_PER_COMMIT  # two group commits: starts, then closes, a trace file each
    assert kinds == ["RunCreated"] + ["InputBound"] * 4 + grouped(EVALUABLE, CELLS_PER_COMMIT) + ["RunCompleted"]
    assert [r.payload["name"] for r in records[1:5]] == ["suite", "query_plan", "spec", "bundle"]
    assert json.loads((out / HEAD).read_bytes()) == {"hash": records[-1].hash, "seq": len(records)}
    files = ["cells-000001.parquet", f"cells-{CELLS_PER_COMMIT + 1:06d}.parquet"]
    assert sorted(p.name for p in (out / "traces").iterdir()) == files
    refs = [r.payload["trace"] for r in records if r.kind == "CellCompleted"]
    first, second = refs[:CELLS_PER_COMMIT], refs[CELLS_PER_COMMIT:]
    for group, name in zip((first, second), files, strict=True):  # each cell's rows follow the previous cell's
        assert [(r["first_row"], r["file"]) for r in group] == [
            (sum(x["rows"] for x in group[:i]), f"traces/{name}") for i in range(len(group))
        ]
        assert sum(r["rows"] for r in group) == pq.read_metadata(out / "traces" / name).num_rows
    state = verify_run(out)
    assert state.status == "completed" and state.spec_id == spec.spec_id == result.report["spec_id"]
    report = result.report
    assert (report["cases"], report["evaluated"], len(report["skipped"]), report["cells"]) == (
        SUITE_CASES,
        EVALUABLE,
        SUITE_CASES - EVALUABLE,
        {"expected": EVALUABLE, "completed": EVALUABLE, "failed": 0, "pending": 0},
    )
    assert {s["reason"] for s in report["skipped"]} == {"missing_judged_targets"} and all(
        s["missing"] for s in report["skipped"]
    )
    assert report["latency_ms"]["n"] == EVALUABLE and report["ledger_head"] == records[-1].hash


def test_metrics_equal_ir_measures_on_the_traced_ranking(evaluated):
    spec, out, result, retriever = evaluated
    state = reduce_records(read_ledger(out).records)
    cases = spec.suite.by_id()
    ranking_specs = spec.body.ranking_metrics()
    for key, payload in state.terminal.items():
        case = cases[key[0]]
        ref = payload["trace"]
        table = pq.read_table(out / ref["file"]).slice(ref["first_row"], ref["rows"]).to_pylist()
        final = [
            (r["document_id"], r["chunk_id"])
            for r in sorted((r for r in table if r["stage"] == "final"), key=lambda r: r["rank"])
        ]
        collapsed = collapse(final, case.target_level)
        assert len(final) == payload["hits"] == 50
        assert {r["channel"] for r in table if r["stage"] == "channel"} == {"lexical", "vector"}
        # No reranker: the hits are the fused list's first k, so it is not stored again.
        assert {r["stage"] for r in table} == {"channel", "final"} and all(r["case_id"] == key[0] for r in table)
        expected = {"unauthorized_disclosures": sum(1 for d, _ in final if d == FORBIDDEN and case.id == "x-forbidden")}
        if case.answerability == "answerable":
            expected.update(score_cases({case.id: case.judgments}, {case.id: collapsed}, ranking_specs)[case.id])
        assert payload["metrics"] == expected
        described = json.loads(pq.read_schema(out / ref["file"]).metadata[b"ragpipe.cells"])
        assert described["format"] == 3
        (meta,) = [c for c in described["cells"] if c["cell"] == payload["cell"]]
        assert meta["metrics"] == expected and meta["latency_ms"] == payload["latency_ms"]
    assert state.terminal[("x-forbidden", 0, "a")]["metrics"]["unauthorized_disclosures"] >= 1
    assert set(state.terminal[("x-unanswerable", 0, "a")]["metrics"]) == {"unauthorized_disclosures"}
    assert (
        result.report["metrics"]["unauthorized_disclosures"]["value"]
        == state.terminal[("x-forbidden", 0, "a")]["metrics"]["unauthorized_disclosures"]
    )
    assert result.report["metrics"]["ndcg@10"]["n"] == EVALUABLE - 1  # the unanswerable case takes no ranking metric


def test_spec_identity(evaluated):
    spec, _, _, retriever = evaluated
    again = EvaluationSpec.build(
        spec.suite, load_plan(), spec.bundle_path.parent / "elsewhere", retriever.bundle_id, k=50
    )
    assert again.spec_id == spec.spec_id  # the bundle path is operational
    for change in (
        {"k": 51},
        {"mode": "lexical"},
        {"cutoffs": {"ndcg": 20}},
        {"repeats": 2},
        {"scopes": ("public", "staff")},
        {"answers": True},
    ):
        changed = EvaluationSpec.build(
            spec.suite, load_plan(), spec.bundle_path, retriever.bundle_id, **{"k": 50, **change}
        )
        assert changed.spec_id != spec.spec_id, change
    assert set(spec.body.as_json()) == {
        "schema",
        "evaluator",
        "suite_digest",
        "bundle_id",
        "plan_id",
        "mode",
        "scopes",
        "k",
        "metrics",
        "repeats",
        "arm",
        "answers",
    }


def test_the_group_size_changes_where_records_and_rows_are_never_what_they_say(evaluated, tmp_path):
    """Two cells per commit: groups of starts then closes, one trace file per group, and the same
    closing records (but for the trace reference) and the same rows per cell as one big group."""
    spec, out, result, retriever = evaluated
    small = run_evaluation(spec, tmp_path / "pairs", retriever_factory=lambda _: retriever, cells_per_commit=2)
    records = read_ledger(small.out).records
    assert [r.kind for r in records if r.kind.startswith("Cell")] == grouped(EVALUABLE, 2)
    assert sorted(p.name for p in (small.out / "traces").iterdir()) == [
        f"cells-{i:06d}.parquet" for i in range(1, EVALUABLE + 1, 2)
    ]
    assert small.report["metrics"] == result.report["metrics"]

    def rows(run):
        state = reduce_records(read_ledger(run).records)
        out = {}
        for key, p in state.terminal.items():
            ref = p["trace"]
            table = pq.read_table(run / ref["file"]).slice(ref["first_row"], ref["rows"])
            out[key] = (
                table.drop_columns(["score"]).to_pylist(),
                {k: v for k, v in p.items() if k not in ("trace", "latency_ms")},
            )
        return out

    assert rows(small.out) == rows(out)
    with pytest.raises(RunError, match=r"^cells per commit must be 1 to 256, got 0$"):
        run_evaluation(spec, tmp_path / "none", retriever_factory=lambda _: retriever, cells_per_commit=0)


def test_second_run_gets_a_fresh_run_id_and_same_metrics(evaluated, tmp_path):
    spec, _, result, retriever = evaluated
    second = run_evaluation(spec, tmp_path / "again", retriever_factory=lambda _: retriever)
    assert second.report["run_id"] != result.report["run_id"] and second.report["spec_id"] == result.report["spec_id"]
    assert second.report["metrics"] == result.report["metrics"]
    with pytest.raises(
        RunError, match=r"again: already exists \(a run folder is created once; use --resume to continue it\)$"
    ):
        run_evaluation(spec, tmp_path / "again", retriever_factory=lambda _: retriever)


def test_resume_of_a_completed_run_is_a_no_op(evaluated):
    _, out, result, retriever = evaluated
    before = (out / LEDGER).read_bytes()
    assert resume_evaluation(out, retriever_factory=lambda _: retriever).report == result.report
    assert (out / LEDGER).read_bytes() == before


def test_tampered_inputs_and_traces_are_refused(evaluated, tmp_path):
    _, out, _, retriever = evaluated
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    suite = copy / "inputs" / "suite.jsonl"
    suite.write_bytes(suite.read_bytes().replace(b"answerable", b"answerablE", 1))
    with pytest.raises(RunError, match=r"inputs/suite.jsonl: differs from the digest of its InputBound record 2$"):
        resume_evaluation(copy, retriever_factory=lambda _: retriever)
    shutil.copy(out / "inputs" / "suite.jsonl", suite)
    records = read_ledger(copy).records
    first = next(r for r in records if r.kind == "CellCompleted")
    trace = copy / first.payload["trace"]["file"]
    trace.write_bytes(trace.read_bytes()[:-1] + b"X")
    with pytest.raises(
        TraceError, match=rf"record {first.seq}: trace .*cells-000001.parquet does not match the digest in the ledger$"
    ):
        verify_run(copy)


def test_other_plan_is_refused(evaluated, tmp_path):
    spec, _, _, _ = evaluated
    plan = load_plan()
    other = Retriever(
        spec.bundle_path,
        plan=parse_plan(
            {**plan.model_dump(mode="json", by_alias=True), "fusion": {"kind": "weighted_rrf", "k": 30}}, "rrf-k30"
        ),
    )
    with pytest.raises(
        RunError, match=rf"^query plan sha256:[0-9a-f]{{64}} is not the spec's plan {spec.body.plan_id}$"
    ):
        run_evaluation(spec, tmp_path / "x", retriever_factory=lambda _: other)
    assert not (tmp_path / "x").exists()


def test_cells_collector_setting_is_restored():
    """long_lived_heap_frozen changes the collector only while the cells run, also on an error."""
    import gc

    from ragpipe.evaluation.runner import long_lived_heap_frozen

    before = (gc.get_threshold(), gc.get_freeze_count())
    with pytest.raises(RuntimeError):
        with long_lived_heap_frozen():
            assert gc.get_threshold()[0] >= 100_000 and gc.get_freeze_count() > 0
            raise RuntimeError("a cell blew up")
    assert (gc.get_threshold(), gc.get_freeze_count()) == before


@pytest.mark.parametrize("mode,k", [("hybrid", 50), ("hybrid", 5), ("lexical", 30), ("vector", 1)])
def test_rankings_are_what_the_audit_trace_shows(evaluated, mode, k):
    """``query(rankings=True)`` hands over the objects the audit trace renders: same channel hits,
    same fused items (cut at max(k, 20)), and the trace table built from them."""
    spec, _, _, retriever = evaluated
    for case in spec.suite.cases[:5]:
        audited = retriever.query(case.query, k=k, mode=mode, audit=True, rankings=True)
        plain = retriever.query(case.query, k=k, mode=mode, rankings=True)
        assert plain.trace is None and plain.rankings == audited.rankings and plain.hits == audited.hits
        channels = {
            n: [
                {
                    "rank": r.rank,
                    "representation_id": r.hit.representation_id,
                    "chunk_id": r.hit.chunk_id,
                    "document_id": r.hit.document_id,
                    "score": r.hit.score,
                }
                for r in ranked
            ]
            for n, ranked in plain.rankings.channels.items()
        }
        assert channels == audited.trace["channels"] and set(channels) == set(MODES[mode])
        fused = [
            {
                "chunk_id": f.chunk_id,
                "document_id": f.document_id,
                "score": f.score,
                "contributions": f.contributions,
                "channel_ranks": f.channel_ranks,
            }
            for f in plain.rankings.fused
        ]
        assert fused == audited.trace["fusion"]["items"] and len(fused) <= max(k, 20)
        assert retriever.query(case.query, k=k, mode=mode).rankings is None
