"""Verification recomputes every cell's metrics from its trace and the bound suite: forgeries with
the chain, the head and every digest recomputed are refused, naming the record and the metric."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec, SpecBody
from ragpipe.evaluation.ledger import DOMAIN, HEAD, LEDGER, encode, read_ledger
from ragpipe.evaluation.metrics import collapse
from ragpipe.evaluation.run_folder import INPUTS, verify_run
from ragpipe.evaluation.runner import run_evaluation
from ragpipe.evaluation.suite import parse_suite_bytes, suite_bytes
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.evaluation.traces import CELLS_METADATA_KEY, TraceError
from ragpipe.experiment.arm_source import load_arm
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import bytes_digest
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.eval_support import FORBIDDEN, eval_bundle  # noqa: F401

Payloads = list[tuple[str, dict]]


def _run(eval_bundle, root: Path, answers: bool) -> Path:  # noqa: F811
    bundle, suite_path = eval_bundle
    retriever = Retriever(bundle, plan=load_plan())
    spec = EvaluationSpec.build(load_suite(suite_path), load_plan(), bundle, retriever.bundle_id, k=20, answers=answers)
    out = root / ("answered" if answers else "ranked")
    run_evaluation(spec, out, retriever_factory=lambda _: retriever)
    return out


@pytest.fixture(scope="module")
def runs(eval_bundle, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("recompute")
    return {"ranked": _run(eval_bundle, root, False), "answered": _run(eval_bundle, root, True)}


@pytest.fixture
def ranked(runs, tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs["ranked"], tmp_path / "ranked"))


@pytest.fixture
def answered(runs, tmp_path: Path) -> Path:
    return Path(shutil.copytree(runs["answered"], tmp_path / "answered"))


def rewrite(run: Path, edit: Callable[[Payloads], None]) -> None:
    """Apply ``edit`` to the records' (kind, payload) list, then write the ledger with every hash,
    the chain and the head recomputed: what a forger without a key can always do."""
    payloads = [(r.kind, json.loads(json.dumps(r.payload))) for r in read_ledger(run).records]
    edit(payloads)
    data, prev = b"", None
    for seq, (kind, payload) in enumerate(payloads, start=1):
        record = DOMAIN.make_record(seq, kind, payload, prev)
        data += encode(record)
        prev = record.hash
    (run / LEDGER).write_bytes(data)
    (run / HEAD).write_bytes(canonical_bytes({"hash": prev, "seq": len(payloads)}) + b"\n")


def completed(payloads: Payloads, which: Callable[[dict], bool] = lambda p: True) -> dict:
    return next(p for k, p in payloads if k == "CellCompleted" and which(p))


def retrace(
    run: Path,
    payloads: Payloads,
    payload: dict,
    table: Callable[[pa.Table], pa.Table],
    meta: Callable[[dict], None],
    file_meta: Callable[[dict], None] = lambda m: None,
) -> None:
    """Rewrite the rows and the description of the cell ``payload`` (its record) through ``table``
    and ``meta`` (and the file's metadata through ``file_meta``) in its group's trace file, then
    put the file's new digest into every record that references it and move the cell's row range
    and those after it: what a forger without a key can always do."""
    ref = payload["trace"]
    path = run / ref["file"]
    old = pq.read_table(path)
    metadata = json.loads(old.schema.metadata[CELLS_METADATA_KEY])
    meta(next(c for c in metadata["cells"] if c["cell"] == payload["cell"]))
    file_meta(metadata)
    first, rows = ref["first_row"], ref["rows"]
    cell = table(old.slice(first, rows).replace_schema_metadata())
    parts = [old.slice(0, first).replace_schema_metadata(), cell, old.slice(first + rows).replace_schema_metadata()]
    new = pa.concat_tables(parts).replace_schema_metadata({CELLS_METADATA_KEY: canonical_bytes(metadata)})
    pq.write_table(new, path)
    digest = bytes_digest(path.read_bytes())
    for _, other in payloads:
        theirs = other.get("trace") if isinstance(other, dict) else None
        if isinstance(theirs, dict) and theirs.get("file") == ref["file"]:
            moved = theirs["first_row"] + cell.num_rows - rows if theirs["first_row"] > first else theirs["first_row"]
            other["trace"] = {**theirs, "digest": digest, "first_row": moved}
    payload["trace"]["rows"] = cell.num_rows


def cell_rows(run: Path, payload: dict) -> list[dict]:
    ref = payload["trace"]
    return pq.read_table(run / ref["file"]).slice(ref["first_row"], ref["rows"]).to_pylist()


def answerable(payload: dict) -> bool:
    return "ndcg@10" in payload["metrics"] and payload["metrics"]["ndcg@10"] < 1


def test_untouched_runs_verify(runs):
    for run in runs.values():
        assert verify_run(run).status == "completed"


def test_a_claimed_metric_with_its_trace_rewritten_and_every_digest_recomputed_is_refused(ranked: Path):
    seqs = []

    def edit(payloads: Payloads) -> None:
        payload = completed(payloads, answerable)
        seqs.append(next(i for i, (_, p) in enumerate(payloads, start=1) if p is payload))
        seqs.append(payload["metrics"]["ndcg@10"])
        payload["metrics"]["ndcg@10"] = 1.0
        retrace(ranked, payloads, payload, lambda t: t, lambda m: m["metrics"].update({"ndcg@10": 1.0}))

    rewrite(ranked, edit)
    with pytest.raises(TraceError) as err:
        verify_run(ranked)
    assert str(err.value) == (
        f"{ranked / LEDGER}: record {seqs[0]}: ndcg@10 is 1 in the ledger, {seqs[1]!r} recomputed from its "
        "trace and the suite"
    )
    with pytest.raises(ValueError, match=r"ndcg@10 is 1 in the ledger"):
        load_arm(ranked)  # the gate's and the release's one way to a run


def test_metrics_edited_in_the_ledger_alone_are_refused(ranked: Path):
    rewrite(ranked, lambda p: completed(p, answerable)["metrics"].update({"ndcg@10": 1.0}))
    with pytest.raises(TraceError, match=r"record \d+: the trace's metadata differs from the record"):
        verify_run(ranked)


def test_final_hits_reordered_are_measured_as_they_are_now(ranked: Path):
    """Reverse a cell's final hits (ranks kept): what the metrics are computed on is derived from
    the final rows, so the claim no longer holds."""

    def reverse(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        final = [r for r in rows if r["stage"] == "final"]
        items = [(r["chunk_id"], r["document_id"], r["access_scopes"]) for r in reversed(final)]
        for r, (chunk, document, scopes) in zip(final, items, strict=True):
            r["chunk_id"], r["document_id"], r["access_scopes"] = chunk, document, scopes
        return pa.Table.from_pylist(rows, schema=table.schema)

    def found(payload: dict) -> bool:  # a relevant target in the top 10, not only relevant ones
        return answerable(payload) and payload["metrics"]["ndcg@10"] > 0

    rewrite(ranked, lambda p: retrace(ranked, p, completed(p, found), reverse, lambda m: None))
    with pytest.raises(TraceError, match=r"record \d+: (ndcg|mrr|hit|precision|relevant_recall)@\d+ is "):
        verify_run(ranked)


def test_rows_of_another_cell_are_refused(ranked: Path):
    """A cell's range moved onto its neighbour's rows (the file and its digest untouched)."""

    def edit(payloads: Payloads) -> None:
        first, second = [p for k, p in payloads if k == "CellCompleted"][:2]
        first["trace"] = {**first["trace"], "first_row": second["trace"]["first_row"]}

    rewrite(ranked, edit)
    with pytest.raises(
        TraceError, match=r"record \d+: trace .*cells-000001.parquet: rows \d+\.\.\d+ are not all this cell's$"
    ):
        verify_run(ranked)


def test_a_record_naming_only_some_of_its_cells_rows_is_refused(ranked: Path):
    """The rows it leaves out (here its last final hit) could hold what counts against it."""
    rewrite(ranked, lambda p: completed(p)["trace"].update(rows=completed(p)["trace"]["rows"] - 1))
    with pytest.raises(
        TraceError, match=r"record \d+: trace .*cells-000001.parquet: the cell has (\d+) rows, its record names \d+$"
    ):
        verify_run(ranked)


def test_rows_beyond_the_file_are_refused(ranked: Path):
    rewrite(ranked, lambda p: completed(p)["trace"].update(first_row=10**6))  # its row count still right
    with pytest.raises(
        TraceError, match=r"record \d+: trace .*cells-000001.parquet has \d+ rows, not rows 1000000\.\."
    ):
        verify_run(ranked)


@pytest.mark.parametrize("times", [0, 2])
def test_a_cell_described_other_than_once_is_refused(ranked: Path, times: int):
    def edit(payloads: Payloads) -> None:
        payload = completed(payloads)

        def described(metadata: dict) -> None:
            mine = next(c for c in metadata["cells"] if c["cell"] == payload["cell"])
            metadata["cells"] = [c for c in metadata["cells"] if c is not mine] + [mine] * times

        retrace(ranked, payloads, payload, lambda t: t, lambda m: None, described)

    rewrite(ranked, edit)
    with pytest.raises(TraceError, match=rf"record \d+: trace .* describes this cell {times} times, not once$"):
        verify_run(ranked)


def test_a_hit_whose_scopes_say_secret_counts_as_a_disclosure(ranked: Path):
    def secret_first(table: pa.Table) -> pa.Table:
        rows = table.to_pylist()
        first = next(r for r in rows if r["stage"] == "final" and r["rank"] == 1)
        first["access_scopes"] = '["secret"]'
        return pa.Table.from_pylist(rows, schema=table.schema)

    rewrite(ranked, lambda p: retrace(ranked, p, completed(p), secret_first, lambda m: None))
    with pytest.raises(
        TraceError, match=r"unauthorized_disclosures is 0 in the ledger, 1 recomputed from its trace and the suite"
    ):
        verify_run(ranked)


def test_the_forbidden_case_counts_its_forbidden_document(runs):
    records = read_ledger(runs["ranked"]).records
    forbidden = next(r for r in records if r.kind == "CellCompleted" and r.payload["cell"]["case"] == "x-forbidden")
    rows = cell_rows(runs["ranked"], forbidden.payload)
    shown = [r["document_id"] for r in rows if r["stage"] == "final"].count(FORBIDDEN)
    assert forbidden.payload["metrics"]["unauthorized_disclosures"] == shown


def test_judgments_forged_in_the_bound_suite_with_every_digest_recomputed_are_refused(ranked: Path):
    """Grade every case's first retrieved document relevant: the suite's digest, the spec's suite
    digest and ID, RunCreated and the InputBound digests are all recomputed — the claims no
    longer equal what the forged judgments give."""
    suite_path = ranked / INPUTS["suite"]
    lines = [json.loads(line) for line in suite_path.read_bytes().splitlines()]
    records = read_ledger(ranked).records
    first = {r.payload["cell"]["case"]: cell_rows(ranked, r.payload) for r in records if r.kind == "CellCompleted"}
    for case in lines:
        rows = first.get(case["id"])
        if rows and case["judgments"]:
            final = sorted((r for r in rows if r["stage"] == "final"), key=lambda r: r["rank"])
            top = collapse([(r["document_id"], r["chunk_id"]) for r in final], case.get("target_level", "document"))[0]
            case["judgments"] = {**case["judgments"], top: 2}
    forged = suite_bytes(parse_suite_bytes(b"\n".join(canonical_bytes(c) for c in lines) + b"\n", "forged"))
    suite_path.write_bytes(forged)
    spec = json.loads((ranked / INPUTS["spec"]).read_bytes())
    spec["suite_digest"] = parse_suite_bytes(forged, "forged").digest
    body = SpecBody.model_validate(spec)
    spec_bytes = canonical_bytes(body.as_json()) + b"\n"
    (ranked / INPUTS["spec"]).write_bytes(spec_bytes)

    def edit(payloads: Payloads) -> None:
        created = payloads[0][1]
        created["spec"], created["spec_id"] = body.as_json(), body.spec_id
        for kind, payload in payloads:
            if kind == "InputBound" and payload["name"] == "suite":
                payload["digest"] = bytes_digest(forged)
            if kind == "InputBound" and payload["name"] == "spec":
                payload["digest"] = bytes_digest(spec_bytes)

    rewrite(ranked, edit)
    with pytest.raises(TraceError, match=r"record \d+: (ndcg|recall|mrr|precision|hit|relevant_recall)@\d+ is "):
        verify_run(ranked)


def test_a_metric_claimed_for_an_unanswerable_case_is_refused(ranked: Path):
    def edit(payloads: Payloads) -> None:
        payload = completed(payloads, lambda p: p["cell"]["case"] == "x-unanswerable")
        payload["metrics"]["ndcg@10"] = 1.0
        retrace(ranked, payloads, payload, lambda t: t, lambda m: m["metrics"].update({"ndcg@10": 1.0}))

    rewrite(ranked, edit)
    with pytest.raises(TraceError, match=r"metric 'ndcg@10' is claimed but not computed"):
        verify_run(ranked)


def test_a_trace_of_an_earlier_format_is_refused(ranked: Path):
    rewrite(
        ranked,
        lambda p: retrace(ranked, p, completed(p), lambda t: t, lambda m: None, lambda m: m.update(format=2)),
    )
    with pytest.raises(
        TraceError, match=r"format 2 does not carry what verification recomputes \(format 3\): evaluate again$"
    ):
        verify_run(ranked)


def test_an_answer_edited_to_abstain_contradicts_its_outcome_and_metrics(answered: Path):
    def edit(payloads: Payloads) -> None:
        payload = completed(payloads, lambda p: p["outcome"] == "success")
        retrace(answered, payloads, payload, lambda t: t, lambda m: m["answer"].update({"abstained": True}))

    rewrite(answered, edit)
    with pytest.raises(TraceError, match=r"outcome 'success' contradicts the recorded answer"):
        verify_run(answered)


def test_answer_metrics_are_recomputed_from_the_recorded_answer(answered: Path):
    def edit(payloads: Payloads) -> None:
        payload = completed(payloads, lambda p: p["metrics"].get("answer_contract_valid_rate") == 1)
        payload["metrics"]["answer_contract_valid_rate"] = 0.0

        def failed(meta: dict) -> None:
            meta["metrics"]["answer_contract_valid_rate"] = 0.0

        retrace(answered, payloads, payload, lambda t: t, failed)

    rewrite(answered, edit)
    with pytest.raises(TraceError, match=r"answer_contract_valid_rate is 0 in the ledger, 1\.0 recomputed"):
        verify_run(answered)


def test_a_forged_report_changes_nothing_the_gate_reads(ranked: Path):
    before = load_arm(ranked)
    report = json.loads((ranked / "report.json").read_bytes())
    report["metrics"]["ndcg@10"]["value"] = 1.0
    (ranked / "report.json").write_text(json.dumps(report))
    assert load_arm(ranked) == before  # arms are rebuilt from the verified cells, never the report


def test_a_cell_of_a_case_outside_the_suite_is_refused(ranked: Path):
    def edit(payloads: Payloads) -> None:
        victim = completed(payloads)["cell"]["case"]
        # Its rows name the case too: rename them with it, so only the suite can refuse the cell.
        retrace(
            ranked,
            payloads,
            completed(payloads),
            lambda t: t.set_column(0, "case_id", pa.array(["ghost"] * t.num_rows)),
            lambda m: m["cell"].update({"case": "ghost"}),
        )
        for kind, payload in payloads:
            for cell in (payload["cells"] if kind == "RunCreated" else []) + [payload.get("cell") or {}]:
                if cell.get("case") == victim:
                    cell["case"] = "ghost"

    rewrite(ranked, edit)
    with pytest.raises(TraceError, match=r"record \d+: case 'ghost' is not in the run's suite"):
        verify_run(ranked)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.pop("hits"), "hits None is not a count of at most k = 20"),
        (lambda p: p.update(hits="20"), "hits '20' is not a count"),
        (lambda p: p.update(hits=50), "hits 50 is not a count of at most k = 20"),
        (lambda p: p.update(trace=5), r"trace is not a \{file, digest, first_row, rows\} reference"),
        (lambda p: p["trace"].update(first_row=-1), r"trace is not a \{file, digest, first_row, rows\} reference"),
        (lambda p: p["trace"].update(rows=True), r"trace is not a \{file, digest, first_row, rows\} reference"),
        (lambda p: p.pop("metrics"), "metrics is not an object of numbers"),
        (lambda p: p["metrics"].update({"ndcg@10": True}), "metrics is not an object of numbers"),
    ],
    ids=["no hits", "hits text", "hits over k", "trace", "negative row", "bool rows", "no metrics", "bool metric"],
)
def test_a_malformed_record_is_refused_not_a_crash(ranked: Path, edit, message: str):
    rewrite(ranked, lambda p: edit(completed(p, answerable)))
    with pytest.raises(TraceError, match=rf"record \d+: {message}"):
        verify_run(ranked)


def test_a_trace_with_other_columns_is_refused(ranked: Path):
    def edit(payloads: Payloads) -> None:
        ref = completed(payloads)["trace"]
        path = ranked / ref["file"]
        pq.write_table(pq.read_table(path).drop_columns(["access_scopes"]), path)  # metadata kept
        for _, payload in payloads:
            if isinstance(payload.get("trace"), dict) and payload["trace"]["file"] == ref["file"]:
                payload["trace"]["digest"] = bytes_digest(path.read_bytes())

    rewrite(ranked, edit)
    with pytest.raises(TraceError, match="its columns are not the trace schema"):
        verify_run(ranked)


@pytest.mark.parametrize(
    ("citations", "message"),
    [
        ([{}], "the trace records no well-formed answer"),
        (5, "the trace records no well-formed answer"),
        (
            [{"label": "E1", "chunk_id": "sha256:" + "0" * 64, "document_id": FORBIDDEN}],
            "the recorded answer cites sources the trace does not show",
        ),
    ],
    ids=["empty citation", "not a list", "unshown source"],
)
def test_a_forged_answer_is_refused(answered: Path, citations, message: str):
    def edit(payloads: Payloads) -> None:
        retrace(answered, payloads, completed(payloads), lambda t: t, lambda m: m["answer"].update(citations=citations))

    rewrite(answered, edit)
    with pytest.raises(TraceError, match=message):
        verify_run(answered)
