"""A real OpenAI-compatible HTTP server on 127.0.0.1 for testing the litellm path.

It speaks ``POST /v1/chat/completions`` and answers according to ``server.scenario``; every request
body is recorded — raw bytes in ``server.bodies``, parsed in ``server.requests`` — so tests can
inspect exactly what left the process — and every accepted TCP connection is counted in
``server.connections``, so "nothing was sent" can be asserted as "nothing even connected".
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(content: str) -> dict:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": 0,
        "model": "local-test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


class Handler(BaseHTTPRequestHandler):
    server: LLMServer

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.bodies.append(body)
        self.server.requests.append(json.loads(body))
        scenario = self.server.scenario
        if scenario == "timeout":
            self.server.release.wait(10)  # the client gives up long before this
            return
        if scenario == "http500":
            self._send(500, {"error": {"message": "internal error", "type": "server_error"}})
            return
        content = self.server.replies.get(scenario)
        if content is None:
            raise AssertionError(f"unknown scenario {scenario}")
        self._send(200, completion(content))

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class LLMServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[dict] = []
        self.bodies: list[bytes] = []
        self.connections = 0
        self.scenario = "valid"
        self.release = threading.Event()
        self.replies: dict[str, str] = {}
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def verify_request(self, request, client_address) -> bool:
        self.connections += 1  # called by the serving thread for every accepted connection
        return True

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
