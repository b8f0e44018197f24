"""The throw-away PostgreSQL server the Postgres-backed Dagster instance tests use."""

from __future__ import annotations

import subprocess

from ragpipe_tests.support.pg_server import PostgresServer


def test_a_real_postgres_server_starts_answers_and_is_removed():
    server = PostgresServer.start()
    try:
        out = subprocess.run(
            ["psql", server.url, "-Atc", "select current_database(), current_user, inet_server_addr()"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "dagster|ragpipe|127.0.0.1"
    finally:
        server.stop()
    assert not server.root.exists()
