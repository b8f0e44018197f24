"""``recall_of``: how much of exact search's result list an approximate list holds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.index.hits import recall_of

IDS = st.lists(st.sampled_from([f"r{i}" for i in range(30)]), unique=True, max_size=12)


@given(approximate=IDS, exact=IDS, data=st.data())
def test_laws_of_recall(approximate, exact, data):
    value = recall_of(approximate, exact)
    assert 0.0 <= value <= 1.0
    found = len(set(approximate) & set(exact))
    assert value == (found / len(exact) if exact else 1.0)
    # the order of either list does not matter
    assert recall_of(data.draw(st.permutations(approximate)), data.draw(st.permutations(exact))) == value
    # 1 exactly when every exact ID was found
    assert (value == 1.0) == set(exact).issubset(approximate)
    # finding more never lowers it
    extra = data.draw(IDS)
    assert recall_of(list(dict.fromkeys(approximate + extra)), exact) >= value
    # two lists of one length: as much of either is in the other
    if len(approximate) == len(exact):
        assert recall_of(exact, approximate) == value


@given(ids=IDS)
def test_a_list_finds_itself(ids):
    assert recall_of(ids, ids) == 1.0
    assert recall_of([], ids) == (0.0 if ids else 1.0)


def test_a_list_naming_an_id_twice_is_refused():
    with pytest.raises(ValueError, match="the approximate list names 'a' twice"):
        recall_of(["a", "b", "a"], ["a"])
    with pytest.raises(ValueError, match="the exact list names 'b' twice"):
        recall_of(["a"], ["b", "b"])
