"""The review queue in a real browser (Chromium through Playwright): one full adjudication from two
provisional drafts to a dataset version — the approver's PEM loaded through the file input and
signed with WebCrypto in the page, one draft accepted by keyboard, the other edited and accepted,
the version frozen from the page — then the disputed answer and pairwise review, each view checked
for accessibility basics and kept as a screenshot."""

from __future__ import annotations

import re

import pytest

from ragpipe.evaluation.datasets import load_version, read_dataset
from ragpipe.server.app import app_from
from ragpipe.server.lab.review import choices
from ragpipe_tests.server.lab.test_views_browser import FOCUSABLE, check_accessibility, tab_order
from ragpipe_tests.support.browser import screenshot
from ragpipe_tests.support.lab_state import LabState
from ragpipe_tests.support.review_state import DISPUTED_TRACE, TARGET, XSS_DRAFT, ReviewState, add_review_state
from ragpipe_tests.support.served_http import served

DATASET = "review-browser"
# what Tab can reach: the focusable elements the page shows (the closed edit form is hidden)
SHOWN = f"() => ({FOCUSABLE})().filter((_, i) => [...document.querySelectorAll(" + (
    "'a[href], input:not([type=hidden]), select, textarea, button')][i].checkVisibility())"
)


@pytest.fixture(scope="module")
def review(lab_state: LabState, tmp_path_factory: pytest.TempPathFactory) -> ReviewState:
    return add_review_state(lab_state, tmp_path_factory.mktemp("review-browser"), DATASET)


@pytest.fixture(scope="module")
def base(lab_state: LabState, review: ReviewState):
    with served(app_from(lab_state.home, lab_state.config(), TARGET, review.targets)) as url:
        yield url


@pytest.fixture(scope="module")
def page(lab_browser, base: str, lab_state: LabState):
    tab = lab_browser.new_page()
    tab.errors = []
    # the browser's own /favicon.ico request is outside the lab (the API server's 404)
    tab.on(
        "console",
        lambda m: (
            tab.errors.append(m.text)
            if m.type == "error" and not m.location.get("url", "").endswith("/favicon.ico")
            else None
        ),
    )
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    tab.goto(f"{base}/lab/login")
    tab.get_by_label("API key").fill(lab_state.keys["rev-staff"])
    tab.get_by_role("button", name="Log in").click()
    tab.wait_for_url(f"{base}/lab/runs")
    yield tab
    tab.close()


def test_from_two_drafts_to_a_version_in_the_browser(page, base: str, review: ReviewState):
    from playwright.sync_api import expect  # the browser fixture skips (or fails, under CI) without it

    page.goto(f"{base}/lab/review/{DATASET}")
    check_accessibility(page)
    order = page.evaluate(SHOWN)
    assert order[order.index("freeze") :] == [
        "freeze",
        "key-file",
        "by",
        "next",
        "review-browser",
        "accept",
        "edit",
        "reject",
    ]
    assert tab_order(page)[: len(order)] == order  # the edit form is hidden until opened: Tab skips it
    screenshot(page, "review")
    status = page.locator("#status")
    page.keyboard.press("a")  # no key yet: nothing is proposed
    assert status.inner_text() == "no_key: load your approver key file first"
    page.get_by_label("Approver private key (PEM; read in this page only, never sent)").set_input_files(
        str(review.key_file)
    )
    expect(status).to_have_text(re.compile("^key loaded"))
    by = page.get_by_label("Approver name")
    by.fill("rita")
    by.press("a")  # typing in a field: no shortcut fires
    assert by.input_value() == "ritaa"
    by.fill("rita")
    by.evaluate("e => e.blur()")
    assert page.locator("#review").get_attribute("data-case") == "draft-a"
    page.keyboard.press("a")
    expect(status).to_have_text(re.compile("^recorded"))
    assert status.inner_text() == "recorded: accept of case draft-a (dataset record 3)"
    assert page.locator("#review").get_attribute("data-case") == "draft-b"
    page.keyboard.press("e")
    query = page.get_by_label("Query")
    assert page.evaluate("document.activeElement.id") == "f-query"
    query.fill("How often are the signing keys rotated?")
    page.get_by_label("Quality label").select_option("2_SUBSTANTIAL")
    page.get_by_label("Tags (comma-separated)").fill("ops")
    check_accessibility(page)
    screenshot(page, "review-edit")
    page.get_by_role("button", name="Sign and save the edit").click()
    expect(status).to_have_text(re.compile("^recorded: edit"))
    assert status.inner_text() == "recorded: edit of case draft-b (dataset record 4)"
    # the hostile draft is left: its question is text, its script never ran
    assert page.locator("#query").inner_text() == XSS_DRAFT
    assert page.evaluate("window.__xss_draft") is None
    page.get_by_role("button", name="Freeze the next version").click()
    page.wait_for_selector("#frozen")
    approvers = {"rita": review.public_key}
    version = load_version(review.home, DATASET, None, approvers)
    assert page.locator("#frozen").inner_text().startswith(f"Version 1 frozen: {version.id}, 2 cases (")
    check_accessibility(page)
    screenshot(page, "review-frozen")
    state, records = read_dataset(review.home, DATASET)
    decisions = [
        (r.payload["case_id"], r.payload["decision"], r.payload["by"]) for r in records if r.kind == "adjudicated"
    ]
    assert decisions == [("draft-a", "accept", "rita"), ("draft-b", "edit", "rita")]
    assert {c["id"]: (c["query"], c["review"], c.get("quality_label")) for c in version.cases} == {
        "draft-a": ("What does the handbook say honest evaluation needs?", "adjudicated", None),
        "draft-b": ("How often are the signing keys rotated?", "adjudicated", "2_SUBSTANTIAL"),
    }
    assert sorted(version.splits) == ["draft-a", "draft-b"]
    assert state.cases["xss"].status == "pending"
    assert page.errors == []


def test_the_disputed_answer_is_shown_read_only(page, base: str, review: ReviewState):
    page.goto(f"{base}/lab/review")
    total = int(page.locator("#queue-heading").inner_text().rsplit(" ", 1)[1])
    page.goto(f"{base}/lab/review?at={total - 1}")
    check_accessibility(page)
    article = page.locator("#disputed")
    assert article.get_by_role("heading").inner_text() == f"Disputed answer {DISPUTED_TRACE}"
    assert "<b>Keys are never rotated.</b>" in article.inner_text()
    assert article.locator("form, button").count() == 0
    assert "disputed" in article.locator("table").inner_text()
    screenshot(page, "review-disputed")
    page.keyboard.press("k")  # back through the queue by keyboard
    page.wait_for_url(f"{base}/lab/review?at={total - 2}")


def test_pairwise_choice_by_keyboard(page, base: str, lab_state: LabState):
    a, b = lab_state.runs["a1"], lab_state.runs["a2"]
    page.goto(f"{base}/lab/pairwise?a={a}&b={b}&case=goals")
    check_accessibility(page)
    assert page.get_by_role("heading", name=f"Answer a: run {a}").is_visible()
    order = page.evaluate(FOCUSABLE)
    assert order[-3:] == ["choose-a", "choose-b", "choose-tie"]
    assert tab_order(page) == order
    screenshot(page, "pairwise")
    before = len(choices(lab_state.home))
    page.keyboard.press("2")
    page.wait_for_selector("#recorded")
    records = choices(lab_state.home)
    assert len(records) == before + 1
    assert {k: records[-1].payload[k] for k in ("a", "b", "case_id", "choice", "by")} == {
        "a": a,
        "b": b,
        "case_id": "goals",
        "choice": "b",
        "by": "sam",
    }
    assert page.errors == []
