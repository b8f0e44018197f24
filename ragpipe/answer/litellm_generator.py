"""The litellm generator: answers through ``ragpipe.work.chat`` (the litellm adapter).

It sends the question and the certified evidence to the plan's model, asks for a JSON object
``{"answer": str, "citations": [label, ...], "abstained": bool}``, and turns timeouts, HTTP errors
and malformed output into typed failures. The request carries three messages and nothing else:
constant instructions, the evidence payload — exactly the text the authorization certificate
covers, recomputed from the certified evidence by ``AuthorizationCertificate.require_payload``,
which refuses before any network call when the context differs from what was certified — and the
caller's question. Responses are cached by the full effective provider configuration + prompt
digest + certified payload digest + question.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ragpipe.answer.generators import CandidateAnswer, GeneratorFailure
from ragpipe.answer.prompt import PROMPT_DIGEST, build_messages
from ragpipe.kernel.ids import bytes_digest, content_id
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.retrieval.authz import AuthorizationCertificate
from ragpipe.retrieval.context import Context, payload_digest
from ragpipe.retrieval.plan import GeneratorPlan
from ragpipe.work.chat import ChatMessage, ChatRequest, complete, llm_api_key, reply_json
from ragpipe.work.failures import StepFailure
from ragpipe.work.usage import Usage, load_prices

log = logging.getLogger(__name__)


def _value_bytes(value: dict) -> bytes:
    """What a cached answer's digest covers: its fields exactly (json, not the canonical encoder,
    which NFC-normalises strings and so would not bind the model's own bytes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _typed(value, kind: type):
    """``value`` if it is a ``kind`` (a cached entry's fields are checked, not trusted)."""
    if type(value) is not kind:
        raise TypeError(f"a cached field is {type(value).__name__}, not {kind.__name__}")
    return value


def parse_model_json(content: str) -> tuple[str, tuple[str, ...], bool]:
    """Parse the model's reply; raise ValueError describing what is malformed."""
    obj = reply_json(content)
    if not isinstance(obj, dict) or set(obj) != {"answer", "citations", "abstained"}:
        raise ValueError("reply must be an object with exactly the keys answer, citations, abstained")
    answer, citations, abstained = obj["answer"], obj["citations"], obj["abstained"]
    if not isinstance(answer, str) or not isinstance(abstained, bool):
        raise ValueError("answer must be a string and abstained a boolean")
    if not isinstance(citations, list) or not all(isinstance(c, str) for c in citations):
        raise ValueError("citations must be a list of label strings")
    return answer, tuple(citations), abstained


def _priced(usage: Usage) -> Usage:
    """A cached call's usage priced by today's table, as a cold cache would price it (the tokens
    are the call's; the price is configuration, not part of what was cached)."""
    if not usage.metered:
        return usage
    return usage.model_copy(
        update={"cost_micros": load_prices().cost_micros(usage.model, usage.input_tokens, usage.output_tokens)}
    )


class LiteLLMGenerator:
    def __init__(self, plan: GeneratorPlan, bundle_id: str, cache_dir: Path | None = None, api_key: str | None = None):
        if not plan.model:
            raise ValueError("the litellm generator needs answer.generator.model in the query plan (or --model)")
        self.plan = plan
        self.bundle_id = bundle_id
        self.cache_dir = cache_dir
        self.api_key = api_key or llm_api_key() or "no-key"
        self.name = f"litellm:{plan.model}"

    def provider_config(self) -> dict[str, object]:
        p = self.plan
        return {
            "model": p.model,
            "api_base": p.api_base,
            "temperature": p.temperature,
            "seed": p.seed,
            "max_tokens": p.max_tokens,
            "response_format": "json_object",
        }

    def cache_key(self, question: str, certified_payload_digest: str) -> str:
        # v3: the question's exact UTF-8 bytes are bound by digest (a question is whatever the
        # caller sent, NFC or not; the canonical encoder refuses rather than normalises).
        return content_id(
            "answer-cache",
            3,
            {
                "provider": self.provider_config(),
                "prompt": PROMPT_DIGEST,
                "payload": certified_payload_digest,
                "question": bytes_digest(question.encode("utf-8", "surrogatepass")),
            },
        )

    def _cached(self, key: str) -> CandidateAnswer | None:
        """The cached answer of ``key`` if its entry verifies: it names ``key`` and its value's
        digest recomputes. A bad entry is logged, set aside as ``<file>.refused`` and asked again."""
        if self.cache_dir is None:
            return None
        path = self.cache_dir / f"{key.split(':')[1]}.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("answer cache: %s: cannot read: %s; asking the model again", path, exc.strerror or exc)
            return None
        try:
            entry = json.loads(data.decode("utf-8"))
            value = entry["value"]
            if entry["key"] != key:
                raise ValueError(f"names key {entry['key']!r}, not {key!r}")
            if entry["value_digest"] != bytes_digest(_value_bytes(value)):
                raise ValueError("its value does not match its value digest")
            if value.get("usage") is None:
                # written before usage was kept: serving it would report an unknown cost that a
                # cold cache would know, so cache state would change a gate decision
                log.info("answer cache: %s: no usage recorded; asking the model again", path)
                return None
            answer = CandidateAnswer(
                answer=_typed(value["answer"], str),
                citations=tuple(_typed(c, str) for c in _typed(value["citations"], list)),
                abstained=_typed(value["abstained"], bool),
                raw=_typed(value["raw"], str),
                cached=True,
                usage=_priced(Usage.model_validate(value["usage"])),
                calls=1,
            )
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("answer cache: %s: %s; set aside as %s.refused, asking the model again", path, exc, path.name)
            try:
                os.replace(path, path.with_name(path.name + ".refused"))
            except OSError:
                pass  # unmovable: still never used
            return None
        return answer

    def _store(self, key: str, cand: CandidateAnswer) -> None:
        if self.cache_dir is not None:
            value = {
                "answer": cand.answer,
                "citations": list(cand.citations),
                "abstained": cand.abstained,
                "raw": cand.raw,
                "usage": None if cand.usage is None else cand.usage.model_dump(),
            }
            entry = {"key": key, "value": value, "value_digest": bytes_digest(_value_bytes(value))}
            write_file_atomic(self.cache_dir / f"{key.split(':')[1]}.json", json.dumps(entry, sort_keys=True).encode())

    def generate(self, question: str, context: Context, certificate: AuthorizationCertificate) -> CandidateAnswer:
        """Raises ``AuthorizationError`` (nothing sent, nothing read from the cache) unless the
        certificate covers exactly the payload derived from the context's evidence."""
        # Authorization before disclosure: the evidence text sent is recomputed from certified
        # evidence, never taken from ``context.rendered``.
        payload = certificate.require_payload(self.bundle_id, context)
        key = self.cache_key(question, payload_digest(payload))
        if (hit := self._cached(key)) is not None:
            return hit
        request = ChatRequest(
            model=self.plan.model,
            messages=tuple(ChatMessage(**m) for m in build_messages(payload, question)),
            temperature=self.plan.temperature,
            max_tokens=self.plan.max_tokens,
            seed=self.plan.seed,
            response_format="json_object",
        )
        try:
            reply = complete(
                request,
                api_base=self.plan.api_base,
                api_key=self.api_key,
                timeout=self.plan.timeout_seconds,
                prices=load_prices(),
            )
        except StepFailure as failure:  # every provider error is a typed failure, never a crash
            # a failed call may still be billed: its usage is unknown (StepFailure.usage when reported)
            return CandidateAnswer(
                "", (), True, failure=GeneratorFailure(failure.detail, failure.message), usage=failure.usage, calls=1
            )
        content, usage = reply.content, reply.usage
        try:
            answer, citations, abstained = parse_model_json(content)
        except ValueError as exc:
            failure = GeneratorFailure("malformed_output", str(exc))
            return CandidateAnswer("", (), True, failure=failure, raw=content, usage=usage, calls=1)
        cand = CandidateAnswer(
            answer=answer, citations=citations, abstained=abstained, raw=content, usage=usage, calls=1
        )
        self._store(key, cand)
        return cand
