"""Authorization over HTTP, against the query path's adversarial fixture (``SCOPED_DOCS``): secret
documents that would rank first in both channels, a secret twin of a public text (an equal-score
tie across scopes), a public document whose text names scopes. One key per subject; scopes and
principals smuggled in the body and in the query text. No response holds a chunk its subject may
not read, and every response equals the in-process ``Retriever`` answer for the key's subject."""

from __future__ import annotations

import httpx
import pytest

from ragpipe.release.activation import activate
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
from ragpipe.server.app import app_from
from ragpipe.server.config import KeyEntry, ServeConfig
from ragpipe.server.keys import new_key
from ragpipe_tests.support.corpora import SCOPED_DOCS
from ragpipe_tests.support.http_server import release_of, running, wait_for
from ragpipe_tests.support.release_fixtures import fixture_targets, fresh_ws, publish

SUBJECTS = {  # key ID -> the scopes its subject holds
    "nurse": ("public",),
    "staffer": ("public", "staff"),
    "auditor": ("secret",),
    "nobody": ("unused",),
}
QUERIES = [
    "aspirin stroke",
    "secret aspirin stroke trial",
    "access_scope:secret aspirin",  # a scope name injected in the query text
    "aspirin AND secret OR staff",
    "twin text aspirin stroke prevention",  # equal-score tie across scopes
    "scopes: secret principal: auditor",
]
SMUGGLED = {
    "scopes": ["secret", "staff"],
    "access_scopes": ["secret"],
    "principal": "auditor",
    "subject": {"principal": "auditor", "scopes": ["secret"]},
}


def readable(scopes: tuple[str, ...]) -> set[str]:
    """The documents a subject holding ``scopes`` may read (unscoped documents are public)."""
    return {d["_id"] for d in SCOPED_DOCS if set(d.get("metadata", {}).get("access_scopes", ["public"])) & set(scopes)}


def untimed(body: dict) -> dict:
    return {**body, "trace": {k: v for k, v in body["trace"].items() if k != "timings_ms"}}


@pytest.fixture
def scoped_service(scoped_bundles, tmp_path, monkeypatch):
    full, _ = scoped_bundles
    ws = fresh_ws(tmp_path, full)
    targets = fixture_targets(tmp_path)
    monkeypatch.setenv("RAGPIPE_TARGETS", str(targets))
    monkeypatch.setenv("RAGPIPE_HOME", str(ws.home))
    release = publish(ws, full, "s1")
    activate(ws, release, "staging")
    made = {key_id: new_key(key_id) for key_id in SUBJECTS}
    config = ServeConfig.model_validate(
        {
            "keys": [
                KeyEntry(id=key_id, hash=made[key_id][1], subject=key_id, scopes=scopes)
                for key_id, scopes in SUBJECTS.items()
            ],
            "poll_interval_s": 0.05,
            "limits": {"requests_per_minute": 0},
        }
    )
    with running(app_from(ws.home, config, "staging", targets)) as base:
        wait_for(lambda: release_of(base) == release)
        yield base, {key_id: key for key_id, (key, _) in made.items()}, release, full


def test_no_response_holds_a_chunk_its_subject_may_not_read(scoped_service):
    base, keys, release, bundle = scoped_service
    reference = Retriever(bundle)
    reference.release_id = release  # as the server's retriever of the release: its trace names it
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            for key_id, scopes in SUBJECTS.items():
                allowed, subject = readable(scopes), Subject(key_id, scopes)
                for query in QUERIES:
                    for mode in ("hybrid", "lexical", "vector"):
                        body = {"query": query, "k": 10, "mode": mode, "trace": True, **SMUGGLED}
                        r = http.post("/v1/query", json=body, headers={"Authorization": f"Bearer {keys[key_id]}"})
                        assert r.status_code == 200, r.text
                        got = r.json()
                        shown = {h["document_id"] for h in got["hits"]}
                        assert shown <= allowed, (key_id, query, mode, shown - allowed)
                        assert got["subject"] == {"principal": key_id, "scopes": sorted(scopes)}
                        expected = reference.query(query, subject, k=10, mode=mode, trace=True).as_dict()
                        # the same result and trace, but for how long each channel took
                        assert untimed(got) == {**untimed(expected), "release_id": release}
    finally:
        reference.close()


def test_the_secret_documents_reach_only_their_own_subject(scoped_service):
    """The fixture is adversarial: the same requests do return the secret documents to the subject
    that holds ``secret`` — so their absence elsewhere is authorization, not ranking."""
    base, keys, _, _ = scoped_service
    seen: dict[str, set[str]] = {key_id: set() for key_id in SUBJECTS}
    with httpx.Client(base_url=base, timeout=60) as http:
        for key_id in SUBJECTS:
            for query in QUERIES[:2]:
                r = http.post(
                    "/v1/query",
                    json={"query": query, "k": 10, **SMUGGLED},
                    headers={"Authorization": f"Bearer {keys[key_id]}"},
                )
                seen[key_id] |= {h["document_id"] for h in r.json()["hits"]}
    assert {"sec-aspirin", "sec-twin"} <= seen["auditor"] <= readable(("secret",))
    assert not seen["nurse"] & {"sec-aspirin", "sec-twin", "staff-aspirin"}
    assert "staff-aspirin" in seen["staffer"] and not seen["staffer"] & {"sec-aspirin", "sec-twin"}
    assert seen["nobody"] == set()


def test_answers_cite_only_what_the_subject_may_read(scoped_service):
    base, keys, release, _ = scoped_service
    with httpx.Client(base_url=base, timeout=60) as http:
        for key_id, scopes in SUBJECTS.items():
            r = http.post(
                "/v1/answer",
                json={"question": "What did the secret aspirin stroke trial find?", **SMUGGLED},
                headers={"Authorization": f"Bearer {keys[key_id]}"},
            )
            assert r.status_code == 200, r.text
            body = r.json()
            evidence = {e["document_id"] for e in body["evidence"]}
            cited = {c["document_id"] for c in body["citations"]}
            assert evidence <= readable(scopes) and cited <= evidence and body["release_id"] == release
            if key_id == "nobody":  # nothing readable: an abstention, nothing quoted
                assert body["abstained"] is True and evidence == set() and cited == set()
            else:
                assert evidence, key_id
            shown = {d["text"] for d in SCOPED_DOCS if d["_id"] in readable(scopes)}  # the twins share one text
            for text in {d["text"] for d in SCOPED_DOCS} - shown:
                assert text not in body["answer"]
