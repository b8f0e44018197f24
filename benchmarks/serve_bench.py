"""HTTP service benchmark: start to ready, latency and throughput by concurrency, swap delay, memory.

    python -m benchmarks.serve_bench --home var/ragpipe [--target staging] [--seconds 10]
        [--clients 1,4,16] --scifact PATH

Starts ``ragpipe serve`` as a subprocess on 127.0.0.1 (anonymous access, no rate limit) over the
target's active release in ``--home`` and measures:

* ``start_to_ready_s``: process start until ``/readyz`` answers 200 (release verified, retriever
  built, every channel warmed);
* per concurrency level: ``--clients`` threads, each with its own keep-alive ``http.client``
  connection (bodies encoded in advance), post
  SciFact test claims to ``/v1/query`` (hybrid, k=10) for ``--seconds``; requests per second and
  p50/p95 latency as the clients see it;
* ``in_process``: the same claims through ``Retriever.query`` in this process, one thread: the
  p50/p95 the HTTP numbers compare with;
* ``ab_one_claim_mean_ms``: ApacheBench (a C client; ``apt-get install apache2-utils``), one
  keep-alive client posting the first claim 1,500 times: mean latency, against
  ``in_process.one_claim_mean_ms`` (the same claim in process) — HTTP overhead without any Python
  client cost (None without ``ab``);
* ``paired``: the HTTP overhead measured so that the machine's drift cancels out: for each claim,
  one request over a keep-alive ``http.client`` connection, then the same claim through
  ``Retriever.query`` in this process (server idle meanwhile); the median of the per-claim
  differences, and ApacheBench rounds alternated with in-process rounds of its claim;
* ``swap_delay_s``: after ``--swap RELEASE_ID`` is activated (optional), until ``/v1/release``
  names it, and ``rollback`` back;
* ``server_rss_mb``: the server's resident memory after the load (one worker);
* ``reopen``: in this process, ``active_release`` (what the server runs on every pointer change:
  full verification, the gate decision made again) timed on the first and on a second open of the
  same unchanged release — the second must not cost more.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

from benchmarks.scifact import add_scifact_argument

REPO = Path(__file__).resolve().parent.parent
AB_REQUESTS = 1500


def _claims(scifact: Path) -> list[str]:
    with open(scifact / "queries.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f][:300]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _load(port: int, claims: list[str], clients: int, seconds: float) -> dict[str, float]:
    """``clients`` threads, each posting claims over its own keep-alive connection. The client is the
    standard library's ``http.client`` with the bodies encoded in advance: the leanest Python
    client, so that the figures are the server's cost rather than a client library's (httpx adds
    about a millisecond per request on these two shared cores)."""
    bodies = [json.dumps({"query": c, "k": 10, "mode": "hybrid"}).encode() for c in claims]
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    failures = [0]
    stop = time.monotonic() + seconds

    def client(offset: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            i = offset
            while time.monotonic() < stop:
                started = time.perf_counter()
                connection.request("POST", "/v1/query", bodies[i % len(bodies)], headers)
                response = connection.getresponse()
                response.read()
                latencies.append(time.perf_counter() - started)
                failures[0] += response.status != 200
                i += clients
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - began
    return {
        "requests": len(latencies),
        "failed": failures[0],
        "qps": round(len(latencies) / wall, 1),
        "p50_ms": round(_percentile(latencies, 0.5) * 1000, 2),
        "p95_ms": round(_percentile(latencies, 0.95) * 1000, 2),
    }


def _ab(port: int, claim: str, requests: int) -> float | None:
    """Mean latency (ms) of ``requests`` keep-alive posts of one claim by ApacheBench at 1
    client — a C client, so nothing of Python's client cost is in it — or None without ``ab``."""
    if shutil.which("ab") is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as body:
        json.dump({"query": claim, "k": 10, "mode": "hybrid"}, body)
    try:
        args = ["ab", "-q", "-k", "-c", "1", "-p", body.name, "-T", "application/json"]
        url = f"http://127.0.0.1:{port}/v1/query"
        subprocess.run([*args, "-n", "200", url], check=True, capture_output=True)  # warm
        out = subprocess.run([*args, "-n", str(requests), url], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(body.name)
    if "Non-2xx" in out or not re.search(r"Failed requests:\s+0\b", out):
        raise RuntimeError(f"ab saw failed requests:\n{out}")
    return float(re.search(r"Time per request:\s+([0-9.]+) \[ms\] \(mean\)", out).group(1))


def _in_process(home: Path, target: str, claims: list[str]) -> dict[str, float]:
    from ragpipe.api import retriever_for_release

    retriever = retriever_for_release(target, home=home)
    try:
        for claim in claims[:30]:
            retriever.query(claim, k=10, mode="hybrid")
        latencies = []
        for claim in claims:
            started = time.perf_counter()
            retriever.query(claim, k=10, mode="hybrid")
            latencies.append(time.perf_counter() - started)
        one = []  # what ab posts: the first claim, again and again (its body as the route returns it)
        for _ in range(AB_REQUESTS):
            started = time.perf_counter()
            retriever.query(claims[0], k=10, mode="hybrid").as_dict()
            one.append(time.perf_counter() - started)
    finally:
        retriever.close()
    return {
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p95_ms": round(_percentile(latencies, 0.95) * 1000, 2),
        "one_claim_mean_ms": round(statistics.mean(one) * 1000, 3),
    }


def _paired(port: int, home: Path, target: str, claims: list[str], rounds: int = 3) -> dict[str, object]:
    """HTTP minus in-process latency, each pair taken back to back (module docstring)."""
    from ragpipe.api import retriever_for_release

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    retriever = retriever_for_release(target, home=home)
    try:

        def over_http(claim: str) -> float:
            body = json.dumps({"query": claim, "k": 10, "mode": "hybrid"}).encode()
            started = time.perf_counter()
            connection.request("POST", "/v1/query", body, headers)
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"/v1/query answered {response.status}")
            return time.perf_counter() - started

        def in_process(claim: str) -> float:
            started = time.perf_counter()
            retriever.query(claim, k=10, mode="hybrid").as_dict()
            return time.perf_counter() - started

        for claim in claims[:30]:
            over_http(claim), in_process(claim)
        differences = [over_http(claim) - in_process(claim) for claim in claims]
        ab_rounds = []
        for _ in range(rounds if shutil.which("ab") else 0):
            served = _ab(port, claims[0], 500)
            local = statistics.mean(in_process(claims[0]) for _ in range(500)) * 1000
            ab_rounds.append(round(served - local, 3))
    finally:
        retriever.close()
        connection.close()
    return {
        "http_client_overhead_p50_ms": round(statistics.median(differences) * 1000, 3),
        "http_client_overhead_p95_ms": round(_percentile(differences, 0.95) * 1000, 3),
        "ab_overhead_mean_ms_by_round": ab_rounds,
    }


def _reopen(home: Path, target: str) -> dict[str, float]:
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.release.serving import active_release

    times = []
    for _ in range(3):
        started = time.perf_counter()
        active_release(Workspace(home), target)
        times.append(round(time.perf_counter() - started, 3))
    return {"first_s": times[0], "second_s": times[1], "third_s": times[2]}


def _wait_release(base: str, release_id: str, timeout: float = 120) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        release = httpx.get(f"{base}/v1/release", timeout=10).json()["release"]
        if release and release["release_id"] == release_id:
            return time.monotonic() - began
        time.sleep(0.01)
    raise RuntimeError(f"{release_id} was not served within {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--target", default="staging")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--swap", help="a release ID to activate (then roll back) while serving")
    add_scifact_argument(parser)
    args = parser.parse_args()
    claims = _claims(args.scifact)
    base = f"http://127.0.0.1:{args.port}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "serve.yaml"
        config.write_text(
            "anonymous: true\nlimits: {requests_per_minute: 0, max_concurrent: 16}\npoll_interval_s: 0.2\n",
            encoding="utf-8",
        )
        env = {**os.environ, "RAGPIPE_HOME": str(args.home.resolve())}
        started = time.monotonic()
        server = subprocess.Popen(
            [sys.executable, "-m", "ragpipe.cli", "serve", "--target", args.target, "--port", str(args.port),
             "--config", str(config)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            while True:
                try:
                    if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() - started > 300:
                    raise RuntimeError("the server did not become ready")
                time.sleep(0.02)
            result: dict[str, object] = {"start_to_ready_s": round(time.monotonic() - started, 2)}
            for clients in (int(c) for c in args.clients.split(",")):
                _load(args.port, claims, clients, 2.0)  # warm the claims' hydration and connections
                result[f"clients_{clients}"] = _load(args.port, claims, clients, args.seconds)
            result["ab_one_claim_mean_ms"] = _ab(args.port, claims[0], AB_REQUESTS)
            result["paired"] = _paired(args.port, args.home.resolve(), args.target, claims)
            result["server_rss_mb"] = round(psutil.Process(server.pid).memory_info().rss / 2**20, 1)
            if args.swap:
                from ragpipe.kernel.workspace import Workspace
                from ragpipe.release.activation import activate
                from ragpipe.release.rollback import rollback

                ws = Workspace(args.home.resolve())
                before = httpx.get(f"{base}/v1/release").json()["release"]["release_id"]
                activate(ws, args.swap, args.target)
                result["swap_delay_s"] = round(_wait_release(base, args.swap), 3)
                rollback(ws, args.target)
                result["rollback_delay_s"] = round(_wait_release(base, before), 3)
        finally:
            server.terminate()
            server.wait(timeout=30)
    result["in_process"] = _in_process(args.home.resolve(), args.target, claims)
    result["reopen"] = _reopen(args.home.resolve(), args.target)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
