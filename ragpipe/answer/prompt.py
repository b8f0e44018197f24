"""The answer prompt: every text besides the certified evidence and the question that shapes an
LLM's answer. It is part of the answer plan's identity (``ragpipe.answer.identity``): editing a
word of it changes the answer plan ID, hence the release ID, and misses the answer cache.
"""

from __future__ import annotations

from ragpipe.kernel.ids import content_id
from ragpipe.retrieval.context import PAYLOAD_FORMAT

INSTRUCTIONS = """You answer questions using only the evidence in the next message. Each evidence item starts with a label like [E1].
The message after it is the question.
Reply with one JSON object and nothing else: {"answer": string, "citations": [labels], "abstained": boolean}.
Cite every label you use, each once. If the evidence does not answer the question, reply with
{"answer": "", "citations": [], "abstained": true}."""
QUESTION_TEMPLATE = "Question: {question}"
PROMPT_TEXTS = {"instructions": INSTRUCTIONS, "evidence_format": PAYLOAD_FORMAT, "question": QUESTION_TEMPLATE}
# Everything besides the certified payload and the question that shapes the request.
PROMPT_DIGEST = content_id("answer-prompt", 1, PROMPT_TEXTS)


def build_messages(payload: str, question: str) -> list[dict[str, str]]:
    """The whole request body's messages: the instructions (constant), the certified evidence
    payload verbatim as one message, the question. No other text leaves the machine."""
    return [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": payload},
        {"role": "user", "content": QUESTION_TEMPLATE.format(question=question)},
    ]
