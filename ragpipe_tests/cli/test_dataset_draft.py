"""``ragpipe dataset draft`` as a user runs it: a model (the real local OpenAI-protocol server)
drafts cases from a real bundle's chunks; the valid ones join the dataset as provisional drafts,
pending adjudication, and a draft leaking into another split is excluded with its reason."""

from __future__ import annotations

import json
from pathlib import Path

from ragpipe.bundle.verify import open_bundle
from ragpipe.evaluation.datasets import read_dataset
from ragpipe.evaluation.draft_spec import DEFAULT_DRAFT_SPEC, load_draft_spec
from ragpipe.evaluation.drafting import bundle_corpus, draft_case_id
from ragpipe.evaluation.suite import Case, Suite, write_suite
from ragpipe.evaluation.suite_load import load_suite
from ragpipe_tests.cli.test_dataset import REPO, env, ok, refused, run  # noqa: F401
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401
from ragpipe_tests.support.llm_server import LLMServer, draft_reply, words

PROMPT = DEFAULT_DRAFT_SPEC.parent / "prompts" / "case_draft.txt"


def _spec_file(tmp_path: Path, server: LLMServer, model: str = "openai/draft-test") -> Path:
    path = tmp_path / "draft.yaml"
    path.write_text(
        f"schema: ragpipe.case_draft_spec/v1\nmodel: {model}\napi_base: {server.api_base}\n"
        f"timeout_seconds: 5\nprompt: {PROMPT}\nn: 2\nmax_facts: 2\n",
        encoding="utf-8",
    )
    return path


def _priced(base: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """One micro per input word and two per output word (the server counts words as tokens)."""
    prices = tmp_path / "prices.yaml"
    prices.write_text(
        "schema: ragpipe.prices/v1\nmodels:\n  openai/draft-test: {input: 1000000, output: 2000000}\n", encoding="utf-8"
    )
    return {**base, "RAGPIPE_PRICES": str(prices)}


def test_drafts_join_the_dataset_pending_and_provisional_and_a_leak_is_excluded(env, eval_bundle, tmp_path):  # noqa: F811
    bundle, _ = eval_bundle
    env = _priced(env, tmp_path)
    ok(env, "create", "drafts", "--target", "production", "--split", "dev=0.5", "--split", "holdout=0.5")
    state, _ = read_dataset(Path(env["RAGPIPE_HOME"]), "drafts")
    chosen = bundle_corpus(open_bundle(bundle).tables).select(2, 5)
    with LLMServer() as server:
        server.scenario, server.responder = "responder", draft_reply
        spec_path = _spec_file(tmp_path, server)
        spec = load_draft_spec(spec_path)
        ids = [draft_case_id(spec.spec_id, c.chunk_id, i) for c in chosen for i in (0, 1)]
        # a person's case asking what the first draft will ask, in the other split
        leaked = ids[0]
        other = next(f"old-{i}" for i in range(100) if state.split(f"old-{i}") != state.split(leaked))
        question = f"What is reported about {' '.join(chosen[0].text.split()[:8]).rstrip('.,;:')}?"
        existing = Case(id=other, query=question, target_level="document", expected=[chosen[0].document_id])
        write_suite(Suite.of([existing], "people"), tmp_path / "people.jsonl")
        ok(env, "add", "drafts", str(tmp_path / "people.jsonl"))

        args = ("draft", "drafts", "--bundle", str(bundle), "--spec", str(spec_path), "--chunks", "2", "--seed", "5")
        out = tmp_path / "drafted.jsonl"
        first = ok(env, *args, "--out", str(out), "--json")
        assert len(server.requests) == 2
        cost = sum(sum(words(m["content"]) for m in r["messages"]) + 2 * words(draft_reply(r)) for r in server.requests)
        again = ok(env, *args, "--json")
        assert len(server.requests) == 2  # every chunk's drafts come from the cache

    assert first == {
        "dataset": "drafts",
        "bundle_id": open_bundle(bundle).bundle_id,
        "spec_id": spec.spec_id,
        "chunks": 2,
        "outcomes": {"drafted": 2, "invalid_output": 0, "refused": 0, "provider": 0, "withheld": 0},
        "cache_hits": 0,
        "failures": [],
        "drafts": 4,
        "added": 3,
        "case_ids": ids[1:],
        "excluded": [
            {
                "case_id": leaked,
                "reason": "leakage",
                "message": f"duplicate of case {other} ({state.split(other)}) in another split ({state.split(leaked)})",
            }
        ],
        "cost_micros": cost,
        "out": str(out),
    }
    assert [c.id for c in load_suite(out).cases] == sorted(ids[1:])
    assert all(c.provisional and c.provenance.model_spec_id == spec.spec_id for c in load_suite(out).cases)
    assert (again["cache_hits"], again["added"], again["cost_micros"], again["out"]) == (2, 0, 0, None)
    assert [(e["case_id"], e["reason"]) for e in again["excluded"]] == [(i, "already_in_dataset") for i in ids[1:]] + [
        (leaked, "leakage")
    ]

    shown = ok(env, "show", "drafts", "--json")
    assert shown["counts"] == {"pending": 4, "accepted": 0, "rejected": 0, "unverified": 0}
    drafted = {c["id"]: c for c in shown["cases"] if c["id"].startswith("draft-")}
    assert sorted(drafted) == sorted(ids[1:])
    assert all(c["status"] == "pending" and c["provisional"] for c in drafted.values())
    text = ok(env, "show", "drafts")
    assert sum(line.endswith("(provisional draft)") for line in text.splitlines()) == 3


def test_the_human_summary_lists_each_outcome_and_exclusion_on_one_line(env, eval_bundle, tmp_path):  # noqa: F811
    bundle, _ = eval_bundle
    ok(env, "create", "one", "--target", "production", "--split", "all=1")
    chunk = bundle_corpus(open_bundle(bundle).tables).select(1, 0)[0]
    with LLMServer() as server:
        server.scenario, server.responder = "responder", draft_reply
        server.faults.append("refusal")
        spec_path = _spec_file(tmp_path, server)
        base = ("draft", "one", "--bundle", str(bundle), "--spec", str(spec_path), "--documents", chunk.document_id)
        text = ok(env, *base)
    chunks = [
        c for c in bundle_corpus(open_bundle(bundle).tables).chunks.values() if c.document_id == chunk.document_id
    ]
    lines = text.splitlines()
    assert lines[0] == (
        f"{len(chunks)} chunks: {len(chunks) - 1} drafted, 0 invalid_output, 1 refused, 0 provider, 0 withheld "
        "(0 from the cache)"
    )
    assert lines[1].startswith("  refused sha256:") and lines[1].endswith(
        ": the model refused: I can't help with judging this."
    )
    assert lines[2].startswith(f"{2 * (len(chunks) - 1) - len(lines[3:])} drafts added to one, pending adjudication")
    assert all(line.startswith("  excluded draft-") for line in lines[3:])


def test_a_chunk_kept_from_the_endpoint_is_withheld_and_nothing_is_sent(env, eval_bundle, tmp_path):  # noqa: F811
    bundle, _ = eval_bundle
    ok(env, "create", "w", "--target", "production", "--split", "all=1")
    with LLMServer() as server:
        server.scenario, server.responder = "responder", draft_reply
        # the pipeline spec's disclosure: this endpoint may receive only staff text (the bundle's is public)
        default = (REPO / "ragpipe/specs/pipeline.yaml").read_text(encoding="utf-8")
        pipeline = tmp_path / "pipeline.yaml"
        pipeline.write_text(
            default.replace("../../data/", f"{REPO}/data/")
            + f"disclosure:\n  endpoints:\n    {server.api_base}: [staff]\n",
            encoding="utf-8",
        )
        args = ("draft", "w", "--bundle", str(bundle), "--spec", str(_spec_file(tmp_path, server)), "--chunks", "2")
        done = ok({**env, "RAGPIPE_PIPELINE_SPEC": str(pipeline)}, *args, "--json")
        assert server.connections == 0
    assert (done["outcomes"]["withheld"], done["added"], done["cost_micros"]) == (2, 0, 0)
    assert all(f["status"] == "withheld" and f["message"].endswith("(it may receive staff)") for f in done["failures"])


def test_each_mistake_is_one_line_and_sends_nothing(env, eval_bundle, tmp_path):  # noqa: F811
    bundle, _ = eval_bundle
    with LLMServer() as server:
        spec_path = _spec_file(tmp_path, server, model="openai/unpriced")
        base = ("draft", "d", "--bundle", str(bundle), "--spec", str(spec_path))
        missing = refused(env, *base)
        assert missing.startswith("error: ") and missing.count("\n") == 1 and "'d'" in missing
        ok(env, "create", "d", "--target", "production", "--split", "all=1")
        assert refused(env, *base, "--chunks", "1", "--documents", "x") == (
            "error: give at most one of --chunks N and --documents ID\n"
        )
        assert refused(env, *base, "--documents", "nope") == "error: --documents: document nope is not in the bundle\n"
        assert refused(env, *base, "--level", "page") == "error: --level must be document or chunk, not 'page'\n"
        unpriced = refused(env, *base, "--chunks", "1", "--budget-micros", "10")
        assert unpriced == (
            "error: case-draft: a budget is set but the cost of a call is unknown (the model has no price in the "
            "price table, ragpipe/specs/prices.yaml or $RAGPIPE_PRICES)\n"
        )
        bad = tmp_path / "bad.yaml"
        bad.write_text(f"model: openai/x\nprompt: {PROMPT}\nmax_facts: 9\n", encoding="utf-8")
        assert refused(env, "draft", "d", "--bundle", str(bundle), "--spec", str(bad)) == (
            f"error: {bad}: invalid case-draft spec: max_facts: Input should be less than or equal to 8\n"
        )
        assert server.connections == 0
    proc = run(env, *base, "--json", "--documents", "nope")
    assert (proc.returncode, proc.stdout, proc.stderr.count("\n")) == (1, "", 1)
    assert ok(env, "show", "d", "--json")["cases"] == []  # nothing was added


def test_chunks_the_model_could_not_be_reached_for_make_the_command_fail(env, eval_bundle, tmp_path):  # noqa: F811
    """Two chunks, the first call a server error (no retry left): the other chunk's drafts are
    added, and the command ends with 1 and one line saying how to finish."""
    bundle, _ = eval_bundle
    ok(env, "create", "drafts", "--target", "production", "--split", "all=1")
    with LLMServer() as server:
        server.scenario, server.responder = "responder", draft_reply
        server.faults.extend(["500"] * 4)  # every attempt of the first call
        spec_path = _spec_file(tmp_path, server)
        args = ("draft", "drafts", "--bundle", str(bundle), "--spec", str(spec_path), "--chunks", "2", "--json")
        proc = run(env, *args)
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert (data["outcomes"]["provider"], data["outcomes"]["drafted"], data["added"]) == (1, 1, 2)
    assert proc.stderr == (
        "error: 1 of 2 chunks failed at the provider (what was drafted is cached and added): "
        "run the same command again to draft the rest\n"
    )
