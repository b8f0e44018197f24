"""``ragpipe serve`` started for real: a subprocess of the CLI over a target with an active release,
ready, answering a keyed query, closing a silent socket at its header deadline (the CLI runs the
guarded connection layer), logging one access line per request without the query text, and
stopping on SIGINT without a traceback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import httpx
import yaml

from ragpipe.release.activation import activate
from ragpipe_tests.support.http_server import wait_for
from ragpipe_tests.support.paths import REPO
from ragpipe_tests.support.served_http import connect, read_until_closed
from ragpipe_tests.support.serving import Serving

QUERY = "walrus-heron-5521 signing keys"  # text that must not reach the log


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_ragpipe_serve_starts_serves_and_stops(serving: Serving, tmp_path):
    release = serving.releases["a1"]
    activate(serving.ws, release, "staging")
    config = tmp_path / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "keys": [entry.model_dump(mode="json") for entry in serving.key_entries],
                "limits": {"header_timeout_s": 0.5},
                "poll_interval_s": 0.1,
            }
        ),
        encoding="utf-8",
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ragpipe.cli",
            "serve",
            "--target",
            "staging",
            "--port",
            str(port),
            "--config",
            str(config),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},  # RAGPIPE_HOME/TARGETS: the fixture's
    )
    try:
        first = proc.stdout.readline() if proc.stdout else ""  # a condition: the line, or EOF if it died
        assert first == f"serving target 'staging' on {base} (ready at /readyz)\n", (first, proc.poll())
        # the socket is bound before that line: from here every request is answered (503 until ready)
        ready = wait_for(lambda: (r := httpx.get(f"{base}/readyz", timeout=30)).status_code == 200 and r, timeout=180)
        assert ready.json()["release"]["release_id"] == release
        r = httpx.post(
            f"{base}/v1/query",
            json={"query": QUERY, "k": 2},
            headers={"Authorization": f"Bearer {serving.keys['alice']}"},
            timeout=30,
        )
        assert r.status_code == 200 and r.headers["x-release-id"] == release and len(r.json()["hits"]) == 2
        silent = connect(base)
        try:
            assert read_until_closed(silent) == b""
        finally:
            silent.close()
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    # uvicorn shuts down gracefully, then re-raises the signal it caught; the CLI ends as a Ctrl-C
    # does, quietly, with 128 + SIGINT
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and QUERY.split()[0] not in stderr and QUERY.split()[0] not in stdout
    access = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    queries = [line for line in access if line["route"] == "/v1/query"]
    assert queries == [
        {
            "route": "/v1/query",
            "status": 200,
            "latency_ms": queries[0]["latency_ms"],
            "release_id": release,
            "subject": "alice",
            "hits": 2,
        }
    ]
    assert {line["route"] for line in access} == {"/readyz", "/v1/query"}
