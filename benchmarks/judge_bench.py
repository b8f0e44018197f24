"""Judging throughput and cost: N answers judged against the local OpenAI-protocol server.

Each case has a question, three required facts and an answer citing two ~600-byte evidence items;
the server (``ragpipe_tests/support/llm_server.py``, its judge responder) returns a valid verdict
after ``--delay`` seconds (a model's latency; 0 measures ragpipe's own cost per judgement). The
server runs in its own process, as a model endpoint does. Two passes over one cache: cold (every
case a call: request, lease, admission, verdict check, atomic commit) and warm (every case a
verified cache hit). Cost is the price table's (``ragpipe/specs/prices.yaml``, ``--model``) over
the server's token counts (one token per word), reported per 100 cases.

    python -m benchmarks.judge_bench --cases 100 --concurrency 4 --delay 0
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

from ragpipe.evaluation.judge import CitedEvidence
from ragpipe.evaluation.judge_metrics import judge_metrics
from ragpipe.evaluation.judge_spec import DEFAULT_JUDGE_SPEC, judge_spec
from ragpipe.evaluation.judge_step import JudgeItem, judge_answers
from ragpipe.work.policy import ExecutionPolicy
from ragpipe.work.usage import load_prices
from ragpipe_tests.support.llm_server import LLMServer, judge_reply

SENTENCE = "Low-dose aspirin reduced the risk of a first stroke in adults over seventy in trial {i}. "


def _serve(delay: float, ports) -> None:
    with LLMServer() as server:
        server.scenario, server.responder, server.delay = "responder", judge_reply, delay
        ports.put(server.server_address[1])
        server.release.wait()


def cases(n: int) -> list[JudgeItem]:
    out = []
    for i in range(n):
        evidence = tuple(
            CitedEvidence(
                label=f"E{j}", title=f"Trial {i}-{j}", text=SENTENCE.format(i=i) * 7, access_scopes=("public",)
            )
            for j in (1, 2)
        )
        out.append(
            JudgeItem(
                case_digest=f"case-{i}",
                question=f"Did low-dose aspirin reduce first strokes in trial {i}?",
                required_facts=("aspirin reduced stroke", f"trial {i}", "adults over seventy"),
                answer_text=f"Yes. Aspirin reduced stroke risk in trial {i}. The effect was in adults over seventy.",
                citations=("E1", "E2"),
                cited_evidence=evidence,
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--model", default="openai/gpt-4o-mini")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("fork")
    ports = ctx.Queue()
    child = ctx.Process(target=_serve, args=(args.delay, ports), daemon=True)
    child.start()
    api_base = f"http://127.0.0.1:{ports.get(timeout=30)}/v1"
    prompt = (DEFAULT_JUDGE_SPEC.parent / "prompts" / "judge.txt").read_text(encoding="utf-8")
    spec = judge_spec({"model": args.model, "api_base": api_base, "rubric_version": 1}, prompt)
    prices = load_prices()
    policy = ExecutionPolicy(concurrency=args.concurrency, max_attempts=1)
    items = cases(args.cases)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            judge_answers(spec, cases(2), Path(tmp) / "warmup", policy, prices)  # litellm's imports
            t0 = time.perf_counter()
            cold = judge_answers(spec, items, Path(tmp) / "cache", policy, prices)
            cold_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            warm = judge_answers(spec, items, Path(tmp) / "cache", policy, prices)
            warm_s = time.perf_counter() - t0
    finally:
        child.terminate()
        child.join()
    metrics = judge_metrics(cold.outcomes)
    assert metrics.judged == args.cases and warm.report.cache_hits == args.cases, (metrics, warm.report)
    usage = cold.report.usage
    print(
        f"spec {spec.spec_id}  model {args.model}  cases {args.cases}  concurrency {args.concurrency}  delay {args.delay}s"
    )
    print(f"cold: {cold_s:.2f} s, {args.cases / cold_s:.1f} cases/s ({usage.calls} calls)")
    print(f"warm: {warm_s:.2f} s, {args.cases / warm_s:.1f} cases/s (every case a verified cache hit)")
    print(
        f"cost: {usage.cost_text()} for {args.cases} cases = {usage.cost_micros * 100 / args.cases:.0f} micros per 100 cases "
        f"({usage.input_tokens} input, {usage.output_tokens} output tokens)"
    )
    print(f"distribution {metrics.distribution}  mean label {metrics.mean_label}")


if __name__ == "__main__":
    main()
