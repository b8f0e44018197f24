"""``Prefilter``: which rows a search may return."""

from __future__ import annotations

import numpy as np

from ragpipe.index.prefilter import Prefilter
from ragpipe.index.selection import Selection


def selection(admitted: set[str], others: set[str]) -> Selection:
    return Selection(frozenset(admitted), frozenset(others), np.zeros(0, dtype=bool))


def test_admits_nothing_without_scopes_or_with_an_empty_selection():
    assert Prefilter(()).admits_nothing
    assert not Prefilter(("public",)).admits_nothing
    assert Prefilter(("public",), selection=selection(set(), {"d1"})).admits_nothing
    assert not Prefilter(("public",), selection=selection({"d1"}, set())).admits_nothing


def test_excluding_replaces_the_excluded_documents_and_keeps_the_rest():
    base = Prefilter(("public",), ("d0",), ("primary",))
    assert base.excluding({"d1", "d2"}) == Prefilter(("public",), {"d1", "d2"}, ("primary",))
    assert base.exclude_documents == ("d0",)  # frozen: the original is unchanged
