"""``RowScopes``: row scopes held as groups, and what an index's per-scope answer gets wrong."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.index.rows import RowScopes

SCOPES = st.lists(st.lists(st.sampled_from(["public", "team", "hr"]), max_size=3, unique=True), max_size=30)


def test_rows_with_and_scopes():
    rows = RowScopes.of([("public",), ("team",), ("public", "team"), ()])
    assert rows.scopes() == {"public", "team"}
    assert rows.rows_with("team").tolist() == [1, 2]
    assert rows.rows_with("hr").tolist() == []
    assert list(rows) == [("public",), ("team",), ("public", "team"), ()]


def test_scope_mismatch_names_extra_and_missing_rows_ascending():
    rows = RowScopes.of([("public",), ("team",), ("public", "team"), ("public",)])
    assert rows.scope_mismatch("public", np.array([3, 0, 2])) is None
    assert rows.scope_mismatch("public", np.array([1, 0])) == ([1], [2, 3])
    assert rows.scope_mismatch("hr", np.array([], dtype=np.int64)) is None


def test_scope_mismatch_shows_at_most_five_of_each():
    rows = RowScopes.of([("public",)] * 8 + [()] * 8)
    assert rows.scope_mismatch("public", np.arange(8, 16)) == ([8, 9, 10, 11, 12], [0, 1, 2, 3, 4])


@given(SCOPES, st.sampled_from(["public", "team", "hr"]), st.data())
def test_scope_mismatch_is_none_exactly_for_the_rows_with_the_scope(scopes, scope, data):
    rows = RowScopes.of([tuple(s) for s in scopes])
    found = data.draw(st.lists(st.integers(0, max(0, len(scopes) - 1)), unique=True)) if scopes else []
    truth = sorted(i for i, s in enumerate(scopes) if scope in s)
    assert (rows.scope_mismatch(scope, np.array(found, dtype=np.int64)) is None) == (sorted(found) == truth)
