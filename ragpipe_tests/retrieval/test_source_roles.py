"""Filtering on source roles inside both channels: a prefilter, like the scopes."""

from __future__ import annotations

import pytest

from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.results import QueryError
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.release_fixtures import bundle_of

STAFF = Subject("bob", ("public", "staff"))
RUNBOOK = "guide/ops.md"  # source_role: runbook, access_scopes: [staff]; every other document is primary


@pytest.fixture(scope="module")
def retriever(built_workspace):
    r = Retriever(bundle_of(built_workspace))
    yield r
    r.close()


def documents(result) -> list[str]:
    return [h["document_id"] for h in result.hits]


@pytest.mark.parametrize("mode", ["lexical", "vector", "hybrid"])
def test_only_documents_of_the_roles_asked_for(retriever, mode):
    r = retriever
    runbook = r.query("rotate the signing keys", STAFF, k=10, mode=mode, source_roles=("runbook",))
    primary = r.query("rotate the signing keys", STAFF, k=10, mode=mode, source_roles=("primary",))
    everything = r.query("rotate the signing keys", STAFF, k=10, mode=mode)
    assert set(documents(runbook)) == {RUNBOOK} and runbook.source_roles == ("runbook",)
    assert RUNBOOK not in documents(primary) and RUNBOOK in documents(everything)
    assert runbook.as_dict()["source_roles"] == ["runbook"] and "source_roles" not in everything.as_dict()


def test_roles_never_widen_what_a_subject_sees(retriever):
    r = retriever
    assert r.query("rotate the signing keys", Subject.default(), k=10, source_roles=("runbook",)).hits == []


@pytest.mark.parametrize("mode", ["lexical", "vector"])
def test_a_filtered_ranking_is_the_full_ranking_restricted_to_the_roles(retriever, mode):
    """Channel scores do not change under the filter (a zero-score clause; an exact scan), so the
    filtered top k is the first k of the unfiltered ranking's chunks of those roles (the fused
    score of a one-channel query is normalised over what was found, so only the order compares)."""
    r = retriever
    for query in ("signing keys", "honest evaluation of retrieval", "café"):
        full = r.query(query, STAFF, k=1000, mode=mode)
        filtered = r.query(query, STAFF, k=3, mode=mode, source_roles=("primary",))
        kept = [h["chunk_id"] for h in full.hits if h["document_id"] != RUNBOOK]
        assert [h["chunk_id"] for h in filtered.hits] == kept[:3]


@pytest.mark.parametrize(
    ("roles", "message"),
    [
        (("bad role",), "invalid source role 'bad role' (letters, digits, . _ : -)"),
        ((), "source_roles must be a non-empty list of role names, or none"),
        ("runbook", "source_roles must be a non-empty list of role names, or none"),
    ],
)
def test_bad_roles_are_refused(retriever, roles, message):
    r = retriever
    with pytest.raises(QueryError) as err:
        r.query("keys", STAFF, source_roles=roles)
    assert str(err.value) == message
