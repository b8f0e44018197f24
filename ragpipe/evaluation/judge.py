"""The judge's request and its verdict contract ``ragpipe.judge/v1``.

**Request.** ``judge_request`` builds one ``ChatRequest`` from the judge spec and plain values: a
system message — the spec's prompt text (the rubric), a blank line, then the contract's
instruction for ``n`` required facts — and one user message::

    Question:
    <question>

    Required facts:
    1. <fact>
    …            ("(none)" when the case lists none)

    Answer:
    <answer text>   ("(empty)" for an empty answer)

    Citations:
    E1, E3          ("(none)")

    Cited evidence:
    [E1] <title>
    <text>          (``retrieval.context.render_evidence``, the one renderer of evidence text
                     that may leave the machine; "(none)" when nothing is cited)

The cited evidence is exactly the items the citations name, one each, in citation order.

**Verdict.** ``parse_verdict`` accepts a reply only if it is one JSON object with exactly the keys
``label`` (one of ``0_FAIL``, ``1_PARTIAL``, ``2_SUBSTANTIAL``, ``3_AUTHORITATIVE``), ``facts``
(``[{"index", "stated"}]``: exactly one entry per required fact, indices 1..n in order, ``stated``
a boolean), ``claims`` (``[{"text", "supported_by"}]``: a non-empty text, distinct labels drawn
from the cited labels), ``grounded`` (a boolean equal to "every claim has support"; an answer
without claims is grounded) and ``explanation`` (a string of at most 500 characters). Anything
else raises ``InvalidVerdict`` with a one-line reason. Decisions:

* a reply wrapped in one Markdown code fence (```` ```json … ``` ````) is **accepted**, as every
  model reply in ragpipe is (``work.chat.reply_body``): the fence adds no content; text before or
  after the fence, or two objects, is refused (not JSON);
* the JSON is read strictly (``kernel.strict_load.load_json``): a key given twice, ``NaN`` or
  nesting deeper than 64 levels is refused, never resolved by the parser's choice;
* a reply longer than ``MAX_REPLY_CHARS`` (64 Ki characters) is refused before it is parsed: a
  verdict for 500 characters of explanation and a few dozen claims is a few KB, so anything that
  long is not one, and parsing or recording it would cost what no verdict needs;
* lone surrogates (``\\ud800`` as a JSON escape, or in the text itself) are refused: a verdict is
  Unicode text, recorded and hashed as UTF-8.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import Field

from ragpipe.evaluation.contract_calls import contract_json
from ragpipe.evaluation.judge_spec import LABELS, JudgeSpec, Label
from ragpipe.kernel.ids import domain_digest
from ragpipe.kernel.models import FrozenModel
from ragpipe.retrieval.context import payload_digest, render_evidence
from ragpipe.work.chat import ChatMessage, ChatRequest
from ragpipe.work.entries import value_bytes

MAX_REPLY_CHARS = 65_536
MAX_EXPLANATION_CHARS = 500
KEYS = ("label", "facts", "claims", "grounded", "explanation")
INSTRUCTION = (
    'Reply with one JSON object and nothing else: {{"label": one of "0_FAIL", "1_PARTIAL", '
    '"2_SUBSTANTIAL", "3_AUTHORITATIVE", "facts": [{{"index": n, "stated": true or false}} for each of '
    'the {n} required facts, index 1 to {n} in order], "claims": [{{"text": string, "supported_by": '
    '[cited labels]}}], "grounded": true exactly when every claim has a supporting label, '
    '"explanation": at most 500 characters}}.'
)


class CitedEvidence(FrozenModel):
    """One item the answer cites: its label, the title and text sent, and its document's access
    scopes (they decide whether it may be sent; they are never sent)."""

    label: str = Field(min_length=1)
    title: str
    text: str
    access_scopes: tuple[str, ...]


class InvalidVerdict(ValueError):
    """A reply that breaks the verdict contract; ``str(e)`` is the rule, one line."""


class FactCheck(FrozenModel):
    index: int = Field(ge=1)
    stated: bool


class Claim(FrozenModel):
    text: str = Field(min_length=1)
    supported_by: tuple[str, ...]


class Verdict(FrozenModel):
    """A reply that met the contract (module docstring)."""

    label: Label
    facts: tuple[FactCheck, ...]
    claims: tuple[Claim, ...]
    grounded: bool
    explanation: str = Field(max_length=MAX_EXPLANATION_CHARS)

    @property
    def score(self) -> int:
        """The label's rank, 0 (``0_FAIL``) to 3 (``3_AUTHORITATIVE``)."""
        return LABELS.index(self.label)

    @property
    def stated(self) -> int:
        return sum(f.stated for f in self.facts)


def cited_payload(citations: Sequence[str], cited_evidence: Sequence[CitedEvidence]) -> str:
    """The cited evidence as sent: each cited item rendered (``render_evidence``) in citation
    order; ``ValueError`` if the evidence is not exactly the cited items, one each, or a citation
    repeats."""
    if len(set(citations)) != len(citations):
        raise ValueError(f"citations repeat a label: {list(citations)}")
    by_label = {e.label: e for e in cited_evidence}
    if len(by_label) != len(cited_evidence) or set(by_label) != set(citations):
        raise ValueError(
            f"cited evidence {[e.label for e in cited_evidence]} is not exactly the cited labels {list(citations)}"
        )
    return "\n".join(render_evidence(c, by_label[c].title, by_label[c].text) for c in citations)


def answer_digest(answer_text: str, citations: Sequence[str], cited_evidence: Sequence[CitedEvidence]) -> str:
    """``sha256:…`` (domain ``judge-answer``) of what is judged besides the case: the answer's
    exact text, its citations and the digest of the cited payload (``cited_payload``). Bytes are
    bound as given (``work.entries.value_bytes``), never normalised."""
    payload = cited_payload(citations, cited_evidence)
    value = {"text": answer_text, "citations": list(citations), "cited_payload": payload_digest(payload)}
    return domain_digest("judge-answer", 1, value_bytes(value))


def user_message(
    question: str,
    required_facts: Sequence[str],
    answer_text: str,
    citations: Sequence[str],
    cited_evidence: Sequence[CitedEvidence],
) -> str:
    """The user message (module docstring)."""
    facts = "\n".join(f"{i}. {' '.join(f.split())}" for i, f in enumerate(required_facts, 1)) or "(none)"
    evidence = cited_payload(citations, cited_evidence)
    return (
        f"Question:\n{question}\n\nRequired facts:\n{facts}\n\nAnswer:\n{answer_text or '(empty)'}\n\n"
        f"Citations:\n{', '.join(citations) or '(none)'}\n\nCited evidence:\n{evidence or '(none)'}"
    )


def judge_request(
    spec: JudgeSpec,
    question: str,
    required_facts: Sequence[str],
    answer_text: str,
    citations: Sequence[str],
    cited_evidence: Sequence[CitedEvidence],
) -> ChatRequest:
    """The chat request that asks ``spec``'s model for a verdict (module docstring)."""
    system = spec.prompt_text.rstrip() + "\n\n" + INSTRUCTION.format(n=len(required_facts))
    return ChatRequest(
        model=spec.model,
        messages=(
            ChatMessage(role="system", content=system),
            ChatMessage(
                role="user", content=user_message(question, required_facts, answer_text, citations, cited_evidence)
            ),
        ),
        temperature=spec.temperature,
        max_tokens=spec.max_tokens,
        seed=spec.seed,
        response_format="json_object",
    )


def _object(value: object, keys: set[str], what: str) -> dict:
    if not isinstance(value, dict) or set(value) != keys:
        raise InvalidVerdict(f"{what} must be an object with exactly the keys {', '.join(sorted(keys))}")
    return value


def _short(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_verdict(reply: str, n_facts: int, cited_labels: Sequence[str]) -> Verdict:
    """The verdict of a judge's reply, or ``InvalidVerdict`` naming the first broken rule
    (module docstring)."""
    obj = contract_json(reply, MAX_REPLY_CHARS, InvalidVerdict)
    if not isinstance(obj, dict) or set(obj) != set(KEYS):
        present = set(obj) if isinstance(obj, dict) else None
        missing = [k for k in KEYS if present is not None and k not in present]
        extra = sorted(present - set(KEYS)) if present is not None else []
        parts = [f"missing {', '.join(missing)}"] * bool(missing) + [f"unexpected {', '.join(extra)}"] * bool(extra)
        why = "; ".join(parts) if present is not None else "not an object"
        raise InvalidVerdict(f"reply must be an object with exactly the keys {', '.join(KEYS)} ({why})")
    label = obj["label"]
    if label not in LABELS or not isinstance(label, str):
        raise InvalidVerdict(f"label must be one of {', '.join(LABELS)}, not {_short(label)}")
    facts = obj["facts"]
    if not isinstance(facts, list):
        raise InvalidVerdict("facts must be a list")
    checks = []
    for i, fact in enumerate(facts, 1):
        fact = _object(fact, {"index", "stated"}, f"facts[{i}]")
        if type(fact["index"]) is not int or type(fact["stated"]) is not bool:
            raise InvalidVerdict(f"facts[{i}]: index must be an integer and stated a boolean")
        checks.append(fact["index"])
    if checks != list(range(1, n_facts + 1)):
        raise InvalidVerdict(
            f"facts must have one entry per required fact, indices 1..{n_facts} in order, not {_short(checks)}"
        )
    claims = obj["claims"]
    if not isinstance(claims, list):
        raise InvalidVerdict("claims must be a list")
    allowed = set(cited_labels)
    for i, claim in enumerate(claims, 1):
        claim = _object(claim, {"text", "supported_by"}, f"claims[{i}]")
        support = claim["supported_by"]
        if not isinstance(claim["text"], str) or not claim["text"].strip():
            raise InvalidVerdict(f"claims[{i}].text must be a non-empty string")
        if not isinstance(support, list) or not all(isinstance(s, str) for s in support):
            raise InvalidVerdict(f"claims[{i}].supported_by must be a list of labels")
        if len(set(support)) != len(support):
            raise InvalidVerdict(f"claims[{i}].supported_by repeats a label")
        foreign = [s for s in support if s not in allowed]
        if foreign:
            raise InvalidVerdict(f"claims[{i}].supported_by names {_short(foreign[0])}, which the answer does not cite")
    grounded = obj["grounded"]
    if type(grounded) is not bool:
        raise InvalidVerdict("grounded must be a boolean")
    supported = all(c["supported_by"] for c in claims)
    if grounded != supported:
        raise InvalidVerdict(
            f"grounded is {str(grounded).lower()} but {'every claim has' if supported else 'a claim has no'} support"
        )
    explanation = obj["explanation"]
    if not isinstance(explanation, str):
        raise InvalidVerdict("explanation must be a string")
    if len(explanation) > MAX_EXPLANATION_CHARS:
        raise InvalidVerdict(f"explanation has {len(explanation)} characters, more than {MAX_EXPLANATION_CHARS}")
    return Verdict(
        label=label,
        facts=tuple(FactCheck(index=f["index"], stated=f["stated"]) for f in facts),
        claims=tuple(Claim(text=c["text"], supported_by=tuple(c["supported_by"])) for c in claims),
        grounded=grounded,
        explanation=explanation,
    )
