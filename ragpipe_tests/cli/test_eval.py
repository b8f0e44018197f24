"""``ragpipe suite …`` and ``ragpipe eval …`` as a user runs them (``python -m ragpipe.cli``)."""

from __future__ import annotations

import json

import pytest

from ragpipe.evaluation.suite_load import load_suite
from ragpipe_tests.support.eval_support import EVALUABLE, SUITE_CASES, cli, eval_bundle  # noqa: F401
from ragpipe_tests.support.paths import SAMPLE

RESULT_KEYS = {
    "run_id",
    "spec_id",
    "suite_digest",
    "bundle_id",
    "plan_id",
    "cases",
    "evaluated",
    "skipped",
    "failed",
    "metrics",
    "latency_ms",
    "ledger_head",
    "out",
    "schema",
    "mode",
    "status",
    "cells",
    "tags",
    "provisional",
}
METRICS = [
    "ndcg@10",
    "recall@100",
    "mrr@10",
    "precision@10",
    "hit@10",
    "relevant_recall@10",
    "unauthorized_disclosures",
]


@pytest.fixture(scope="module")
def cli_run(eval_bundle, tmp_path_factory):  # noqa: F811
    bundle, suite = eval_bundle
    home = tmp_path_factory.mktemp("evalcli")
    out = home / "run"
    done = cli(
        "eval", "--suite", str(suite), "--bundle", str(bundle), "--k", "40", "--out", str(out), "--json", home=home
    )
    assert done.returncode == 0, done.stderr
    return home, out, json.loads(done.stdout), bundle, suite


def test_eval_json_object(cli_run):
    _, out, data, _, _ = cli_run
    assert set(data) == RESULT_KEYS and data["out"] == str(out)
    assert sorted(data["metrics"]) == sorted(METRICS)  # (--json sorts keys; report.md keeps the spec order)
    assert (
        data["metrics"]["ndcg@10"]["direction"] == "higher"
        and data["metrics"]["ndcg@10"]["unit"] == "ratio"
        and data["metrics"]["ndcg@10"]["k"] == 10
    )
    assert data["metrics"]["unauthorized_disclosures"] == {
        **data["metrics"]["unauthorized_disclosures"],
        "direction": "lower",
        "unit": "count",
        "k": None,
    }
    assert set(data["metrics"]["ndcg@10"]) == {"value", "direction", "unit", "k", "n"}
    assert (data["cases"], data["evaluated"], len(data["skipped"]), data["failed"]) == (
        SUITE_CASES,
        EVALUABLE,
        SUITE_CASES - EVALUABLE,
        [],
    )
    assert set(data["latency_ms"]) == {"p50", "p95", "n"} and data["latency_ms"]["n"] == EVALUABLE
    assert data["skipped"][0] == {"case_id": "1", "reason": "missing_judged_targets", "missing": ["31715818"]}
    assert data["provisional"] == {"count": 0, "cases": []}


def test_report_is_rebuilt_byte_identically(cli_run):
    home, out, data, _, _ = cli_run
    written = (out / "report.json").read_bytes(), (out / "report.md").read_bytes()
    first = cli("eval", "report", str(out), "--json", home=home)
    (out / "report.md").unlink()
    second = cli("eval", "report", str(out), home=home)
    assert first.returncode == second.returncode == 0
    assert first.stdout.encode() == written[0] and second.stdout.encode() == written[1]
    assert ((out / "report.json").read_bytes(), (out / "report.md").read_bytes()) == written
    assert json.loads(first.stdout) == {k: v for k, v in data.items() if k != "out"}
    assert "| tag | cases | " + " | ".join(METRICS) + " |" in second.stdout


def test_eval_sql_views(cli_run):
    home, out, _, _, _ = cli_run
    done = cli(
        "eval",
        "sql",
        str(out),
        "SELECT count(*) AS n, count(DISTINCT case_id) AS cases FROM cells WHERE status = 'success'",
        "--json",
        home=home,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"columns": ["n", "cases"], "rows": [[EVALUABLE, EVALUABLE]]}
    done = cli(
        "eval",
        "sql",
        str(out),
        "SELECT stage, count(*) FROM hits GROUP BY stage ORDER BY stage",
        "--json",
        home=home,
    )
    rows = json.loads(done.stdout)["rows"]  # no reranker: no fused rows; nothing collapsed is stored
    assert rows[1] == ["final", 40 * EVALUABLE] and rows[0][0] == "channel" and len(rows) == 2
    done = cli(
        "eval",
        "sql",
        str(out),
        "SELECT metric, count(*), min(direction) FROM metrics GROUP BY metric ORDER BY metric",
        home=home,
    )
    lines = done.stdout.splitlines()
    assert lines[0] == "metric\tcount_star()\tmin(direction)" and f"ndcg@10\t{EVALUABLE - 1}\thigher" in lines
    assert f"unauthorized_disclosures\t{EVALUABLE}\tlower" in lines


def test_eval_sql_verifies_the_run_first(cli_run, tmp_path):
    """A copy whose first trace lost a byte, and one whose first cell claims another nDCG with
    the chain recomputed: both refused before any SQL runs, exit 1, nothing on stdout."""
    import shutil

    from ragpipe.evaluation.ledger import DOMAIN, HEAD, LEDGER, encode, read_ledger
    from ragpipe.kernel.canonical import canonical_bytes

    home, out, _, _, _ = cli_run
    cut = shutil.copytree(out, tmp_path / "cut")
    trace = next(r for r in read_ledger(cut).records if r.kind == "CellCompleted").payload["trace"]["file"]
    (cut / trace).write_bytes((cut / trace).read_bytes()[:-1])
    claimed = shutil.copytree(out, tmp_path / "claimed")
    records = read_ledger(claimed).records
    data, prev = b"", None
    for r in records:
        payload = dict(r.payload)
        if r.kind == "CellCompleted" and r.seq == next(x.seq for x in records if x.kind == "CellCompleted"):
            payload["metrics"] = {**payload["metrics"], "ndcg@10": 0.5}
        record = DOMAIN.make_record(r.seq, r.kind, payload, prev)
        data, prev = data + encode(record), record.hash
    (claimed / LEDGER).write_bytes(data)
    (claimed / HEAD).write_bytes(canonical_bytes({"hash": prev, "seq": len(records)}) + b"\n")
    for run, message in (
        (cut, f"{cut / trace} does not match the digest in the ledger"),
        (claimed, "the trace's metadata differs from the record"),
    ):
        done = cli("eval", "sql", str(run), "SELECT count(*) FROM cells", home=home)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert message in " ".join(done.stderr.split())


def test_suite_import_and_validate(cli_run, tmp_path):
    home, _, _, bundle, _ = cli_run
    target = tmp_path / "suite.jsonl"
    done = cli(
        "suite",
        "import",
        "beir",
        str(SAMPLE),
        "--split",
        "rev-1",
        "--split",
        "rev-2",
        "--out",
        str(target),
        "--json",
        home=home,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data == {"cases": 104, "suite_digest": load_suite(SAMPLE / "suite.jsonl").digest, "out": str(target)}
    assert target.read_bytes() == (SAMPLE / "suite.jsonl").read_bytes()
    done = cli("suite", "validate", str(target), "--bundle", str(bundle), "--json", home=home)
    data = json.loads(done.stdout)
    assert (data["valid"], data["cases"], data["evaluable"], len(data["skipped"])) == (True, 104, 36, 68)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("eval",), "give --suite SUITE (with --bundle or --revision), or --resume RUNDIR"),
        (("eval", "--suite", "{suite}"), "give exactly one of --bundle PATH or --revision KEY"),
        (
            ("eval", "--suite", "{suite}", "--bundle", "{bundle}", "--revision", "r1"),
            "give exactly one of --bundle PATH or --revision KEY",
        ),
        (("eval", "--suite", "{suite}", "--revision", "../x"), "invalid revision key"),
        (
            ("eval", "--resume", "{run}", "--suite", "{suite}"),
            "--resume takes only the run folder: the spec comes from its ledger",
        ),
        (("eval", "--resume", "{tmp}"), "{tmp}/ledger.jsonl: record 1: no ledger file (not an evaluation run folder)"),
        (
            ("eval", "--suite", "{suite}", "--bundle", "{bundle}", "--out", "{run}"),
            "{run}: already exists (a run folder is created once; use --resume to continue it)",
        ),
        (
            ("eval", "--suite", "{suite}", "--bundle", "{bundle}", "--cutoff", "ndcg"),
            "--cutoff 'ndcg': expected FAMILY=K, e.g. ndcg=20",
        ),
        (("eval", "--suite", "{suite}", "--bundle", "{bundle}", "--cutoff", "foo=3"), "unknown metric family 'foo'"),
        (
            ("eval", "--suite", "{tmp}/missing.jsonl", "--bundle", "{bundle}"),
            "{tmp}/missing.jsonl: cannot read suite: No such file or directory",
        ),
        (("eval", "--suite", "{bad}", "--bundle", "{bundle}"), "{bad}:2: duplicate case id 'a' (first on line 1)"),
        (("suite", "validate", "{bad}"), "{bad}:2: duplicate case id 'a' (first on line 1)"),
        (
            ("suite", "import", "beir", "{bad}", "--out", "{tmp}/o.jsonl"),
            "{bad}: not a BEIR folder (expected a directory)",
        ),
        (("eval", "sql", "{run}", "SELECT nope FROM cells"), "SQL error: Binder Error"),
        (("eval", "report", "{tmp}"), "{tmp}/ledger.jsonl: record 1: no ledger file (not an evaluation run folder)"),
    ],
)
def test_bad_input_exits_1_with_a_clear_message(cli_run, tmp_path, args, message):
    home, out, _, bundle, suite = cli_run
    bad = tmp_path / "bad.jsonl"
    line = json.dumps({"id": "a", "query": "q", "target_level": "document", "judgments": {"d": 1}})
    bad.write_text(line + "\n" + line + "\n", encoding="utf-8")
    fill = {"suite": str(suite), "bundle": str(bundle), "run": str(out), "tmp": str(tmp_path), "bad": str(bad)}
    done = cli(*(a.format(**fill) for a in args), home=home)
    assert done.returncode == 1, (done.stdout, done.stderr)
    # the message is the last thing on stderr (lancedb may log a deprecation warning before it)
    error = " ".join(done.stderr[done.stderr.index("error: ") :].split())
    assert error.startswith("error: " + message.format(**fill)), done.stderr
    assert done.stdout == ""


def test_a_suite_with_no_evaluable_case_exits_1_and_creates_no_run(cli_run, tmp_path):
    home, _, _, bundle, _ = cli_run
    suite = tmp_path / "absent.jsonl"
    rows = [{"id": f"c{i}", "query": "q", "target_level": "document", "judgments": {f"gone-{i}": 1}} for i in (1, 2)]
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    done = cli("eval", "--suite", str(suite), "--bundle", str(bundle), "--out", str(out), home=home)
    assert (done.returncode, done.stdout) == (1, "")
    error = " ".join(done.stderr[done.stderr.index("error: ") :].split())
    bundle_id = json.loads((bundle / "manifest.json").read_text())["bundle_id"]
    assert error == (
        f"error: {suite}: no evaluable case against bundle {bundle_id}: all 2 suite cases judge documents this revision lacks"
    )
    assert not out.exists()


def test_suite_validate_lists_provisional_cases(tmp_path):
    """A model's draft not yet adjudicated is counted and named, in text and in JSON."""
    target = tmp_path / "suite.jsonl"
    draft = {
        "id": "draft-2",
        "query": "what is y?",
        "target_level": "document",
        "expected": ["d2"],
        "provenance": {
            "author": "model",
            "by": "m",
            "model_spec_id": "sha256:" + "5" * 64,
            "at": "2026-12-07T21:08:01Z",
        },
        "review": "provisional",
    }
    person = {"id": "q1", "query": "what is x?", "target_level": "document", "judgments": {"d1": 1}}
    target.write_text(json.dumps(person) + "\n" + json.dumps(draft) + "\n", encoding="utf-8")
    done = cli("suite", "validate", str(target), "--json", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["provisional"] == ["draft-2"]
    done = cli("suite", "validate", str(target), home=tmp_path)
    assert done.stdout.splitlines()[-1] == "1 provisional (not yet adjudicated): draft-2"


def test_a_judged_runs_labels_print_per_cell_then_per_case_then_the_agreement(capsys):
    """``ragpipe eval``'s answer-quality lines, on a report's ``answer_quality`` as
    ``report_quality`` builds it: two repeats whose verdicts disagree, so the per-case line shows."""
    from ragpipe.cli.eval import print_answer_quality
    from ragpipe.evaluation.report_quality import agreement, label_counts

    def judged(label: int) -> dict:
        return {"metrics": {"answer_label": float(label)}, "judge_outcome": "judged"}

    cells = [("a", judged(2)), ("a", judged(3)), ("b", judged(0)), ("b", {"metrics": {}, "judge_outcome": "refused"})]
    quality = {
        **label_counts(cells, ["a", "b"]),
        "judged": 3,
        "failures": {"provider": 0, "invalid_output": 0, "refused": 1, "withheld": 0},
        "agreement": agreement(cells, {"a": "2_SUBSTANTIAL", "b": "2_SUBSTANTIAL"}),
    }
    print_answer_quality(quality)
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert printed == (
        "answer labels: 0_FAIL 1 · 1_PARTIAL 0 · 2_SUBSTANTIAL 1 · 3_AUTHORITATIVE 1 (3 judged, 0 abstentions "
        "0_FAIL by rule; judge failures: refused 1) "
        "answer labels per case (a case weighs 1, shared by its repeats): 0_FAIL 1 · 1_PARTIAL 0 · "
        "2_SUBSTANTIAL 0.5 · 3_AUTHORITATIVE 0.5 "
        "agreement with reference labels: 3 judged answers of 2 cases · exact 0.333 · within one 0.667 · "
        "2+ apart: b · not compared: 1 judge failures, 0 abstentions by rule"
    )
