"""A real S3 protocol server for tests: moto in server mode on 127.0.0.1 (or the host given), in
its own process.

``python -m ragpipe_tests.support.s3_server [HOST]`` starts moto's threaded server on a free port, prints
``ready <port>`` and serves until its standard input closes (the fixture's process ends it, so a
killed test run leaves no server behind). S3 decides a conditional write (``If-None-Match``,
``If-Match``) atomically; moto checks the condition and then writes, unlocked, on a threaded
server, so two racing writers could both pass. The server therefore runs one mutating request at a
time (reads stay concurrent): what the tests race is the protocol's guarantee, not moto's gap. ``S3Server.start()`` waits for that line — a condition,
not a sleep — and ``bucket()`` creates a fresh bucket per test.
"""

from __future__ import annotations

import logging
import secrets
import subprocess
import sys
import threading
from dataclasses import dataclass, field

CREDENTIALS = {"aws_access_key_id": "ragpipe-test", "aws_secret_access_key": "ragpipe-test-secret"}
REGION = "us-east-1"


@dataclass
class S3Server:
    process: subprocess.Popen
    port: int
    host: str = "127.0.0.1"
    buckets: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def start(cls, host: str = "127.0.0.1") -> S3Server:
        process = subprocess.Popen(
            [sys.executable, "-m", "ragpipe_tests.support.s3_server", host],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = process.stdout.readline() if process.stdout else ""
        if not line.startswith("ready "):
            process.kill()
            raise RuntimeError(f"moto server did not start: {line!r}")
        return cls(process=process, port=int(line.split()[1]), host=host)

    def env(self) -> dict[str, str]:
        """What a process needs to reach this server through ``RAGPIPE_S3_ENDPOINT`` and boto3."""
        return {
            "RAGPIPE_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
            "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, **CREDENTIALS)

    def bucket(self) -> str:
        name = f"ragpipe-{secrets.token_hex(6)}"
        self.client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def stop(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def serialized_writes(app):
    """``app`` with its mutating requests run one at a time (module docstring)."""
    lock = threading.Lock()

    def wrapped(environ, start_response):
        if environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
            return app(environ, start_response)
        with lock:
            return list(app(environ, start_response))

    return wrapped


def main() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request on the test's output
    app = serialized_writes(DomainDispatcherApplication(create_backend_app))
    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    server = make_server(host, 0, app, threaded=True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"ready {server.server_address[1]}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin or dies
    server.shutdown()


if __name__ == "__main__":
    main()
