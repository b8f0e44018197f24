"""Recovery of a real run's ledger: a cut at every byte offset, a flipped byte in every record."""

from __future__ import annotations

import shutil

import pytest

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import HEAD, LEDGER, Ledger, LedgerError, encode, read_ledger, reduce_records
from ragpipe.evaluation.runner import resume_evaluation, run_evaluation
from ragpipe.evaluation.suite import Suite, check_against_bundle
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def small_run(eval_bundle, tmp_path_factory):  # noqa: F811
    """A real run: 4 evaluable cases and 2 skipped ones, through the real retriever."""
    bundle, suite_path = eval_bundle
    full = load_suite(suite_path)
    retriever = Retriever(bundle, plan=load_plan())
    status = {
        s.case_id: s.evaluable for s in check_against_bundle(full, retriever.scopes.keys(), retriever.chunks.keys())
    }
    cases = [c for c in full.cases if status[c.id]][:4] + [c for c in full.cases if not status[c.id]][:2]
    spec = EvaluationSpec.build(Suite.of(cases, "subset"), load_plan(), bundle, retriever.bundle_id, k=20)
    out = tmp_path_factory.mktemp("recovery") / "run"
    run_evaluation(spec, out, retriever_factory=lambda _: retriever)
    return out, retriever


def record_starts(data: bytes) -> list[int]:
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos = data.index(b"\n", pos) + 1
    return starts


def test_cut_at_every_byte_offset(small_run, tmp_path):
    run, _ = small_run
    data = (run / LEDGER).read_bytes()
    full = read_ledger(run)
    n = len(full.records)
    assert [r.kind for r in full.records][:6] == [
        "RunCreated",
        "InputBound",
        "InputBound",
        "InputBound",
        "InputBound",
        "CellStarted",
    ]
    assert n == 1 + 4 + 2 * 4 + 1
    last_start = record_starts(data)[-1]
    folder = tmp_path / "cut"
    folder.mkdir()
    shutil.copy(run / HEAD, folder / HEAD)
    prefix_state = reduce_records(full.records[:-1])
    for offset in range(len(data) + 1):
        (folder / LEDGER).write_bytes(data[:offset])
        if offset == len(data):
            assert read_ledger(folder).records == full.records
        elif offset > last_start:  # the cut falls inside the final record: the longest valid prefix
            read = read_ledger(folder)
            assert (read.records, read.dropped_bytes) == (full.records[:-1], offset - last_start), offset
            assert reduce_records(read.records) == prefix_state
        else:  # a complete record went missing: refused, naming the record the cut falls in
            complete = sum(1 for s in record_starts(data)[1:] if s <= offset)
            with pytest.raises(LedgerError) as info:
                read_ledger(folder)
            assert (
                str(info.value)
                == f"{folder / LEDGER}: record {complete + 1}: missing (the ledger ends at record {complete}; ledger.head names record {n})"
            ), offset


def test_flipped_byte_in_every_record(small_run, tmp_path):
    run, _ = small_run
    data = (run / LEDGER).read_bytes()
    starts = record_starts(data) + [len(data)]
    folder = tmp_path / "flip"
    folder.mkdir()
    shutil.copy(run / HEAD, folder / HEAD)
    n = len(starts) - 1
    full = read_ledger(run).records
    for number in range(1, n + 1):
        for offset in range(starts[number - 1], starts[number]):
            damaged = bytearray(data)
            damaged[offset] ^= 0x01
            (folder / LEDGER).write_bytes(bytes(damaged))
            if number < n:
                with pytest.raises(LedgerError, match=rf"^{folder / LEDGER}: record {number}: "):
                    read_ledger(folder)
            else:  # the final record: refused with its number, or dropped as a torn line
                try:
                    read = read_ledger(folder)
                except LedgerError as exc:
                    assert str(exc).startswith(f"{folder / LEDGER}: record {n}: "), (offset, str(exc))
                else:
                    assert read.records == full[:-1] and read.dropped_bytes == starts[n] - starts[n - 1], offset


def test_open_truncates_only_the_torn_tail_and_resume_finishes(small_run, tmp_path):
    run, retriever = small_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    data = (copy / LEDGER).read_bytes()
    records = read_ledger(copy).records
    # A crash inside the group commit's closing write: its first closing record complete, half of
    # the second's line, the head still on the last CellStarted (records 6-9 start, 10-13 close).
    assert [r.kind for r in records[5:13]] == ["CellStarted"] * 4 + ["CellCompleted"] * 4
    keep = sum(len(encode(r)) for r in records[:10])
    torn = encode(records[10])[:40]
    (copy / LEDGER).write_bytes(data[:keep] + torn)
    (copy / HEAD).write_bytes(canonical_bytes({"hash": records[8].hash, "seq": 9}) + b"\n")
    for name in ("report.json", "report.md"):
        (copy / name).unlink()
    with Ledger.open(copy) as ledger:
        assert len(ledger.records) == 10 and (copy / LEDGER).read_bytes() == data[:keep]
        assert len(ledger.state.terminal) == 1  # the first cell is closed, the other three run again
    result = resume_evaluation(copy, retriever_factory=lambda _: retriever)
    again = reduce_records(read_ledger(copy).records)
    assert again.status == "completed" and again.starts[again.expected[0]] == 1
    assert [again.starts[k] for k in again.expected[1:]] == [2, 2, 2]
    original = reduce_records(records)
    assert {k: p["metrics"] for k, p in again.terminal.items()} == {
        k: p["metrics"] for k, p in original.terminal.items()
    }
    assert result.report["metrics"] == resume_evaluation(run, retriever_factory=lambda _: retriever).report["metrics"]
