"""A real embeddings HTTP server on 127.0.0.1 for testing the litellm embedder path.

It speaks OpenAI's ``POST /v1/embeddings`` (``{"model", "input": [...], "encoding_format"?,
"dimensions"?}`` → ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
"model", "usage": {"prompt_tokens", "total_tokens"}}``, the embedding as a list of floats or, when
asked, base64 little-endian float32) and Ollama's ``POST /api/embed`` (``{"model", "input"}`` →
``{"model", "embeddings", "prompt_eval_count"}``). Every request body is recorded — raw bytes in
``server.bodies``, parsed in ``server.requests`` — and every accepted connection counted in
``server.connections``, so "nothing was sent" can be asserted as "nothing even connected".

Vectors are deterministic: ``vector_for(model, text, dimensions)`` — SHAKE-256 of the model and
the text, read as ``dimensions`` unsigned 32-bit integers mapped to [-1, 1) and rounded to float32,
so every value is exact in JSON and a test computes the expected vector itself. A request's
``dimensions`` (OpenAI's shortening) replaces ``server.dimensions``. Usage is deterministic too:
``prompt_tokens`` counts the whitespace-separated words of every input.

Before answering, each request takes the next entry of ``server.faults`` if there is one:

* ``"429:<seconds>"`` — 429 with ``Retry-After: <seconds>``; ``"500"`` — a server error;
  ``"400"`` — a client error; ``"timeout"`` — no answer until the client gives up;
* ``"malformed"`` — 200 with a body that is not JSON;
* ``"wrong_dims"`` — every vector one component short; ``"nan"`` / ``"inf"`` — the first vector's
  first component is NaN / infinite (JSON's non-standard ``NaN`` / ``Infinity``);
* ``"wrong_count"`` — one embedding fewer than inputs; ``"bad_index"`` — two items with index 0;
* ``"reversed"`` — the items in reverse order, each with its right ``index`` (a correct client
  orders them by index);
* ``"ok"`` — answer normally.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


def vector_for(model: str, text: str, dimensions: int) -> np.ndarray:
    """The server's vector for ``text`` (module docstring), float32."""
    raw = hashlib.shake_256(f"{model}\0{text}".encode()).digest(4 * dimensions)
    ints = np.frombuffer(raw, dtype="<u4").astype(np.float64)
    return (ints / 2.0**31 - 1.0).astype(np.float32)


def words(text: str) -> int:
    return len(text.split())


class Handler(BaseHTTPRequestHandler):
    server: EmbeddingsServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = json.loads(body)
        with self.server.lock:
            self.server.bodies.append(body)
            self.server.requests.append(request)
            self.server.paths.append(self.path)
            self.server.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
            fault = self.server.faults.popleft() if self.server.faults else None
            self.server.received.notify_all()
        if self.path.rstrip("/") not in ("/v1/embeddings", "/embeddings", "/api/embed"):
            self._send(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
            return
        if fault is not None and self._fault(fault):
            return
        inputs = request.get("input")
        inputs = [inputs] if isinstance(inputs, str) else list(inputs or [])
        model = str(request.get("model", ""))
        dims = int(request.get("dimensions") or self.server.dimensions)
        if self.server.gate is not None:  # a test holds the answer until it has seen what it waits for
            self.server.gate.wait(30)
        vectors = [vector_for(model, text, dims) for text in inputs]
        tokens = sum(words(t) for t in inputs)
        if fault == "wrong_dims":
            vectors = [v[:-1] for v in vectors]
        values = [[float(x) for x in v] for v in vectors]
        if fault in ("nan", "inf") and values:
            values[0][0] = float("nan") if fault == "nan" else float("inf")
        if self.path.rstrip("/") == "/api/embed":
            self._send(200, {"model": model, "embeddings": values, "prompt_eval_count": tokens})
        else:
            self._send(200, self._openai(model, request, vectors, values, tokens, fault))
        with self.server.lock:
            self.server.answered += 1

    def _openai(self, model, request, vectors, values, tokens, fault) -> dict:
        as_base64 = request.get("encoding_format") == "base64" and fault not in ("nan", "inf")
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else values[i],
            }
            for i, v in enumerate(vectors)
        ]
        if fault == "wrong_count":
            data = data[:-1]
        elif fault == "bad_index" and len(data) > 1:
            data[1]["index"] = 0
        elif fault == "reversed":
            data = data[::-1]
        reply = {"object": "list", "data": data, "model": model}
        if self.server.report_usage:
            reply["usage"] = {"prompt_tokens": tokens, "total_tokens": tokens}
        return reply

    def _fault(self, fault: str) -> bool:
        """Answer with ``fault``; False when the normal answer follows (possibly altered)."""
        if fault.startswith("429:"):
            error = {"error": {"message": "rate limited", "type": "rate_limit_error"}}
            self._send(429, error, {"Retry-After": fault.split(":", 1)[1]})
        elif fault == "500":
            self._send(500, {"error": {"message": "internal error", "type": "server_error"}})
        elif fault == "400":
            self._send(400, {"error": {"message": "input too long", "type": "invalid_request_error"}})
        elif fault == "timeout":
            self.server.release.wait(10)
        elif fault == "malformed":
            self._raw(200, b"<html>this is not json</html>")
        elif fault in ("ok", "wrong_dims", "nan", "inf", "wrong_count", "bad_index", "reversed"):
            return False
        else:
            raise AssertionError(f"unknown fault {fault}")
        return True

    def _send(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        # allow_nan: the "nan"/"inf" faults send JSON's non-standard NaN / Infinity, as a broken server would
        self._raw(status, json.dumps(payload, allow_nan=True).encode(), headers)

    def _raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


class EmbeddingsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, dimensions: int = 8, port: int = 0):
        super().__init__(("127.0.0.1", port), Handler)
        self.dimensions = dimensions
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.headers_seen: list[dict] = []
        self.connections = 0
        self.answered = 0
        self.faults: collections.deque[str] = collections.deque()
        self.gate: threading.Event | None = None
        self.received = threading.Condition(self.lock)
        self.report_usage = True
        self.release = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def verify_request(self, request, client_address) -> bool:
        self.connections += 1
        return True

    @property
    def api_base(self) -> str:
        """The OpenAI-compatible base URL (``openai/<model>`` with this ``api_base``)."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    @property
    def ollama_base(self) -> str:
        """The Ollama base URL (``ollama/<model>`` with this ``api_base``)."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def inputs(self) -> list[list[str]]:
        """The texts of every request, in order."""
        return [[r["input"]] if isinstance(r["input"], str) else list(r["input"]) for r in self.requests]

    def __enter__(self) -> EmbeddingsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()
