"""``ragpipe serve-key`` and ``ragpipe serve``'s configuration errors, through the real command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from ragpipe.server.config import ServeConfig
from ragpipe.server.keys import key_matches, split_key
from ragpipe_tests.support.cli import run_cli
from ragpipe_tests.support.paths import REPO


def ragpipe(*args: str, home: Path) -> subprocess.CompletedProcess:
    return run_cli(*args, env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}, home=home, inherit=False, timeout=120)


def test_serve_key_prints_a_key_and_the_entry_that_accepts_it(tmp_path: Path):
    text = ragpipe("serve-key", "ops", "--subject", "ops: bot", "--scope", "public", "--scope", "staff", home=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    key = lines[0].removeprefix("key (shown once, store it now): ")
    assert lines[1] == "add to serve.yaml:"
    config = ServeConfig.model_validate(yaml.safe_load("\n".join(lines[2:])))
    (entry,) = config.keys
    assert (entry.id, entry.subject, entry.scopes) == ("ops", "ops: bot", ("public", "staff"))
    assert key_matches(split_key(key)[1], entry.hash)
    as_json = json.loads(
        ragpipe("serve-key", "ops", "--subject", "s", "--scope", "public", "--json", home=tmp_path).stdout
    )
    assert set(as_json) == {"key", "entry"} and as_json["key"] != key
    assert as_json["entry"]["roles"] == []


def test_serve_key_gives_the_reviewer_role_and_refuses_others(tmp_path: Path):
    made = ragpipe(
        "serve-key", "rita", "--subject", "rita", "--scope", "public", "--role", "reviewer", "--json", home=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert ServeConfig.model_validate({"keys": [json.loads(made.stdout)["entry"]]}).keys[0].roles == ("reviewer",)
    refused = ragpipe("serve-key", "x", "--subject", "x", "--scope", "public", "--role", "admin", home=tmp_path)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr == "error: roles.0: Input should be 'reviewer'\n"


def test_bad_input_is_one_line_and_exit_1(tmp_path: Path):
    (tmp_path / "serve.yaml").write_text("limits: {max_k: -1}\n", encoding="utf-8")
    cases = {
        (
            "serve-key",
            "Bad",
            "--subject",
            "s",
            "--scope",
            "public",
        ): "error: key ID 'Bad' must match ^[a-z0-9][a-z0-9-]{0,31}$",
        (
            "serve-key",
            "ok",
            "--subject",
            "s",
            "--scope",
            "no spaces",
        ): "error: scopes: invalid scope name 'no spaces'",
        ("serve", "--config", str(tmp_path / "serve.yaml")): (
            f"error: {tmp_path / 'serve.yaml'}: invalid serve config: limits.max_k: Input should be greater than or equal to 1"
        ),
        ("serve", "--target", "nope"): "error: unknown target 'nope': declared targets are production, staging",
    }
    for args, message in cases.items():
        result = ragpipe(*args, home=tmp_path)
        assert (result.returncode, result.stdout, result.stderr) == (1, "", message + "\n"), args


def started_serve(tmp_path: Path, config: Path | None) -> tuple[str, str]:
    """Start ``ragpipe serve`` on a free loopback port, wait until it says it serves (it has bound
    its socket by then: a request waits in the backlog until uvicorn takes it), ask it once, stop
    it; its (stdout, stderr)."""
    import os
    import signal
    import socket

    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = [sys.executable, "-m", "ragpipe.cli", "serve", "--port", str(port)]
    env = {**os.environ, "RAGPIPE_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        args + (["--config", str(config)] if config else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        first = proc.stdout.readline() if proc.stdout else ""  # a condition, not a clock: the line, or EOF
        assert first.startswith("serving target"), (first, proc.poll())
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=60).status_code == 200
        unauthorised = httpx.post(f"http://127.0.0.1:{port}/v1/query", json={"query": "x"}, timeout=60)
        assert unauthorised.status_code in (401, 503)
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    return first + stdout, stderr


def test_serve_starts_and_warns_when_no_caller_can_be_authorised(tmp_path: Path):
    """A successful start through the CLI: it says where it serves; with no keys and anonymous
    access off (the defaults) it also says, once, that every query would be refused and what to do."""
    stdout, stderr = started_serve(tmp_path, None)
    assert "serving target 'staging' on http://127.0.0.1:" in stdout
    warnings = [line for line in stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: no caller can be authorised: the config has no keys and anonymous: false, so every query and "
        "answer is refused with 401; add a key (ragpipe serve-key ID --subject NAME --scope SCOPE) or set "
        "anonymous: true in a serve.yaml given with --config"
    ]
    (tmp_path / "serve.yaml").write_text("anonymous: true\n", encoding="utf-8")
    _, stderr = started_serve(tmp_path, tmp_path / "serve.yaml")
    assert "warning:" not in stderr
