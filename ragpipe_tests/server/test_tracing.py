"""Served answers you can look up (``ragpipe.server.tracing``, ``ragpipe.server.feedback``): a trace
ID on every answer; with tracing on, exactly one record per answer holding exactly the configured
fields; a log that concurrent writers (threads, app instances, processes) extend as one valid chain
and that a writer killed mid-append leaves for the next one to recover; feedback by the asking key
or a reviewer only."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ledger import encode, read_ledger
from ragpipe.release.activation import activate
from ragpipe.server.app import app_from
from ragpipe.server.config import TRACE_FIELDS, KeyEntry, Tracing
from ragpipe.server.keys import new_key
from ragpipe.server.tracing import (
    TRACE_DOMAIN,
    TraceLog,
    find_trace,
    log_path,
    new_trace_id,
    read_log,
    trace_payload,
    traces_with_feedback,
)
from ragpipe_tests.server.test_answer_bounds import llm_release  # noqa: F401  (fixture)
from ragpipe_tests.support.http_server import release_of, wait_for
from ragpipe_tests.support.paths import REPO
from ragpipe_tests.support.served_http import served
from ragpipe_tests.support.serving import Serving, config_for

MARKER = "zebra-quokka-7319"  # question text that must not reach the disk unless configured
UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
FIXED = {"trace_id", "at", "target", "release_id"}
QUESTION = "How often are the signing keys rotated?"


def with_reviewer(serving: Serving) -> Serving:
    """``serving`` with a third key, ``rita``, holding the reviewer role (and only public scope)."""
    key, stored = new_key("rita")
    entry = KeyEntry(id="rita", hash=stored, subject="rita", scopes=("public",), roles=("reviewer",))
    return Serving(
        serving.ws,
        serving.targets,
        serving.releases,
        serving.bundles,
        {**serving.keys, "rita": key},
        (*serving.key_entries, entry),
    )


def bearer(serving: Serving, who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {serving.keys[who]}"}


def ask(base: str, serving: Serving, who: str, question: str = QUESTION) -> httpx.Response:
    return httpx.post(f"{base}/v1/answer", json={"question": question}, headers=bearer(serving, who), timeout=60)


def feedback(base: str, serving: Serving, who: str, body: dict) -> httpx.Response:
    return httpx.post(f"{base}/v1/feedback", json=body, headers=bearer(serving, who), timeout=60)


def test_every_answer_has_a_trace_id_and_tracing_off_writes_nothing(serving: Serving, caplog):
    """Tracing off (the default): the trace ID is in the body, ``X-Trace-Id`` and the access line,
    distinct per answer; queries carry none; nothing is written under the home; feedback is 409."""
    caplog.set_level(logging.INFO, logger="ragpipe.access")
    activate(serving.ws, serving.releases["a1"], "staging")
    with served(app_from(serving.ws.home, config_for(serving), "staging", serving.targets)) as base:
        wait_for(lambda: release_of(base) == serving.releases["a1"])
        caplog.clear()
        answers = [ask(base, serving, "alice"), ask(base, serving, "alice")]
        query = httpx.post(f"{base}/v1/query", json={"query": "signing keys"}, headers=bearer(serving, "alice"))
        refused = feedback(base, serving, "alice", {"trace_id": answers[0].json()["trace_id"], "verdict": "up"})
    ids = [r.json()["trace_id"] for r in answers]
    assert [r.status_code for r in answers] == [200, 200] and ids[0] != ids[1]
    assert all(UUID7.match(i) for i in ids) and [r.headers["x-trace-id"] for r in answers] == ids
    assert query.status_code == 200 and "x-trace-id" not in query.headers and "trace_id" not in query.json()
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ragpipe.access"]
    assert [line.get("trace_id") for line in lines] == [*ids, None, None]
    assert not serving.ws.serve_traces.exists()
    assert refused.status_code == 409
    assert refused.json() == {
        "code": "tracing_disabled",
        "message": "tracing is not enabled on this server: no trace can be found",
        "field": None,
    }


@pytest.mark.parametrize(
    ("keep", "keep_query_text"),
    [(None, False), (None, True), (("answer", "citations"), False)],
    ids=["default", "with-query", "answer-and-citations"],
)
def test_one_record_per_answer_with_exactly_the_configured_fields(
    llm_release,  # noqa: F811
    keep: tuple[str, ...] | None,
    keep_query_text: bool,
):
    """An answer from the local LLM server, traced: one ``trace`` record whose keys are the fixed
    ones plus exactly ``keep`` (plus ``query`` with ``keep_query_text``), whose values are the
    answer's; the question's marker is in the log's bytes only with ``keep_query_text``."""
    ws, targets, release, llm = llm_release
    llm.scenario = "valid"
    llm.replies["valid"] = json.dumps({"answer": "Every quarter [E1].", "citations": ["E1"], "abstained": False})
    key, stored = new_key("alice")
    entry = KeyEntry(id="alice", hash=stored, subject="alice-p", scopes=("public",))
    tracing = {"enabled": True, "keep_query_text": keep_query_text, **({"keep": keep} if keep else {})}
    serving = Serving(ws, targets, {}, {}, {"alice": key}, (entry,))
    with served(app_from(ws.home, config_for(serving, tracing=tracing), "staging", targets)) as base:
        wait_for(lambda: release_of(base) == release)
        r = ask(base, serving, "alice", f"{MARKER} {QUESTION}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "Every quarter [E1]." and len(llm.requests) == 1
    path = log_path(ws.home, "staging", release)
    records = read_ledger(path, TRACE_DOMAIN, scope=f"staging/{release}").records
    assert [(rec.seq, rec.kind) for rec in records] == [(1, "trace")]
    trace = records[0].payload
    kept = set(keep or TRACE_FIELDS)
    assert set(trace) == FIXED | kept | ({"query"} if keep_query_text else set())
    everything = {
        "trace_id": body["trace_id"],
        "target": "staging",
        "release_id": release,
        "subject": "alice-p",
        "key_id": "alice",
        "certificate_id": body["certificate_id"],
        "context_digest": body["context_digest"],
        "answer": "Every quarter [E1].",
        "abstained": False,
        "citations": body["citations"],
        "query": f"{MARKER} {QUESTION}",
    }
    assert {k: v for k, v in trace.items() if k != "at"} == {k: everything[k] for k in set(trace) - {"at"}}
    assert body["certificate_id"] and body["context_digest"] and body["citations"][0]["label"] == "E1"
    on_disk = b"".join(p.read_bytes() for p in path.parent.iterdir())
    assert (MARKER.encode() in on_disk) is keep_query_text
    found = find_trace(ws.home, "staging", body["trace_id"])
    assert found is not None and found.trace == trace and found.seq == 1 and found.feedback == ()


def test_feedback_by_the_asking_key_or_a_reviewer_only(serving: Serving):
    """alice's own verdict and the reviewer's are appended to the trace's log; bob (no reviewer
    role) is refused without learning anything of the trace; unknown traces are 404; bad bodies
    are 422 naming the field."""
    serving = with_reviewer(serving)
    activate(serving.ws, serving.releases["a1"], "staging")
    config = config_for(serving, tracing={"enabled": True})
    with served(app_from(serving.ws.home, config, "staging", serving.targets)) as base:
        wait_for(lambda: release_of(base) == serving.releases["a1"])
        trace_id = ask(base, serving, "alice").json()["trace_id"]
        own = feedback(base, serving, "alice", {"trace_id": trace_id, "verdict": "up"})
        other = feedback(base, serving, "bob", {"trace_id": trace_id, "verdict": "down"})
        review = feedback(base, serving, "rita", {"trace_id": trace_id, "verdict": "disputed", "note": "E1 is old"})
        unknown_id = new_trace_id()
        unknown = feedback(base, serving, "rita", {"trace_id": unknown_id, "verdict": "up"})
        bad = {
            "verdict": feedback(base, serving, "alice", {"trace_id": trace_id, "verdict": "meh"}),
            "note": feedback(base, serving, "alice", {"trace_id": trace_id, "verdict": "up", "note": "x" * 2001}),
            "trace_id": feedback(base, serving, "alice", {"trace_id": "../../etc", "verdict": "up"}),
        }
        surrogate = httpx.post(
            f"{base}/v1/feedback",
            content=b'{"trace_id": "%s", "verdict": "up", "note": "\\ud800"}' % trace_id.encode(),
            headers={**bearer(serving, "alice"), "Content-Type": "application/json"},
        )
    release = serving.releases["a1"]
    assert own.status_code == 200 and own.json() == {
        "trace_id": trace_id,
        "verdict": "up",
        "release_id": release,
        "seq": 2,
    }
    assert other.status_code == 403 and other.json() == {
        "code": "forbidden",
        "message": f"trace {trace_id}: only the key that asked or a reviewer may send feedback",
        "field": None,
    }
    assert review.status_code == 200 and review.json()["seq"] == 3
    assert unknown.status_code == 404 and unknown.json() == {
        "code": "trace_not_found",
        "message": f"no trace {unknown_id} on target staging",
        "field": "trace_id",
    }
    for field, r in bad.items():
        assert r.status_code == 422 and (r.json()["code"], r.json()["field"]) == ("invalid_request", field), r.text
        assert r.json()["message"].startswith(f"{field}: ")
    assert surrogate.status_code == 422 and surrogate.json() == {
        "code": "invalid_request",
        "message": "note: Input should be a valid string, unable to parse raw data as a unicode string",
        "field": "note",
    }
    [entry] = traces_with_feedback(serving.ws.home, "staging", verdict="disputed")
    assert entry.trace["trace_id"] == trace_id and entry.release_id == release
    assert [{k: v for k, v in f.items() if k != "at"} for f in entry.feedback] == [
        {"trace_id": trace_id, "verdict": "up", "key_id": "alice", "subject": "alice", "as_reviewer": False},
        {
            "trace_id": trace_id,
            "verdict": "disputed",
            "note": "E1 is old",
            "key_id": "rita",
            "subject": "rita",
            "as_reviewer": True,
        },
    ]
    assert traces_with_feedback(serving.ws.home, "staging", verdict="down") == []
    assert len(read_log(serving.ws.home, "staging", release)) == 1


def test_fifty_concurrent_answers_from_two_app_instances_make_one_chain(serving: Serving):
    """Two servers on one home (each with its own ``TraceLog``), 50 answers at once split between
    them: 50 distinct trace IDs, each exactly once in one verified chain."""
    activate(serving.ws, serving.releases["a1"], "staging")
    config = config_for(serving, tracing={"enabled": True}, limits={"max_concurrent": 4, "queue_timeout_s": 60})
    first = app_from(serving.ws.home, config, "staging", serving.targets)
    second = app_from(serving.ws.home, config, "staging", serving.targets)
    with served(first) as one, served(second) as two:
        for base in (one, two):
            wait_for(lambda base=base: release_of(base) == serving.releases["a1"])
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda i: ask((one, two)[i % 2], serving, "alice", f"keys {i}?"), range(50)))
    assert [r.status_code for r in answers] == [200] * 50
    ids = [r.json()["trace_id"] for r in answers]
    assert len(set(ids)) == 50
    release = serving.releases["a1"]
    records = read_ledger(log_path(serving.ws.home, "staging", release), TRACE_DOMAIN, scope=f"staging/{release}")
    assert sorted(rec.payload["trace_id"] for rec in records.records) == sorted(ids)
    assert {rec.kind for rec in records.records} == {"trace"} and records.dropped_bytes == 0


APPENDER = """
import sys
from pathlib import Path
from ragpipe.server.tracing import TraceLog
home, name, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
log = TraceLog(home)
for i in range(n):
    log.append("staging", "sha256:" + "ab" * 32, "trace", {"trace_id": f"{name}-{i}"})
"""
RELEASE = "sha256:" + "ab" * 32


def test_two_processes_appending_to_one_log_make_one_chain(tmp_path: Path):
    """Two processes append 40 records each to one log at once (flock between them): 80 records,
    one chain, each process's records in its own order."""
    procs = [
        subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path), name, "40"], cwd=REPO, stderr=subprocess.PIPE)
        for name in ("p", "q")
    ]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    read = read_ledger(log_path(tmp_path, "staging", RELEASE), TRACE_DOMAIN, scope=f"staging/{RELEASE}")
    ids = [rec.payload["trace_id"] for rec in read.records]
    assert len(ids) == 80 and read.dropped_bytes == 0
    for name in ("p", "q"):
        assert [i for i in ids if i.startswith(f"{name}-")] == [f"{name}-{i}" for i in range(40)]


KILLED = """
import os, signal, sys
from pathlib import Path
from ragpipe.kernel import ledger as kernel_ledger
from ragpipe.server.tracing import TraceLog
home, step = Path(sys.argv[1]), sys.argv[2]
log = TraceLog(home)
for i in range(2):
    log.append("staging", "sha256:" + "ab" * 32, "trace", {"trace_id": f"t-{i}"})
if step == "torn":  # the third record's write is cut in half, then the process dies
    write = os.write
    def half(fd, data):
        write(fd, data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    kernel_ledger.os.write = half
else:  # the third record is durable, the process dies before the head moves
    kernel_ledger.Ledger._write_head = lambda self: os.kill(os.getpid(), signal.SIGKILL)
log.append("staging", "sha256:" + "ab" * 32, "trace", {"trace_id": "t-2"})
"""


@pytest.mark.parametrize(("step", "survivors"), [("torn", ["t-0", "t-1"]), ("unheaded", ["t-0", "t-1", "t-2"])])
def test_a_writer_killed_mid_append_leaves_a_log_the_next_writer_continues(
    tmp_path: Path, step: str, survivors: list[str]
):
    """SIGKILL inside the third append: cut mid-write, the torn line is what readers ignore and the
    next writer drops; killed before the head moved, the record stands and the next writer repairs
    the head. Either way the next append continues one valid chain."""
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(tmp_path), step], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    path = log_path(tmp_path, "staging", RELEASE)
    assert [e.trace["trace_id"] for e in read_log(tmp_path, "staging", RELEASE)] == survivors
    TraceLog(tmp_path).append("staging", RELEASE, "trace", {"trace_id": "after"})
    read = read_ledger(path, TRACE_DOMAIN, scope=f"staging/{RELEASE}")
    assert [rec.payload["trace_id"] for rec in read.records] == [*survivors, "after"]
    assert read.dropped_bytes == 0 and path.read_bytes() == b"".join(encode(rec) for rec in read.records)
    assert os.stat(path).st_size == len(path.read_bytes())


@settings(max_examples=80, deadline=None)
@given(
    keep=st.lists(st.sampled_from(TRACE_FIELDS), unique=True),
    keep_query_text=st.booleans(),
    question=st.text(max_size=20),
    text=st.text(max_size=20),
    via=st.sampled_from([None, "mcp"]),
)
def test_law_a_trace_holds_exactly_the_policy_fields_in_canonical_form(
    keep: list[str], keep_query_text: bool, question: str, text: str, via: str | None
):
    """For any policy and any texts (NFC or not): the record's keys are the fixed ones, ``via``
    only for an answer asked over MCP, exactly ``keep``, and ``query`` only with
    ``keep_query_text``; it always encodes canonically (texts are kept in NFC), and the question
    appears nowhere unless kept."""
    policy = Tracing(enabled=True, keep=tuple(keep), keep_query_text=keep_query_text)
    body = {"answer": text, "abstained": False, "citations": [], "certificate_id": "c", "context_digest": "d"}
    body |= {"trace_id": new_trace_id(), "release_id": RELEASE}
    payload = trace_payload(policy, "staging", body, text, "alice", MARKER + question, via)
    assert set(payload) == FIXED | set(keep) | ({"query"} if keep_query_text else set()) | ({"via"} if via else set())
    assert payload.get("via") == via
    assert (MARKER.encode() in canonical_bytes(payload)) is keep_query_text
