"""The review routes over HTTP, against the server ``ragpipe serve`` runs over the lab's home with a
dataset of drafts and a targets config naming one approver: who may use them, the sign-in-the-
browser protocol (propose → sign → decide) and every refusal it has, freezing and pairwise choices."""

from __future__ import annotations

import base64
import re

import httpx
import pytest

from ragpipe.evaluation.datasets import load_version, read_dataset
from ragpipe.kernel.signatures import load_key_file, new_key_file, sign
from ragpipe.server.app import app_from
from ragpipe.server.lab.review import choices
from ragpipe_tests.server.lab.test_views import login
from ragpipe_tests.support.lab_state import LabState
from ragpipe_tests.support.review_state import DISPUTED_TRACE, TARGET, XSS_DRAFT, ReviewState, add_review_state
from ragpipe_tests.support.served_http import served

DATASET = "review-http"


@pytest.fixture(scope="module")
def review(lab_state: LabState, tmp_path_factory: pytest.TempPathFactory) -> ReviewState:
    return add_review_state(lab_state, tmp_path_factory.mktemp("review-http"), DATASET)


@pytest.fixture(scope="module")
def server(lab_state: LabState, review: ReviewState):
    """(base URL, the lab's app state) of a server following ``production`` with the review targets."""
    observed = app_from(lab_state.home, lab_state.config(), TARGET, review.targets)
    with served(observed) as base:
        yield base, observed


@pytest.fixture(scope="module")
def staff(server, lab_state: LabState):
    client = login(server[0], lab_state.keys["rev-staff"])
    yield client
    client.close()


def csrf(client: httpx.Client) -> str:
    (token,) = set(re.findall(r'name="csrf" value="([^"]+)"', client.get("/lab/review").text))
    return token


def lab_of(observed):
    """The lab's shared state inside the served app (its proposals' clock is what tests turn)."""
    app = observed
    while not hasattr(app, "routes"):  # Observed, then the middleware layers, then the Starlette app
        app = app.app
    for route in app.routes:
        if getattr(route, "path", "") == "/lab":
            return route.app.state.lab
    raise AssertionError("no /lab mount")


def proposed(client: httpx.Client, case_id: str, decision: str = "accept", by: str = "rita", **extra) -> httpx.Response:
    body = {"csrf": csrf(client), "case_id": case_id, "decision": decision, "by": by, **extra}
    return client.post(f"/lab/review/{DATASET}/propose", json=body)


def signed(review: ReviewState, statement_b64: str) -> str:
    return sign(load_key_file(review.key_file), base64.b64decode(statement_b64))


def test_review_routes_need_a_reviewer_session(server):
    base, _ = server
    with httpx.Client(base_url=base) as anonymous:
        for path in ("/lab/review", f"/lab/review/{DATASET}", "/lab/pairwise?a=x&b=y&case=z"):
            response = anonymous.get(path)
            assert (response.status_code, response.headers["location"]) == (303, "/lab/login"), path
        response = anonymous.post(f"/lab/review/{DATASET}/propose", json={})
        assert (response.status_code, response.json()["code"]) == (401, "unauthenticated")
        response = anonymous.post("/lab/review/decide", json={})
        assert (response.status_code, response.json()["code"]) == (401, "unauthenticated")


def test_the_queue_shows_drafts_first_and_a_hostile_question_as_text(staff, review: ReviewState):
    page = staff.get(f"/lab/review/{DATASET}")
    assert page.status_code == 200
    assert "Queue: item 1 of 3" in page.text
    assert 'data-case="draft-a"' in page.text and "provisional draft" in page.text
    assert "hostile text is part of an honest evaluation" in page.text and "model drafter-1" in page.text
    last = staff.get(f"/lab/review/{DATASET}?at=2").text
    assert 'data-case="xss"' in last
    assert "&lt;script&gt;window.__xss_draft = 1&lt;/script&gt;" in last and XSS_DRAFT not in last


def test_a_source_outside_the_reviewers_scopes_is_withheld(server, staff, lab_state: LabState):
    staff_page = staff.get(f"/lab/review/{DATASET}?at=1").text  # draft-b expects the staff runbook
    assert "Rotate the signing keys every quarter." in staff_page
    public = login(server[0], lab_state.keys["rev-public"])
    try:
        page = public.get(f"/lab/review/{DATASET}?at=1").text
    finally:
        public.close()
    assert "title and text withheld: outside your scopes" in page and "Rotate the signing keys" not in page


def test_the_whole_queue_ends_with_the_disputed_answer_read_only(staff):
    page = staff.get("/lab/review")
    total = int(re.search(r"item 1 of (\d+)", page.text).group(1))
    last = staff.get(f"/lab/review?at={total - 1}").text
    assert f"Disputed answer <code>{DISPUTED_TRACE}</code>" in last
    assert "&lt;b&gt;Keys are never rotated.&lt;/b&gt;" in last and "<td>disputed</td>" in last
    assert "<form" not in last.split('id="disputed"')[1].split("</article>")[0]  # read-only


def test_csrf_missing_or_forged_is_403(staff):
    for body in ({}, {"csrf": "forged"}):
        response = staff.post(f"/lab/review/{DATASET}/propose", json={**body, "case_id": "draft-a"})
        assert (response.status_code, response.json()) == (
            403,
            {"code": "forbidden", "message": "missing or wrong CSRF token"},
        )
    assert staff.post("/lab/review/decide", json={"csrf": "forged", "token": "t", "signature": "s"}).status_code == 403
    for path in (f"/lab/review/{DATASET}/freeze", "/lab/pairwise"):
        assert staff.post(path, data={"csrf": "forged"}).status_code == 403, path


def test_a_non_approver_is_refused_before_anything_is_signed(staff):
    response = proposed(staff, "draft-a", by="sam")
    assert (response.status_code, response.json()) == (
        403,
        {"code": "not_an_approver", "message": "'sam' is not an approver of target 'production' (approvers: rita)"},
    )


def test_an_unknown_used_or_expired_token_and_a_forged_signature(staff, server, review: ReviewState):
    decide = lambda body: staff.post("/lab/review/decide", json={"csrf": csrf(staff), **body})  # noqa: E731
    response = decide({"token": "nope", "signature": "ed25519:AA=="})
    assert (response.status_code, response.json()["code"]) == (409, "unknown_token")
    # a signature by a key the target does not list
    other = load_key_file(_other_key(review))
    offer = proposed(staff, "draft-a").json()
    forged = sign(other, base64.b64decode(offer["statement_b64"]))
    response = decide({"token": offer["token"], "signature": forged})
    assert (response.status_code, response.json()) == (
        422,
        {"code": "bad_signature", "message": "decision on case 'draft-a' by 'rita': the signature does not verify"},
    )
    response = decide({"token": offer["token"], "signature": signed(review, offer["statement_b64"])})
    assert (response.status_code, response.json()["code"]) == (409, "unknown_token")  # single use
    proposals = lab_of(server[1]).proposals
    offer = proposed(staff, "draft-a").json()
    clock = proposals.clock
    proposals.clock = lambda: clock() + proposals.ttl_s + 1
    try:
        response = decide({"token": offer["token"], "signature": signed(review, offer["statement_b64"])})
    finally:
        proposals.clock = clock
    assert (response.status_code, response.json()) == (
        409,
        {"code": "expired_token", "message": "the proposal expired: decide again"},
    )
    state, _ = read_dataset(review.home, DATASET)
    assert state.cases["draft-a"].status == "pending"


def _other_key(review: ReviewState):
    path = review.key_file.with_name("mallory.pem")
    if not path.exists():
        new_key_file(path)
    return path


def test_a_stale_proposal_is_refused_and_a_fresh_decision_is_recorded(staff, review: ReviewState):
    decide = lambda body: staff.post("/lab/review/decide", json={"csrf": csrf(staff), **body})  # noqa: E731
    first, second = proposed(staff, "xss", "reject").json(), proposed(staff, "xss").json()
    done = decide({"token": first["token"], "signature": signed(review, first["statement_b64"])})
    assert done.status_code == 200
    assert done.json()["recorded"] | {"seq": 0} == {
        "dataset": DATASET,
        "case_id": "xss",
        "decision": "reject",
        "by": "rita",
        "seq": 0,
    }
    response = decide({"token": second["token"], "signature": signed(review, second["statement_b64"])})
    assert (response.status_code, response.json()) == (
        409,
        {
            "code": "stale_proposal",
            "message": f"dataset '{DATASET}': case 'xss' changed since this decision was proposed; "
            "decide on it as it is now",
        },
    )
    state, _ = read_dataset(review.home, DATASET)
    assert state.cases["xss"].status == "rejected"


def test_an_edit_then_a_freeze_from_the_page(staff, review: ReviewState):
    edited = {"query": "How often are the signing keys rotated?", "tags": "ops, keys", "quality_label": "2_SUBSTANTIAL"}
    offer = proposed(staff, "draft-b", "edit", edited=edited).json()
    done = staff.post(
        "/lab/review/decide",
        json={"csrf": csrf(staff), "token": offer["token"], "signature": signed(review, offer["statement_b64"])},
    )
    assert done.status_code == 200, done.text
    response = staff.post(f"/lab/review/{DATASET}/freeze", data={"csrf": csrf(staff)})
    assert response.status_code == 200
    version = load_version(review.home, DATASET, None, {"rita": review.public_key})
    assert f'Version {version.number} frozen: <code class="id">{version.id}</code>, 1 cases' in response.text
    (case,) = version.cases
    assert (case["id"], case["query"], case["tags"], case["quality_label"], case["review"]) == (
        "draft-b",
        edited["query"],
        ["keys", "ops"],
        "2_SUBSTANTIAL",
        "adjudicated",
    )
    again = staff.post(f"/lab/review/{DATASET}/freeze", data={"csrf": csrf(staff)})
    assert f"dataset &#39;{DATASET}&#39;: nothing changed since version 1" in again.text


def test_pairwise_choice_is_one_ledger_record(staff, lab_state: LabState):
    a, b = lab_state.runs["a1"], lab_state.runs["a2"]
    page = staff.get(f"/lab/pairwise?a={a}&b={b}&case=keys")
    assert page.status_code == 200 and "Pairwise review of case <code>keys</code>" in page.text
    before = len(choices(lab_state.home))
    response = staff.post(
        "/lab/pairwise", data={"csrf": csrf(staff), "a": a, "b": b, "case": "keys", "repeat": "0", "choice": "0"}
    )
    assert response.status_code == 303
    records = choices(lab_state.home)
    assert len(records) == before + 1
    payload = records[-1].payload
    assert {k: payload[k] for k in ("a", "b", "case_id", "repeat", "choice", "by")} == {
        "a": a,
        "b": b,
        "case_id": "keys",
        "repeat": 0,
        "choice": "tie",
        "by": "sam",
    }
    bad = staff.post("/lab/pairwise", data={"csrf": csrf(staff), "a": a, "b": b, "case": "keys", "choice": "9"})
    assert bad.status_code == 400
    assert staff.get(f"/lab/pairwise?a={a}&b={b}&case=nope").status_code == 404
