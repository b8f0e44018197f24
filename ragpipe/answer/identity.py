"""The answer plan's identity: what a release binds as ``answer_plan_id``.

It covers every input that can change an answer besides the retrieval half of the query plan:
the plan's ``answer`` section (generator kind, model, endpoint, temperature, seed, limits, the
answer contract's version) and the texts of the prompt (``ragpipe.answer.prompt``: instructions,
evidence format, question template). v2: v1 covered the plan section only, so editing the prompt
left release IDs unchanged.
"""

from __future__ import annotations

from ragpipe.answer.prompt import PROMPT_TEXTS
from ragpipe.kernel.ids import content_id
from ragpipe.retrieval.plan import QueryPlan


def answer_plan_id(plan: QueryPlan) -> str:
    """The content ID of the plan's answer half and the prompt texts (module docstring)."""
    return content_id("answer-plan", 2, {"plan": plan.answer.model_dump(mode="json"), "prompt": PROMPT_TEXTS})
