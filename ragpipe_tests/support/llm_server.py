"""A real OpenAI-compatible HTTP server on 127.0.0.1 for testing the litellm path.

It speaks ``POST /v1/chat/completions`` and answers according to ``server.scenario``; every request
body is recorded — raw bytes in ``server.bodies``, parsed in ``server.requests`` — so tests can
inspect exactly what left the process — and every accepted TCP connection is counted in
``server.connections``, so "nothing was sent" can be asserted as "nothing even connected".

Scenario ``"responder"`` answers with ``server.responder(request)`` (deterministic content computed
from the request, e.g. questions about the chunk it carries). Before the scenario applies, each
request takes the next entry of ``server.faults`` if there is one:

* ``"429:<seconds>"`` — 429 with ``Retry-After: <seconds>``;
* ``"500"`` — a server error; ``"timeout"`` — no answer until the client gives up;
* ``"malformed"`` — 200 with a body that is not JSON;
* ``"partial"`` — 200 whose body stops half-way (the connection closes before ``Content-Length``);
* ``"content:<text>"`` — 200, a well-formed completion whose message is ``<text>`` (an invalid
  verdict, wrong keys: whatever reply a test needs, once);
* ``"refusal"`` — 200, the model declines: ``message.content`` null, ``message.refusal`` set;
* ``"content_filter"`` — 200, the provider filtered the reply: empty content,
  ``finish_reason: content_filter``.

``judge_reply(request)`` is a responder for the answer judge (``ragpipe.evaluation.judge``): it
reads the request's required facts, answer and citations and returns a valid verdict — a fact is
stated when its words appear in the answer, each answer sentence is a claim supported by every
cited label, and the label follows the share of facts stated.

``draft_reply(request)`` is a responder for the case drafter (``ragpipe.evaluation.drafting``): it
reads the number of cases asked for from the system message and writes question ``i`` about the
eight words of the chunk's text from word ``4i`` on (wrapping around), with the first four of them
as its one required fact.

Usage is deterministic: ``prompt_tokens`` counts the whitespace-separated words of every message,
``completion_tokens`` those of the reply, so a test can compute cost by hand. ``delay`` seconds are
waited before each successful reply (a generation a test can kill in the middle of).
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def words(text: str) -> int:
    return len(text.split())


def completion(
    content: str | None, request: dict | None = None, *, refusal: str | None = None, finish_reason: str = "stop"
) -> dict:
    prompt = sum(words(str(m.get("content", ""))) for m in (request or {}).get("messages", [])) if request else 1
    done = words(content or refusal or "") if request else 1
    message: dict = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "local-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done},
    }


def _section(text: str, title: str, following: tuple[str, ...]) -> str:
    """The lines between ``<title>:`` and the next of ``following`` in a judge request."""
    start = text.index(f"\n{title}:\n") + len(title) + 3
    ends = [i for t in following if (i := text.find(f"\n{t}:", start)) >= 0]
    return text[start : min(ends) if ends else len(text)].strip()


def judge_reply(request: dict) -> str:
    """A valid verdict for a judge request (module docstring)."""
    text = "\n" + request["messages"][-1]["content"]
    facts_text = _section(text, "Required facts", ("Answer",))
    facts = [line.split(". ", 1)[1] for line in facts_text.splitlines() if ". " in line]
    answer = _section(text, "Answer", ("Citations",))
    cited = _section(text, "Citations", ("Cited evidence",))
    labels = [] if cited == "(none)" else cited.split(", ")
    stated = [all(w.lower() in answer.lower() for w in fact.split()) for fact in facts]
    share = sum(stated) / len(facts) if facts else 1.0
    label = "3_AUTHORITATIVE" if share == 1 else "2_SUBSTANTIAL" if share >= 0.5 else "1_PARTIAL" if share else "0_FAIL"
    sentences = [s.strip() for s in answer.split(". ") if s.strip() and answer != "(empty)"]
    claims = [{"text": s, "supported_by": labels} for s in sentences]
    verdict = {
        "label": label,
        "facts": [{"index": i + 1, "stated": s} for i, s in enumerate(stated)],
        "claims": claims,
        "grounded": all(c["supported_by"] for c in claims),
        "explanation": f"{sum(stated)} of {len(facts)} required facts stated.",
    }
    return json.dumps(verdict)


def draft_reply(request: dict) -> str:
    """Valid drafts for a case-draft request (module docstring)."""
    n = int(request["messages"][0]["content"].split("holding exactly ", 1)[1].split(" ", 1)[0])
    user = request["messages"][-1]["content"]
    text = user.partition("\n\n")[2] if user.startswith("Title: ") else user
    words = text.split() * 3  # a window past the end wraps around
    cases = []
    for i in range(n):
        about = " ".join(words[4 * i : 4 * i + 8]).rstrip(".,;:")
        cases.append(
            {"question": f"What is reported about {about}?", "required_facts": [" ".join(words[4 * i : 4 * i + 4])]}
        )
    return json.dumps({"cases": cases})


class Handler(BaseHTTPRequestHandler):
    server: LLMServer
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes; with Nagle on, the second waits for the client's
    # delayed ACK (~40 ms a reply on Linux) — latency no real endpoint adds.
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = json.loads(body)
        with self.server.lock:
            self.server.bodies.append(body)
            self.server.requests.append(request)
            fault = self.server.faults.popleft() if self.server.faults else None
        if fault is not None and self._fault(fault, request):
            return
        scenario = self.server.scenario
        if scenario == "timeout":
            self.server.release.wait(10)  # the client gives up long before this
            return
        if scenario == "http500":
            self._send(500, {"error": {"message": "internal error", "type": "server_error"}})
            return
        if scenario == "responder":
            content = self.server.responder(request)
        else:
            content = self.server.replies.get(scenario)
            if content is None:
                raise AssertionError(f"unknown scenario {scenario}")
        if self.server.delay:
            time.sleep(self.server.delay)
        reply = completion(content, request if scenario == "responder" else None)
        if not self.server.report_usage:  # a provider that reports no token counts
            del reply["usage"]
        self._send(200, reply)
        with self.server.answered_changed:
            self.server.answered += 1
            self.server.answered_changed.notify_all()

    def _fault(self, fault: str, request: dict) -> bool:
        """Answer with ``fault``; False for ``"ok"`` (the scenario answers)."""
        if fault.startswith("429:"):
            error = {"error": {"message": "rate limited", "type": "rate_limit_error"}}
            self._send(429, error, {"Retry-After": fault.split(":", 1)[1]})
        elif fault == "500":
            self._send(500, {"error": {"message": "internal error", "type": "server_error"}})
        elif fault == "timeout":
            self.server.release.wait(10)
        elif fault == "malformed":
            self._raw(200, b"<html>this is not json</html>")
        elif fault == "partial":
            data = json.dumps(completion("cut")).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
        elif fault.startswith("content:"):
            self._send(200, completion(fault.split(":", 1)[1], request))
        elif fault == "refusal":
            self._send(200, completion(None, request, refusal="I can't help with judging this."))
        elif fault == "content_filter":
            self._send(200, completion("", request, finish_reason="content_filter"))
        elif fault == "ok":
            return False
        else:
            raise AssertionError(f"unknown fault {fault}")
        return True

    def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        self._raw(status, json.dumps(payload).encode(), headers)

    def _raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class LLMServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0):
        super().__init__(("127.0.0.1", port), Handler)
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.bodies: list[bytes] = []
        self.connections = 0
        self.answered = 0
        self.answered_changed = threading.Condition(self.lock)
        self.scenario = "valid"
        self.faults: collections.deque[str] = collections.deque()
        self.responder: Callable[[dict], str] = lambda request: ""
        self.delay = 0.0
        self.report_usage = True
        self.release = threading.Event()
        self.replies: dict[str, str] = {}
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def verify_request(self, request, client_address) -> bool:
        self.connections += 1  # called by the serving thread for every accepted connection
        return True

    def wait_answered(self, count: int, timeout: float) -> bool:
        """Block until ``count`` replies were sent (False if ``timeout`` seconds pass first)."""
        with self.answered_changed:
            return self.answered_changed.wait_for(lambda: self.answered >= count, timeout)

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self) -> LLMServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()
