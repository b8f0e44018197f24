"""``ContractCall`` is abstract: only a contract that defines ``parse`` is an item."""

from __future__ import annotations

import pytest

from ragpipe.evaluation.contract_calls import ContractCall
from ragpipe.evaluation.drafting import DraftInput
from ragpipe.evaluation.judge_step import JudgeInput
from ragpipe.work.chat import ChatMessage, ChatRequest

REQUEST = ChatRequest(model="m", messages=(ChatMessage(role="user", content="q"),), temperature=0, max_tokens=8)


def test_the_base_cannot_be_instantiated():
    with pytest.raises(
        TypeError, match=r"^Can't instantiate abstract class ContractCall with.* abstract method '?parse'?$"
    ):
        ContractCall({"a": 1}, REQUEST)


def test_a_subclass_without_parse_cannot_be_instantiated():
    class NoContract(ContractCall):
        pass

    with pytest.raises(
        TypeError, match=r"^Can't instantiate abstract class NoContract with.* abstract method '?parse'?$"
    ):
        NoContract({"a": 1}, REQUEST)


def test_the_judge_and_the_drafter_define_the_contract():
    assert ContractCall.__abstractmethods__ == frozenset({"parse"})
    assert JudgeInput.__abstractmethods__ == frozenset()
    assert DraftInput.__abstractmethods__ == frozenset()
    with pytest.raises(ValueError):
        JudgeInput({"a": 1}, REQUEST, n_facts=1, cited_labels=()).parse("not json")
