"""The private link a Celery worker runs behind: what crosses it, what cannot, and what is left after."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ragpipe_tests.support.pg_server import PostgresServer
from ragpipe_tests.support.private_link import PrivateLink, private_link_here
from ragpipe_tests.support.redis_server import RedisServer

# run inside the namespace: PING the Redis at argv[1]:argv[2] over a raw socket, print the reply or the error
PING = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as s:
        s.sendall(b"PING\\r\\n")
        print(s.recv(64).decode().strip())
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture
def link():
    made, why = private_link_here()
    if made is None:
        pytest.skip(f"no network namespace on this machine: {why}")
    yield made
    made.close()


def ping_from_inside(link: PrivateLink, host: str, port: int) -> str:
    out = subprocess.run(
        [*link.exec_prefix(), sys.executable, "-c", PING, host, str(port)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_service_on_the_links_host_end_answers_inside_and_loopback_does_not(link: PrivateLink):
    on_link = RedisServer.start(link.host_ip)
    on_loopback = None
    try:
        on_loopback = RedisServer.start()
        before = link.bytes_carried()
        assert ping_from_inside(link, link.host_ip, on_link.port) == "+PONG"
        assert link.bytes_carried() > before
        # the namespace's 127.0.0.1 is its own loopback: the machine's services there are out of reach
        assert ping_from_inside(link, "127.0.0.1", on_loopback.port) == "ConnectionRefusedError"
    finally:
        on_link.stop()
        if on_loopback is not None:
            on_loopback.stop()
    assert link.interfaces() == sorted(["lo", link.peer_if])


def test_postgres_on_the_links_host_end_lets_the_links_network_in(link: PrivateLink):
    server = PostgresServer.start(link.host_ip, link.network)
    try:
        query = ["psql", server.url, "-Atc", "select inet_server_addr(), inet_client_addr()"]
        out = subprocess.run([*link.exec_prefix(), *query], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"{link.host_ip}|{link.peer_ip}"
    finally:
        server.stop()


def test_close_leaves_no_namespace_and_no_interface(link: PrivateLink):
    link.close()
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    assert link.namespace not in namespaces
    assert not os.path.exists(f"/sys/class/net/{link.host_if}")
