"""The server bounds the LLM: ``limits.llm_timeout_s`` caps the timeout of the plan the release was
gated with, against a real local LLM server that never answers."""

from __future__ import annotations

import json
import shutil
import threading

import httpx
import pytest

from ragpipe.release.activation import activate
from ragpipe.retrieval.plan import GeneratorPlan, load_plan
from ragpipe.server.app import app_from
from ragpipe_tests.support.http_server import release_of, running, wait_for
from ragpipe_tests.support.llm_server import Handler, LLMServer
from ragpipe_tests.support.release_fixtures import bundle_of, evaluation_of, fixture_targets, fresh_ws, publish
from ragpipe_tests.support.serving import Serving, config_for


@pytest.fixture
def llm_release(built_workspace, tmp_path, monkeypatch):
    """(workspace, targets, release ID, the LLM server): the handbook bundle released with a plan
    whose generator is litellm on the local server, with a 30 s timeout."""
    with LLMServer() as llm:
        source = bundle_of(built_workspace)
        bundle = tmp_path / "built" / "home" / "bundles" / source.name
        shutil.copytree(source, bundle)
        base = load_plan()
        generator = GeneratorPlan(kind="litellm", model="openai/local-test", api_base=llm.api_base, timeout_seconds=30)
        plan = base.model_copy(update={"answer": base.answer.model_copy(update={"generator": generator})})
        evaluation_of(bundle, plan)  # the run binds this plan: the release is gated with it
        ws = fresh_ws(tmp_path / "serve", bundle)
        targets = fixture_targets(tmp_path)
        monkeypatch.setenv("RAGPIPE_TARGETS", str(targets))
        monkeypatch.setenv("RAGPIPE_HOME", str(ws.home))
        release = publish(ws, bundle, "llm")
        activate(ws, release, "staging")
        yield ws, targets, release, llm


def test_the_llm_timeout_is_capped_by_the_server(llm_release):
    ws, targets, release, llm = llm_release
    llm.scenario = "timeout"  # the LLM server holds each request for 10 s, then drops it unanswered
    serving = Serving(ws, targets, {}, {}, {}, ())
    with running(
        app_from(ws.home, config_for(serving, anonymous=True, limits={"llm_timeout_s": 0.5}), "staging", targets)
    ) as base:
        wait_for(lambda: release_of(base) == release)
        r = httpx.post(f"{base}/v1/answer", json={"question": "How often are the signing keys rotated?"}, timeout=60)
    assert r.status_code == 200 and r.json()["release_id"] == release
    body = r.json()
    # a timeout, not the dropped connection the plan's own 30 s would have met after 10 s
    assert body["abstained"] is True and body["failure"]["kind"] == "timeout"
    assert body["reason"].startswith("generator failed (timeout)")
    assert len(llm.requests) == 1 and llm.requests[0]["model"] == "local-test"


def test_a_valid_llm_answer_is_served(llm_release):
    ws, targets, release, llm = llm_release
    llm.scenario = "valid"
    llm.replies["valid"] = json.dumps({"answer": "Every quarter [E1].", "citations": ["E1"], "abstained": False})
    serving = Serving(ws, targets, {}, {}, {}, ())
    with running(app_from(ws.home, config_for(serving, anonymous=True), "staging", targets)) as base:
        wait_for(lambda: release_of(base) == release)
        r = httpx.post(f"{base}/v1/answer", json={"question": "How often are the signing keys rotated?"}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(llm.requests) == 1 and body["release_id"] == release
    assert (body["abstained"], body["answer"], body["generator"]) == (
        False,
        "Every quarter [E1].",
        "litellm:openai/local-test",
    )
    assert [c["label"] for c in body["citations"]] == ["E1"]


def test_busy_compute_slots_answer_503_overloaded(llm_release):
    """With the one compute slot held by an answer waiting on the LLM and no queueing
    (``queue_timeout_s: 0``), a query is refused at once with 503 ``overloaded``; once the answer is
    done, queries are served again."""
    ws, targets, release, llm = llm_release

    class LetGo(Handler):
        def do_POST(self) -> None:
            super().do_POST()
            self.close_connection = True  # let go: drop the connection, so the client fails now

    llm.RequestHandlerClass = LetGo  # read for each connection the server accepts
    llm.scenario = "timeout"  # each request is held until the LLM server is told to let go (``llm.release``)
    serving = Serving(ws, targets, {}, {}, {}, ())
    limits = {"max_concurrent": 1, "queue_timeout_s": 0, "llm_timeout_s": 60}
    with running(app_from(ws.home, config_for(serving, anonymous=True, limits=limits), "staging", targets)) as base:
        wait_for(lambda: release_of(base) == release)
        held: dict[str, httpx.Response] = {}
        answering = threading.Thread(
            target=lambda: held.setdefault(
                "r", httpx.post(f"{base}/v1/answer", json={"question": "How often are keys rotated?"}, timeout=120)
            )
        )
        answering.start()
        try:
            wait_for(lambda: len(llm.requests) == 1)  # the answer holds the slot, waiting on the LLM
            refused = httpx.post(f"{base}/v1/query", json={"query": "signing keys"}, timeout=30)
        finally:
            llm.release.set()  # the LLM server lets go: the generator fails, the answer abstains
            answering.join(timeout=120)
        after = httpx.post(f"{base}/v1/query", json={"query": "signing keys"}, timeout=30)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json() == {
        "code": "overloaded",
        "message": "all compute slots are busy: retry shortly",
        "field": None,
    }
    assert held["r"].status_code == 200 and held["r"].json()["abstained"] is True
    assert after.status_code == 200 and after.json()["release_id"] == release


def test_an_unforeseen_failure_is_a_500_without_a_traceback(llm_release, caplog):
    """The answer cache's folder is a file (a real fault on disk): storing the model's answer fails
    with an OSError no handler foresees. The caller gets 500 ``internal_error`` and one fixed line —
    no traceback, no exception text, no path — and the traceback goes to the server's log."""
    ws, targets, release, llm = llm_release
    llm.scenario = "valid"
    llm.replies["valid"] = json.dumps({"answer": "Every quarter [E1].", "citations": ["E1"], "abstained": False})
    (ws.home / "answer_cache").write_text("not a folder\n", encoding="utf-8")
    serving = Serving(ws, targets, {}, {}, {}, ())
    with running(app_from(ws.home, config_for(serving, anonymous=True), "staging", targets)) as base:
        wait_for(lambda: release_of(base) == release)
        r = httpx.post(f"{base}/v1/answer", json={"question": "How often are the signing keys rotated?"}, timeout=60)
    assert len(llm.requests) == 1  # the model answered: the failure is the server's own
    assert r.status_code == 500
    assert r.content == b'{"code":"internal_error","message":"internal error","field":null}'
    logged = [rec for rec in caplog.records if rec.name == "ragpipe.server" and rec.exc_info]
    assert [rec.getMessage() for rec in logged] == ["internal error on /v1/answer"]
    assert isinstance(logged[0].exc_info[1], OSError) and "answer_cache" in str(logged[0].exc_info[1])
