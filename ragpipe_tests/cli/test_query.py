"""`ragpipe query` and `ragpipe answer` as a user runs them."""

from __future__ import annotations

import json

import pytest

from ragpipe.answer.answering import answer
from ragpipe_tests.cli.test_cli import ragpipe
from ragpipe_tests.support.llm_server import LLMServer

HIT_KEYS = {"rank", "chunk_id", "document_id", "title", "score", "text", "byte_start", "byte_end", "metadata", "pages"}
TRACE_KEYS = {"release_id", "channels", "depth", "collapse", "fusion", "authorization", "reranker", "timings_ms"}
SUBJECT_AUTHORIZATION_KEYS = {"view", "strategy", "policy_id", "subject"}


def test_query_json_shape_and_default_scope(scoped_bundles, tmp_path):
    out = ragpipe("query", "aspirin stroke", "--bundle", str(scoped_bundles[0]), "--k", "3", "--json", home=tmp_path)
    assert out.returncode == 0, out.stderr
    (line,) = out.stdout.strip().splitlines()
    data = json.loads(line)
    assert set(data) == {"plan_id", "bundle_id", "mode", "subject", "hits"}
    assert data["mode"] == "hybrid" and data["subject"] == {"principal": "cli", "scopes": ["public"]}
    assert [h["rank"] for h in data["hits"]] == [1, 2, 3]
    assert all(set(h) == HIT_KEYS for h in data["hits"])
    # public documents only (sec-twin has pub-twin's text). BM25 puts the twin ("aspirin" twice)
    # 1 % above pub-aspirin (1.777 vs 1.757) and the vector channel puts pub-aspirin first: over
    # the 4 public chunks' lexical window (two scores and two zeros) both stand ~1 standard
    # deviation up, so the vector channel decides (plain z-scoring over the two scores alone made
    # the 1 % gap ±1 and put the twin first; RRF tied them)
    assert [h["document_id"] for h in data["hits"]] == ["pub-aspirin", "pub-twin", "pub-statin"]


def test_query_trace_and_scopes(scoped_bundles, tmp_path):
    out = ragpipe(
        "query",
        "aspirin stroke",
        "--bundle",
        str(scoped_bundles[0]),
        "--scope",
        "staff",
        "--scope",
        "public",
        "--mode",
        "lexical",
        "--trace",
        "--json",
        home=tmp_path,
    )
    data = json.loads(out.stdout)
    assert data["subject"]["scopes"] == ["public", "staff"] and data["mode"] == "lexical"
    assert "staff-aspirin" in {h["document_id"] for h in data["hits"]}
    trace = data["trace"]
    assert set(trace) == TRACE_KEYS  # key names only; no timing value is asserted
    assert list(trace["channels"]) == ["lexical"]
    # the subject view: no count of the two secret documents the subject may not see
    assert set(trace["authorization"]) == SUBJECT_AUTHORIZATION_KEYS and trace["authorization"]["view"] == "subject"
    assert (
        trace["depth"]["channels"]["lexical"]["units"] == 100 and trace["depth"]["policy"]["kind"] == "settled_units/v1"
    )
    first = trace["fusion"]["items"][0]
    assert first["score"] == pytest.approx(sum(first["contributions"].values()))


def test_public_scope_trace_reveals_no_hidden_documents(scoped_bundles, tmp_path):
    """The issue's case: `--scope public --trace` used to report documents_hidden_by_prefilter and
    the audience's document count."""
    out = ragpipe(
        "query",
        "aspirin stroke",
        "--bundle",
        str(scoped_bundles[0]),
        "--scope",
        "public",
        "--trace",
        "--json",
        home=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    authorization = json.loads(out.stdout)["trace"]["authorization"]
    assert set(authorization) == SUBJECT_AUTHORIZATION_KEYS
    assert (authorization["view"], authorization["subject"]) == ("subject", {"principal": "cli", "scopes": ["public"]})
    for word in ("hidden", "total_documents", "lexical_statistics", "audience", '"index"', "sec-", "staff-"):
        assert word not in out.stdout, word


def test_cli_audit_view_is_explicit_and_shows_hidden_counts(scoped_bundles, tmp_path):
    out = ragpipe(
        "query",
        "aspirin stroke",
        "--bundle",
        str(scoped_bundles[0]),
        "--scope",
        "public",
        "--audit",
        "--json",
        home=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    authorization = json.loads(out.stdout)["trace"]["authorization"]
    assert (authorization["view"], authorization["documents_hidden_by_prefilter"]) == ("audit", 3)


def test_query_human_output(scoped_bundles, tmp_path):
    out = ragpipe("query", "aspirin stroke", "--bundle", str(scoped_bundles[0]), "--k", "2", home=tmp_path)
    assert out.returncode == 0
    assert "2 hits" in out.stdout and "Aspirin and stroke" in out.stdout and "pub-aspirin" in out.stdout


def test_answer_json_with_default_and_litellm_generators(scoped_bundles, tmp_path):
    out = ragpipe(
        "answer",
        "Does aspirin reduce the risk of a first stroke?",
        "--bundle",
        str(scoped_bundles[0]),
        "--json",
        home=tmp_path,
    )
    data = json.loads(out.stdout)
    assert {"answer", "abstained", "reason", "generator", "citations", "evidence"} <= set(data)
    assert data["generator"].startswith("extractive/v1") and data["citations"]
    with LLMServer() as server:
        server.replies["valid"] = json.dumps({"answer": "Yes [E1].", "citations": ["E1"], "abstained": False})
        out = ragpipe(
            "answer",
            "Does aspirin reduce stroke?",
            "--bundle",
            str(scoped_bundles[0]),
            "--model",
            "openai/local-test",
            "--api-base",
            server.api_base,
            "--json",
            home=tmp_path,
        )
    data = json.loads(out.stdout)
    assert (data["answer"], data["generator"], data["citations"][0]["label"]) == (
        "Yes [E1].",
        "litellm:openai/local-test",
        "E1",
    )


def test_query_errors_exit_nonzero(scoped_bundles, tmp_path, built_workspace):
    bad_plan = tmp_path / "plan.yaml"
    bad_plan.write_text("schema: ragpipe.query_plan/v1\nchannels:\n  lexical: {depth: 10, weight: -1}\n")
    out = ragpipe("query", "x", "--bundle", str(scoped_bundles[0]), "--plan", str(bad_plan), home=tmp_path)
    assert out.returncode == 1 and "channels.lexical.weight: Input should be greater than 0" in out.stderr
    out = ragpipe("query", "x", "--bundle", str(tmp_path), home=tmp_path)
    assert out.returncode == 1 and "failed verification" in out.stderr
    out = ragpipe("query", "x", "--bundle", str(scoped_bundles[0]), "--scope", "bad scope", home=tmp_path)
    assert out.returncode == 1 and "invalid scope name 'bad scope'" in out.stderr


def test_lexical_only_bundle(tmp_path, built_workspace):
    from ragpipe.spec import PipelineSpec
    from ragpipe_tests.support.builds import build_all_stages
    from ragpipe_tests.support.corpora import HANDBOOK, write_tree

    _, spec = built_workspace
    lex_spec = PipelineSpec.model_validate(
        {**spec.model_dump(by_alias=True), "vector_index": {"enabled": False, "metric": "cosine"}}
    )
    _, _, bundle = build_all_stages(
        tmp_path / "home", "lex", write_tree(tmp_path / "hb", HANDBOOK), "markdown", spec=lex_spec
    )
    out = ragpipe("query", "signing keys", "--bundle", str(bundle), "--scope", "staff", "--json", home=tmp_path)
    data = json.loads(out.stdout)
    assert data["mode"] == "lexical" and data["hits"][0]["document_id"] == "guide/ops.md"
    out = ragpipe("query", "signing keys", "--bundle", str(bundle), "--mode", "vector", home=tmp_path)
    assert out.returncode == 1 and "is lexical-only: mode 'vector' needs a vector index" in " ".join(out.stderr.split())


@pytest.mark.parametrize("mode", ["hybrid", "lexical", "vector"])
def test_whitespace_query_is_an_error_in_every_mode(scoped_bundles, tmp_path, mode):
    out = ragpipe("query", " \t ", "--bundle", str(scoped_bundles[0]), "--mode", mode, "--json", home=tmp_path)
    assert (out.returncode, out.stdout) == (1, "")
    assert "query text is empty (or only whitespace)" in out.stderr


# --- the Python API: empty queries, and what a trace may say -------------------------------------


@pytest.fixture(scope="module")
def full_and_public(scoped_bundles):
    from ragpipe.retrieval.retriever import Retriever

    full = Retriever(scoped_bundles[0])
    public = Retriever(scoped_bundles[1], embedder=full.embedder())
    yield full, public
    full.close()
    public.close()


@pytest.mark.parametrize("mode", ["hybrid", "lexical", "vector"])
def test_empty_or_whitespace_query_is_refused_in_every_mode(full_and_public, mode):
    from ragpipe.retrieval.retriever import QueryError

    full, _ = full_and_public
    for text in ("", " ", "\t\n", "\u3000\u2003"):  # ideographic and em spaces are whitespace too
        with pytest.raises(QueryError) as refused:
            full.query(text, mode=mode)
        assert str(refused.value) == "query text is empty (or only whitespace)"
        with pytest.raises(QueryError):
            answer(full, text, mode=mode)


@pytest.mark.parametrize("mode", ["hybrid", "lexical", "vector"])
@pytest.mark.parametrize("query", ["aspirin stroke", "secret aspirin stroke trial", "twin text"])
def test_a_subject_trace_is_the_same_whatever_the_bundle_hides(full_and_public, mode, query):
    """The public subject's trace on the bundle with 3 hidden documents equals its trace on a bundle
    holding only the public documents (timings aside): nothing in it depends on what is hidden."""
    full, public = full_and_public
    got = full.query(query, k=5, mode=mode, trace=True).trace
    expected = public.query(query, k=5, mode=mode, trace=True).trace
    del got["timings_ms"], expected["timings_ms"]
    assert got == expected
    assert got["authorization"]["view"] == "subject" and set(got["authorization"]) == SUBJECT_AUTHORIZATION_KEYS
    for text in (json.dumps(got), json.dumps(full.query(query, k=5, mode=mode).as_dict())):
        assert "sec-" not in text and "staff-" not in text


def test_the_audit_view_is_operator_only_and_shows_hidden_counts(full_and_public):
    full, public = full_and_public
    audit = full.query("aspirin stroke", k=5, mode="hybrid", audit=True)
    plain = full.query("aspirin stroke", k=5, mode="hybrid", trace=True)
    assert audit.hits == plain.hits
    authorization = audit.trace["authorization"]
    assert set(authorization) == SUBJECT_AUTHORIZATION_KEYS | {
        "documents_hidden_by_prefilter",
        "dropped_by_recheck",
        "lexical_statistics",
    }
    assert (
        authorization["view"],
        authorization["documents_hidden_by_prefilter"],
        authorization["dropped_by_recheck"],
    ) == ("audit", 3, 0)
    statistics = authorization["lexical_statistics"]
    assert (statistics["index"], statistics["documents"], statistics["total_documents"]) == ("audience", 4, 7)
    whole = public.query("aspirin stroke", k=5, mode="vector", audit=True).trace["authorization"]
    assert (whole["documents_hidden_by_prefilter"], whole["lexical_statistics"]) == (
        0,
        None,
    )  # vector mode: no lexical index used


def test_hits_of_a_backend_ignoring_the_prefilter_never_reach_fusion(scoped_bundles, monkeypatch):
    """Defence in depth: a vector backend that drops the scope prefilter (searches as if the
    subject saw everything) — its hidden hits are re-checked away before fusion and counted in
    the audit view only."""
    from dataclasses import replace

    from ragpipe.retrieval.retriever import Retriever

    r = Retriever(scoped_bundles[0])
    honest = r.query("secret aspirin stroke trial", k=5, mode="vector", audit=True)
    search = r.vector.search
    monkeypatch.setattr(
        r.vector,
        "search",
        lambda vector, k, where: search(vector, k, replace(where, scopes=("public", "secret", "staff"))),
    )
    leaky = r.query("secret aspirin stroke trial", k=5, mode="vector", audit=True)
    hidden = {"sec-aspirin", "sec-twin", "staff-aspirin"}
    # the leaky backend's top 8 rows (the public subject's row count) hold all 3 hidden documents
    assert (
        honest.trace["authorization"]["dropped_by_recheck"],
        leaky.trace["authorization"]["dropped_by_recheck"],
    ) == (0, 3)
    assert not {h["document_id"] for h in leaky.hits} & hidden and len(honest.hits) == 4
    assert not {e["document_id"] for e in leaky.trace["channels"]["vector"]} & hidden
    assert not {f["document_id"] for f in leaky.trace["fusion"]["items"]} & hidden
    r.close()


def test_query_filters_on_source_roles(built_workspace, tmp_path):
    from ragpipe_tests.support.release_fixtures import bundle_of

    bundle = str(bundle_of(built_workspace))
    args = ("query", "rotate the signing keys", "--bundle", bundle, "--scope", "public", "--scope", "staff", "--json")
    runbook = json.loads(ragpipe(*args, "--source-role", "runbook", home=tmp_path).stdout)
    both = json.loads(ragpipe(*args, "--source-role", "runbook", "--source-role", "primary", home=tmp_path).stdout)
    assert {h["document_id"] for h in runbook["hits"]} == {"guide/ops.md"} and runbook["source_roles"] == ["runbook"]
    assert both["source_roles"] == ["primary", "runbook"] and len(both["hits"]) > len(runbook["hits"])
    bad = ragpipe(*args, "--source-role", "no way", home=tmp_path)
    assert (bad.returncode, bad.stdout) == (1, "")
    assert bad.stderr == "error: invalid source role 'no way' (letters, digits, . _ : -)\n"


def test_query_where_filters_and_refuses_in_one_line(built_workspace, tmp_path):
    from ragpipe_tests.support.release_fixtures import bundle_of

    bundle = str(bundle_of(built_workspace))
    args = ("query", "rotate the signing keys", "--bundle", bundle, "--scope", "public", "--scope", "staff", "--json")
    runbook = json.loads(ragpipe(*args, "--where", 'source_role = "runbook"', home=tmp_path).stdout)
    others = json.loads(ragpipe(*args, "--where", 'source_role != "runbook"', home=tmp_path).stdout)
    assert {h["document_id"] for h in runbook["hits"]} == {"guide/ops.md"}
    assert runbook["filter"] == {"field": "source_role", "eq": "runbook"}
    assert others["hits"] and "guide/ops.md" not in {h["document_id"] for h in others["hits"]}
    unknown = ragpipe(*args, "--where", "year >= 2020", home=tmp_path)
    assert (unknown.returncode, unknown.stdout) == (1, "")
    assert unknown.stderr == "error: filter field 'year' is not in this corpus (known fields: source_role)\n"
    syntax = ragpipe(*args, "--where", "source_role = ", home=tmp_path)
    assert (syntax.returncode, syntax.stdout) == (1, "")
    assert syntax.stderr.startswith("error: --where column ") and syntax.stderr.count("\n") == 1


def test_a_scope_no_document_carries_is_warned_about_on_the_cli(built_workspace, tmp_path):
    from ragpipe_tests.support.release_fixtures import bundle_of

    bundle = str(bundle_of(built_workspace))
    typo = ragpipe("query", "signing keys", "--bundle", bundle, "--scope", "pubilc", "--json", home=tmp_path)
    assert typo.returncode == 0 and json.loads(typo.stdout)["hits"] == []
    # (stderr may also say which vector engine serves, on hosts where lancedb does)
    warnings = [line for line in typo.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: no document of bundle {json.loads(typo.stdout)['bundle_id'][:19]}… carries scope 'pubilc' "
        "(scopes in it: public, staff)"
    ]
    fine = ragpipe("query", "signing keys", "--bundle", bundle, "--scope", "public", "--json", home=tmp_path)
    assert fine.returncode == 0 and "warning:" not in fine.stderr


def test_an_approximate_plan_serves_lexical_queries_on_a_bundle_without_an_ann_index(scoped_bundles, tmp_path):
    """``--plan <approximate plan> --mode lexical`` on a bundle without an ANN index: served (a
    lexical query does not need the vector index), as by the checked-in plan; every mode that
    searches vectors — the plan's own hybrid included — is refused, exit 1, in one line."""
    from ragpipe.bundle.verify import open_bundle
    from ragpipe.retrieval.plan import DEFAULT_PLAN_PATH

    bundle = str(scoped_bundles[0])
    checked_in = DEFAULT_PLAN_PATH.read_text(encoding="utf-8")
    assert checked_in.count("  kind: exact\n  scores:") == 1
    plan = tmp_path / "approximate.yaml"
    plan.write_text(checked_in.replace("  kind: exact\n  scores:", "  kind: approximate\n  scores:"), encoding="utf-8")
    args = ("query", "aspirin stroke", "--bundle", bundle, "--k", "3")
    served = ragpipe(*args, "--plan", str(plan), "--mode", "lexical", "--json", home=tmp_path)
    assert served.returncode == 0, served.stderr
    data = json.loads(served.stdout)
    assert data["mode"] == "lexical" and "approximate" not in data and data["hits"]
    exact = json.loads(ragpipe(*args, "--mode", "lexical", "--json", home=tmp_path).stdout)
    assert [(h["chunk_id"], h["score"]) for h in data["hits"]] == [(h["chunk_id"], h["score"]) for h in exact["hits"]]
    human = ragpipe(*args, "--plan", str(plan), "--mode", "lexical", home=tmp_path)
    assert human.returncode == 0, human.stderr
    assert f"{len(data['hits'])} hits · mode lexical" in human.stdout and "approximate" not in human.stdout
    answered = ragpipe(
        "answer", "Does aspirin reduce stroke?", "--bundle", bundle, "--plan", str(plan), "--mode", "lexical",
        "--json", home=tmp_path,
    )  # fmt: skip
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["citations"]
    refusal = (
        "error: the query plan asks for approximate vector search (vector_search.kind: approximate), but bundle "
        f"{open_bundle(scoped_bundles[0]).bundle_id} has no ANN index (its vector-index spec declares no ann)"
    )
    for mode in ((), ("--mode", "hybrid"), ("--mode", "vector")):
        out = ragpipe(*args, "--plan", str(plan), *mode, "--json", home=tmp_path)
        assert (out.returncode, out.stdout, " ".join(out.stderr.split())) == (1, "", refusal)
