"""Overhead of the step machinery against a bare loop over the local OpenAI-protocol server.

Both arms make the same N chat calls through ``ragpipe.work.chat.complete`` with 4 threads; the
step arm adds what ``ragpipe.work.runner.run_step`` does per item (key, cache lookup, lease,
admission, atomic commit without fsync, usage accounting). Rounds alternate bare/step and the median of the
per-round ratios is reported. ``--delay`` is the server's time per reply (a model's latency). The
server runs in its own process, as a model endpoint does: in this process it would share the GIL
with the client threads and turn every client-side microsecond into wall time. The bytes an item
adds to a bundle are measured from the evidence records of the step arm.

    python -m benchmarks.step_bench --items 200 --delay 0.05 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.representations.generate import GenerationInput, GenerationStep, chat_request, generation_key
from ragpipe.representations.generation_run import evidence_record
from ragpipe.representations.generations import GENERATIONS_SCHEMA
from ragpipe.spec import GeneratedKindSpec, GenerationExecution, RepresentationSpec
from ragpipe.work.chat import complete
from ragpipe.work.entries import JsonEntryStore
from ragpipe.work.leases import KeyLeases
from ragpipe.work.runner import run_step
from ragpipe.work.usage import load_prices
from ragpipe_tests.support.llm_server import LLMServer


def reply(request: dict) -> str:
    """Three questions that differ per chunk (identical replies would compress unrealistically)."""
    tag = hashlib.sha256(request["messages"][-1]["content"].encode()).hexdigest()
    return json.dumps(
        {
            "questions": [
                f"What does trial {tag[:8]} report about stroke risk in adults over seventy?",
                f"Which aspirin dose did study {tag[8:16]} test, and for how long?",
                f"How many people took part in cohort {tag[16:24]}?",
            ]
        }
    )


def _serve(delay: float, ports) -> None:
    with LLMServer() as server:
        server.scenario, server.responder, server.delay = "responder", reply, delay
        ports.put(server.server_address[1])
        server.release.wait()


def texts(n: int) -> list[str]:
    base = "Low-dose aspirin reduced the risk of a first stroke in adults over seventy in trial {i}. " * 8
    return [base.format(i=i) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    spec = RepresentationSpec.model_validate(
        {"kinds": ["raw", "questions"], "generated": {"questions": {"model": "openai/gpt-4o-mini", "n": 3}}}
    )
    kspec: GeneratedKindSpec = spec.generated["questions"]
    prices = load_prices()
    requests = [chat_request("questions", kspec, "Aspirin", t) for t in texts(args.items)]
    ports = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_serve, args=(args.delay, ports), daemon=True)
    child.start()
    api_base = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    try:
        execution = GenerationExecution(api_base=api_base, concurrency=args.concurrency, backoff_seconds=0)

        def bare() -> float:
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(
                    pool.map(
                        lambda r: complete(r, api_base=api_base, api_key="k", timeout=30, prices=prices),
                        requests,
                    )
                )
            return time.perf_counter() - t0

        def step(folder: Path) -> tuple[float, dict]:
            items = [(generation_key("questions", kspec, r), GenerationInput("questions", kspec, r)) for r in requests]
            t0 = time.perf_counter()
            values, report = run_step(
                GenerationStep("questions", kspec, execution, prices),
                items,
                JsonEntryStore(folder, "bench"),
                execution,
                leases=KeyLeases(folder / "leases"),
            )
            assert report.computed == args.items, report
            return time.perf_counter() - t0, values

        ratios, bares, steps = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            bare()  # warm litellm's imports and the connection path
            for i in range(args.rounds):
                b = bare()
                s, values = step(Path(tmp) / f"round{i}")
                bares.append(b)
                steps.append(s)
                ratios.append(s / b)
            key_of = dict(zip(range(args.items), (generation_key("questions", kspec, r) for r in requests)))
            records = [
                evidence_record(
                    f"sha256:{i:064x}",
                    "questions",
                    key_of[i],
                    values[key_of[i]],
                    spec.generated["questions"].prompt_digest,
                )
                for i in range(args.items)
            ]
            sink = pa.BufferOutputStream()
            pq.write_table(pa.Table.from_pylist([r.model_dump() for r in records], schema=GENERATIONS_SCHEMA), sink)
            evidence_bytes = sink.getvalue().size
    finally:
        child.terminate()
        child.join(10)
    print(
        json.dumps(
            {
                "items": args.items,
                "delay_s": args.delay,
                "concurrency": args.concurrency,
                "bare_s": [round(b, 3) for b in bares],
                "step_s": [round(s, 3) for s in steps],
                "ratios": [round(r, 4) for r in ratios],
                "median_ratio": round(statistics.median(ratios), 4),
                "step_overhead_ms_per_item": round(
                    (statistics.median(steps) - statistics.median(bares)) * 1000 / args.items, 3
                ),
                "evidence_bytes_per_item": round(evidence_bytes / args.items, 1),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
