"""The server bounds the LLM: ``limits.llm_timeout_s`` caps the timeout of the plan the release was
gated with, against a real local LLM server that never answers."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from ragpipe.release.activation import activate
from ragpipe.retrieval.plan import GeneratorPlan, load_plan
from ragpipe.server.app import app_from
from ragpipe_tests.server.conftest import Serving, config_for
from ragpipe_tests.support.http_server import release_of, running, wait_for
from ragpipe_tests.support.llm_server import LLMServer
from ragpipe_tests.support.release_fixtures import bundle_of, evaluation_of, fixture_targets, fresh_ws, publish


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
