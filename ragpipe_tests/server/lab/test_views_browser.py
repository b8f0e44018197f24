"""The lab in a real browser (Chromium through Playwright, one browser for the module): logging
in and out, every view rendered from a real home with a screenshot of each, hostile markup staying
text, the CSP letting the lab's own script and style run, and accessibility basics (``lang``,
headings, a label for every form control, Tab order following the DOM)."""

from __future__ import annotations

import pytest

from ragpipe_tests.support.browser import screenshot
from ragpipe_tests.support.lab_state import XSS_QUERY, XSS_TEXT, XSS_TITLE, LabState

# Every form control without a label (its own <label for>, an enclosing label, or aria-label).
UNLABELLED = """() => [...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
  .filter(c => c.labels.length === 0 && !c.getAttribute('aria-label')).map(c => c.outerHTML)"""
# Everything Tab can reach, in DOM order, each named by its ID, name or text.
FOCUSABLE = """() => [...document.querySelectorAll('a[href], input:not([type=hidden]), select, textarea, button')]
  .map(c => c.id || c.name || c.textContent.trim())"""
FOCUSED = "() => { const c = document.activeElement; return c ? (c.id || c.name || c.textContent.trim()) : null }"


@pytest.fixture(scope="module")
def page(lab_browser, lab_url: str, lab_state: LabState):
    """One tab, logged in as the staff reviewer through the form; console errors are collected."""
    tab = lab_browser.new_page()
    tab.errors = []
    tab.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    tab.goto(f"{lab_url}/lab/runs")
    assert tab.url == f"{lab_url}/lab/login"
    tab.get_by_label("API key").fill(lab_state.keys["rev-staff"])
    tab.get_by_role("button", name="Log in").click()
    tab.wait_for_url(f"{lab_url}/lab/runs")
    yield tab
    tab.close()


def check_accessibility(tab) -> None:
    assert tab.evaluate("document.documentElement.lang") == "en"
    assert tab.locator("h1").count() == 1
    assert tab.evaluate(UNLABELLED) == []
    assert tab.title().endswith("· ragpipe lab")


def tab_order(tab) -> list[str]:
    """What pressing Tab from the top of the page focuses, once per focusable element."""
    tab.evaluate("document.activeElement && document.activeElement.blur()")
    reached = []
    for _ in range(len(tab.evaluate(FOCUSABLE))):
        tab.keyboard.press("Tab")
        reached.append(tab.evaluate(FOCUSED))
    return reached


def test_login_form_is_accessible_and_tab_order_follows_the_dom(lab_browser, lab_url: str):
    tab = lab_browser.new_page()
    try:
        tab.goto(f"{lab_url}/lab/login")
        check_accessibility(tab)
        screenshot(tab, "login")
        assert tab_order(tab) == tab.evaluate(FOCUSABLE) == ["ragpipe lab", "key", "Log in"]
    finally:
        tab.close()


def test_the_session_cookie_is_out_of_reach_of_scripts(page):
    assert page.evaluate("document.cookie") == ""
    (cookie,) = [c for c in page.context.cookies() if c["name"] == "ragpipe_lab"]
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/lab")


def test_runs_view(page, lab_url: str, lab_state: LabState):
    page.goto(f"{lab_url}/lab/runs")
    check_accessibility(page)
    assert page.locator("tbody tr").count() == 3
    screenshot(page, "runs")
    page.get_by_role("link", name=lab_state.runs["a1"]).click()
    page.wait_for_url(f"{lab_url}/lab/runs/{lab_state.runs['a1']}")
    check_accessibility(page)
    assert page.get_by_role("heading", name="Metrics").is_visible()
    screenshot(page, "run")
    page.goto(f"{lab_url}/lab/runs/{lab_state.runs['a1']}/ledger")
    check_accessibility(page)
    screenshot(page, "ledger")


def test_trace_inspector_renders_hostile_markup_as_text(page, lab_url: str, lab_state: LabState):
    page.goto(f"{lab_url}/lab/runs/{lab_state.runs['a1']}/cases/xss/0")
    check_accessibility(page)
    assert page.locator("p.query").inner_text() == XSS_QUERY
    body = page.locator("main").inner_text()
    assert XSS_TITLE in body and XSS_TEXT in body
    assert page.evaluate("[window.__xss_query, window.__xss_title, window.__xss_text]") == [None, None, None]
    assert page.locator("main script").count() == 0
    screenshot(page, "trace-xss")
    page.goto(f"{lab_url}/lab/runs/{lab_state.runs['a1']}/cases/keys/0")
    for heading in ("Channel hits", "Final hits", "Context", "Answer"):
        assert page.get_by_role("heading", name=heading, exact=True).is_visible()
    screenshot(page, "trace")


def test_comparison_view_with_its_script_under_the_csp(page, lab_url: str, lab_state: LabState):
    page.goto(f"{lab_url}/lab/compare")
    check_accessibility(page)
    order = page.evaluate(FOCUSABLE)
    assert order[-3:] == ["incumbent", "challenger", "Compare"]
    assert tab_order(page) == order
    page.get_by_label("Incumbent run").select_option(lab_state.runs["a1"])
    page.get_by_label("Challenger run").select_option(lab_state.runs["b1"])
    page.get_by_role("button", name="Compare").click()
    page.wait_for_url(f"{lab_url}/lab/compare?*")
    assert page.get_by_role("alert").inner_text().startswith("Warning: the runs evaluated different corpora")
    screenshot(page, "compare-corpora-differ")
    page.goto(f"{lab_url}/lab/compare?incumbent={lab_state.runs['a1']}&challenger={lab_state.runs['a2']}")
    rows = page.locator("#per-case tr[data-row]")
    assert rows.count() == 4
    page.get_by_label("Only cases that changed").check()  # lab.js hides rows where every metric tied
    assert [rows.nth(i).is_hidden() for i in range(4)] == [True] * 4
    screenshot(page, "compare")


def test_corpus_view(page, lab_url: str):
    page.goto(f"{lab_url}/lab/corpus")
    check_accessibility(page)
    page.get_by_role("link", name="lab", exact=True).click()
    page.wait_for_url(f"{lab_url}/lab/corpus/lab")
    check_accessibility(page)
    assert "text shorter than min_text_chars=20" in page.locator("#exclusions + table").inner_text()
    screenshot(page, "corpus")


def test_no_console_errors_and_the_stylesheet_applies(page, lab_url: str):
    page.goto(f"{lab_url}/lab/runs")
    # lab.css sets the table borders: a blocked or missing style sheet would leave none
    assert page.evaluate("getComputedStyle(document.querySelector('th')).borderTopStyle") == "solid"
    assert page.errors == []


def test_a_key_without_the_role_sees_the_403_page(lab_browser, lab_url: str, lab_state: LabState):
    tab = lab_browser.new_page()
    try:
        tab.goto(f"{lab_url}/lab/login")
        tab.get_by_label("API key").fill(lab_state.keys["plain"])
        with tab.expect_response(f"{lab_url}/lab/login") as response:
            tab.get_by_role("button", name="Log in").click()
        assert response.value.status == 403
        assert tab.get_by_role("heading", name="Forbidden").is_visible()
        check_accessibility(tab)
        screenshot(tab, "forbidden")
    finally:
        tab.close()


def test_logout_ends_the_session(page, lab_url: str):
    page.goto(f"{lab_url}/lab/runs")
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{lab_url}/lab/login")
    page.goto(f"{lab_url}/lab/runs")
    assert page.url == f"{lab_url}/lab/login"
