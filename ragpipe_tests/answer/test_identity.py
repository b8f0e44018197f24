"""The answer plan's identity covers the prompt texts, and what is served is bound into the query
trace and the authorization certificate."""

from __future__ import annotations

import pytest

from ragpipe.answer import identity
from ragpipe.answer.answering import answer
from ragpipe.answer.identity import answer_plan_id
from ragpipe.kernel.ids import content_id
from ragpipe.retrieval.plan import GeneratorPlan, load_plan, query_plan_id
from ragpipe.retrieval.retriever import Retriever


def test_the_answer_plan_id_binds_the_plan_section_and_every_prompt_text(monkeypatch: pytest.MonkeyPatch):
    plan = load_plan()
    base = answer_plan_id(plan)
    assert base == content_id(
        "answer-plan", 2, {"plan": plan.answer.model_dump(mode="json"), "prompt": identity.PROMPT_TEXTS}
    )
    other_model = plan.model_copy(
        update={"answer": plan.answer.model_copy(update={"generator": GeneratorPlan(kind="litellm", model="m")})}
    )
    assert answer_plan_id(other_model) != base
    for text in identity.PROMPT_TEXTS:
        edited = {**identity.PROMPT_TEXTS, text: identity.PROMPT_TEXTS[text] + " "}
        monkeypatch.setattr(identity, "PROMPT_TEXTS", edited)
        assert answer_plan_id(plan) != base, text  # one more space in any prompt text is another plan
        monkeypatch.undo()
    assert query_plan_id(plan) == query_plan_id(other_model)  # the retrieval half is unchanged


def test_the_release_served_is_in_the_trace_the_result_and_the_certificate(scoped_bundles):
    retriever = Retriever(scoped_bundles[0])
    plain = retriever.query("aspirin stroke", k=2, trace=True)
    assert plain.trace["release_id"] is None and "release_id" not in plain.as_dict()
    direct = answer(retriever, "Does low-dose aspirin reduce the risk of a first stroke?")
    retriever.release_id = "sha256:" + "e" * 64  # what ragpipe.api / the server set for a release
    served = retriever.query("aspirin stroke", k=2, trace=True)
    assert served.trace["release_id"] == served.as_dict()["release_id"] == retriever.release_id
    released = answer(retriever, "Does low-dose aspirin reduce the risk of a first stroke?")
    assert released.certificate_id != direct.certificate_id  # same evidence, another release: another ID
    retriever.close()
