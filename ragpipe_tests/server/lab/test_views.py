"""The lab's pages over HTTP, against the server ``ragpipe serve`` runs over a real home (three
verified runs of two real bundles): who may open them, what each returns, what it refuses."""

from __future__ import annotations

import re

import httpx
import pytest

from ragpipe.server.lab.login import COOKIE
from ragpipe.server.lab.views import SECURITY_HEADERS
from ragpipe_tests.support.lab_state import STAFF_DOCUMENT, XSS_QUERY, XSS_TEXT, XSS_TITLE, LabState

CSP = "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"


def login(base: str, key: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=60)
    response = client.post("/lab/login", data={"key": key})
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/lab/runs"
    return client


def csrf_of(client: httpx.Client) -> str:
    (token,) = re.findall(r'name="csrf" value="([^"]+)"', client.get("/lab/runs").text)
    return token


@pytest.fixture(scope="module")
def public(lab_url: str, lab_state: LabState):
    client = login(lab_url, lab_state.keys["rev-public"])
    yield client
    client.close()


@pytest.fixture(scope="module")
def staff(lab_url: str, lab_state: LabState):
    client = login(lab_url, lab_state.keys["rev-staff"])
    yield client
    client.close()


def test_login_sets_a_strict_http_only_cookie_scoped_to_the_lab(lab_url: str, lab_state: LabState):
    with httpx.Client(base_url=lab_url) as client:
        response = client.post("/lab/login", data={"key": lab_state.keys["rev-public"]})
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/lab" in cookie
    assert "Max-Age=28800" in cookie


def test_without_a_session_every_page_redirects_to_the_login_form(lab_url: str, lab_state: LabState):
    run = lab_state.runs["a1"]
    with httpx.Client(base_url=lab_url) as client:
        for path in ("/lab/runs", f"/lab/runs/{run}", f"/lab/runs/{run}/cases/goals/0", "/lab/compare", "/lab/corpus"):
            response = client.get(path)
            assert (response.status_code, response.headers["location"]) == (303, "/lab/login"), path
        form = client.get("/lab/login")
    assert form.status_code == 200
    assert '<label for="key">API key</label>' in form.text


def test_an_unknown_key_is_refused_on_the_form(lab_url: str, lab_state: LabState):
    forged = lab_state.keys["rev-public"][:-4] + "AAAA"
    with httpx.Client(base_url=lab_url) as client:
        response = client.post("/lab/login", data={"key": forged})
    assert response.status_code == 401
    assert "set-cookie" not in response.headers
    assert 'role="alert">unknown API key</p>' in response.text


def test_a_key_without_the_reviewer_role_gets_403(lab_url: str, lab_state: LabState):
    with httpx.Client(base_url=lab_url) as client:
        response = client.post("/lab/login", data={"key": lab_state.keys["plain"]})
        assert response.status_code == 403
        assert "set-cookie" not in response.headers
        assert "key of &#39;pat&#39; has no reviewer role: the lab is for reviewers (docs/lab.md)" in response.text
        # nor does the key open the pages as an API key would
        page = client.get("/lab/runs", headers={"Authorization": f"Bearer {lab_state.keys['plain']}"})
    assert page.status_code == 303


def test_pages_carry_the_strict_content_security_policy(public: httpx.Client, lab_state: LabState):
    for path in ("/lab/runs", "/lab/login", "/lab/static/lab.css", "/lab/runs/nope"):
        response = public.get(path)
        assert response.headers["content-security-policy"] == CSP, path
        for name, value in SECURITY_HEADERS.items():
            assert response.headers[name] == value
    assert public.get("/lab/static/lab.js").headers["content-type"] == "text/javascript; charset=utf-8"


def test_runs_list_names_every_run_with_its_status(public: httpx.Client, lab_state: LabState):
    page = public.get("/lab/runs")
    assert page.status_code == 200
    listed = re.findall(r'<a href="/lab/runs/([0-9a-f-]+)"><code>', page.text)
    assert listed == sorted(lab_state.runs.values(), reverse=True)
    assert page.text.count("<td>completed</td>") == 3
    assert "<caption>3 runs, newest first</caption>" in page.text


def test_run_page_shows_the_verified_metrics_cases_and_files(public: httpx.Client, lab_state: LabState):
    run = lab_state.runs["a1"]
    page = public.get(f"/lab/runs/{run}")
    assert page.status_code == 200
    assert "Verified: ledger chain and head" in page.text
    for case in ("goals", "hostile", "keys", "xss"):
        assert f'href="/lab/runs/{run}/cases/{case}/0"' in page.text
    for name in ("ledger.jsonl", "ledger.head", "inputs/spec.json", "traces/cells-000001.parquet"):
        assert f'href="/lab/runs/{run}/files/{name}"' in page.text
    ledger = public.get(f"/lab/runs/{run}/files/ledger.jsonl")
    assert ledger.status_code == 200
    assert ledger.content == (lab_state.home / "evaluations" / run / "ledger.jsonl").read_bytes()
    trace = public.get(f"/lab/runs/{run}/files/traces/cells-000001.parquet")
    assert trace.headers["content-disposition"] == 'attachment; filename="cells-000001.parquet"'
    records = public.get(f"/lab/runs/{run}/ledger")
    assert records.text.count('<tr id="record-') == len(ledger.content.splitlines())


def test_trace_inspector_shows_channels_final_hits_context_and_citations(staff: httpx.Client, lab_state: LabState):
    run = lab_state.runs["a1"]
    page = staff.get(f"/lab/runs/{run}/cases/keys/0")
    assert page.status_code == 200
    text = page.text
    for heading in ("Channel hits", "Final hits", "Context", "Answer"):
        assert f"<h2>{heading}</h2>" in text
    assert "lexical channel" in text and "vector channel" in text
    assert re.search(r'closed by <a href="/lab/runs/[^"]+/ledger#record-\d+">ledger record \d+</a>', text)
    assert "<td>E1</td>" in text
    assert "Rotate the signing keys every quarter." in text  # the staff runbook, readable with scope staff
    assert "Judge verdict" not in text  # no verdict in the trace: the place stays empty


def test_evidence_outside_the_reviewers_scopes_is_withheld(public: httpx.Client, lab_state: LabState):
    page = public.get(f"/lab/runs/{lab_state.runs['a1']}/cases/keys/0")
    assert page.status_code == 200
    assert "Rotate the signing keys" not in page.text
    assert f'<code class="id">{STAFF_DOCUMENT}</code>' not in page.text  # (the suite's judgments still name it)
    assert "withheld: outside your scopes" in page.text
    assert "ragpipe builds retrieval indexes." in page.text  # public evidence stays visible


def test_markup_in_queries_titles_and_texts_is_escaped(staff: httpx.Client, lab_state: LabState):
    run = lab_state.runs["a1"]
    for path in (f"/lab/runs/{run}", f"/lab/runs/{run}/cases/xss/0"):
        text = staff.get(path).text
        assert "<script>window" not in text
        assert "&lt;script&gt;window.__xss_query = 1&lt;/script&gt; honest evaluation" in text
    case = staff.get(f"/lab/runs/{run}/cases/xss/0").text
    assert XSS_QUERY.replace("<", "&lt;").replace(">", "&gt;") in case
    assert XSS_TITLE.replace("<", "&lt;").replace(">", "&gt;") in case
    assert XSS_TEXT.replace("<", "&lt;").replace(">", "&gt;") in case


def test_unknown_runs_cases_files_and_traversal_are_404(public: httpx.Client, lab_state: LabState):
    run = lab_state.runs["a1"]
    paths = [
        "/lab/runs/0000",
        f"/lab/runs/{run}/cases/nope/0",
        f"/lab/runs/{run}/cases/goals/1",
        f"/lab/runs/{run}/cases/goals/x",
        f"/lab/runs/{run}/cases/goals/%C2%B2",  # "²": a digit to str.isdigit, not to int
        f"/lab/runs/{run}/files/nope.json",
        f"/lab/runs/{run}/files/..%2F..%2Frevisions%2Flab.json",
        f"/lab/runs/{run}/files/%2Fetc%2Fpasswd",
        "/lab/runs/..%2F..%2Frevisions/ledger",
        "/lab/runs/..%2Fevaluations%2F" + run,
        "/lab/corpus/..%2Frevisions",
        "/lab/corpus/nope",
        "/lab/static/..%2F..%2Fapp.py",
        "/lab/nothing",
    ]
    for path in paths:
        response = public.get(path)
        assert response.status_code == 404, path
        assert "<h1>Not found</h1>" in response.text, path
    assert "no evaluation run &#39;0000&#39;" in public.get("/lab/runs/0000").text


def test_logout_needs_the_sessions_csrf_token(lab_url: str, lab_state: LabState):
    client = login(lab_url, lab_state.keys["rev-public"])
    try:
        token = csrf_of(client)
        for form in ({}, {"csrf": "forged"}, {"csrf": token[:-1] + ("A" if token[-1] != "A" else "B")}):
            response = client.post("/lab/logout", data=form)
            assert response.status_code == 403, form
            assert "missing or wrong CSRF token" in response.text
        assert client.get("/lab/runs").status_code == 200  # still logged in
        other = login(lab_url, lab_state.keys["rev-staff"])
        assert client.post("/lab/logout", data={"csrf": csrf_of(other)}).status_code == 403  # another session's
        other.close()
        response = client.post("/lab/logout", data={"csrf": token})
        assert (response.status_code, response.headers["location"]) == (303, "/lab/login")
        assert client.get("/lab/runs").status_code == 303
        stale = httpx.Client(base_url=lab_url, cookies={COOKIE: response.request.headers["cookie"].split("=", 1)[1]})
        assert stale.get("/lab/runs").status_code == 303  # the session is gone server-side too
        stale.close()
    finally:
        client.close()


def test_comparison_of_runs_on_one_corpus(public: httpx.Client, lab_state: LabState):
    a1, a2 = lab_state.runs["a1"], lab_state.runs["a2"]
    page = public.get("/lab/compare", params={"incumbent": a1, "challenger": a2})
    assert page.status_code == 200
    assert "different corpora" not in page.text
    assert f'<a href="/lab/runs/{a1}"><code>{a1}</code></a>' in page.text
    assert page.text.count("<tr data-row>") == 4
    assert "<caption>All 4 paired cases" in page.text
    assert "<h2>Coverage</h2>" not in page.text
    assert "Answer labels" not in page.text  # neither run is judged


def test_comparison_warns_when_the_corpus_digests_differ(public: httpx.Client, lab_state: LabState):
    page = public.get("/lab/compare", params={"incumbent": lab_state.runs["a1"], "challenger": lab_state.runs["b1"]})
    assert page.status_code == 200
    assert re.search(r'class="warning" role="alert">Warning: the runs evaluated different corpora', page.text)
    # b1 skips the case judging the hostile document bundle B lacks: listed, not paired
    assert "(lost coverage): 1: <code>hostile</code>. Neither is paired." in page.text
    assert page.text.count("<tr data-row>") == 3
    back = public.get("/lab/compare", params={"incumbent": lab_state.runs["b1"], "challenger": lab_state.runs["a1"]})
    assert "(new coverage): 1: <code>hostile</code>." in back.text


def test_comparison_of_a_run_with_itself_names_the_pairing_rule(public: httpx.Client, lab_state: LabState):
    a1 = lab_state.runs["a1"]
    page = public.get("/lab/compare", params={"incumbent": a1, "challenger": a1})
    assert page.status_code == 200
    assert "These runs cannot be compared:" in page.text
    assert public.get("/lab/compare", params={"incumbent": a1, "challenger": "nope"}).status_code == 404


def test_corpus_view_shows_digest_exclusions_and_counts(public: httpx.Client, lab_state: LabState):
    listing = public.get("/lab/corpus")
    assert 'href="/lab/corpus/lab"' in listing.text and 'href="/lab/corpus/lab-plain"' in listing.text
    page = public.get("/lab/corpus/lab")
    assert page.status_code == 200
    text = page.text
    assert "notes/short.md" in text and "text shorter than min_text_chars=20" in text
    assert str(lab_state.home.parent) not in text
    assert "&lt;path&gt;" in text  # the exclusion's absolute location is redacted
    bundle_id = "sha256:" + lab_state.bundles["A"].name
    assert f'<code class="id">{bundle_id}</code>' in text
    assert f'href="/lab/runs/{lab_state.runs["a1"]}"' in text


def test_pages_count_against_the_keys_rate_limit(lab_state: LabState):
    from ragpipe.server.app import app_from
    from ragpipe_tests.support.served_http import served

    app = app_from(lab_state.home, lab_state.config(limits={"requests_per_minute": 3}), "staging")
    with served(app) as base:
        client = login(base, lab_state.keys["rev-public"])
        try:
            statuses = [client.get("/lab/runs").status_code for _ in range(4)]
            refused = client.get("/lab/corpus")
        finally:
            client.close()
        with httpx.Client(base_url=base) as guesser:  # failed logins count against the address
            guesses = [guesser.post("/lab/login", data={"key": "rpk_nobody_x"}) for _ in range(4)]
    assert [g.status_code for g in guesses] == [401, 401, 401, 429]
    assert "retry-after" in guesses[-1].headers and "Too many attempts" in guesses[-1].text
    assert statuses == [200, 200, 200, 429]
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "rate limit of 3 requests a minute reached" in refused.text
    assert refused.headers["content-security-policy"] == CSP
