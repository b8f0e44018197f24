"""Evaluation-run benchmark on a SciFact bundle: overhead of custody, bytes per cell, resume.

    python -m ragpipe.benchmarks.eval_bench --bundle PATH [--scifact ../shared/datasets/scifact]
        [--mode hybrid] [--k 1000] [--warmup 30] [--out DIR] [--limit N]

In one process, one ``Retriever`` (query embedder loaded, warmed up on ``--warmup`` claims):

* ``bare``: the suite's queries as plain ``Retriever.query(text, k, mode)`` calls, timed in total;
* ``eval``: ``run_evaluation`` of the same suite (SciFact test, imported from the BEIR folder),
  timed from folder creation to the written report — audit trace, scoring through ir_measures,
  Parquet traces, fsynced ledger appends and head rewrites included; ratio eval / bare (target
  <= 1.15);
* bytes: ledger and traces of the run, per cell;
* resume: a second run killed (an exception from its progress hook, after the cell's records
  are durable) at 50 % of its cells, then ``resume_evaluation``: its wall time, the cells it
  ran, and whether its metrics equal the uninterrupted run's.

Prints one JSON object, including nDCG@10 and recall@100 of the run (the landed benchmark's
hybrid figure is 0.710 / 0.952 on the same bundle).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from ragpipe.evaluation.eval_spec import EvaluationSpec
from ragpipe.evaluation.ledger import LEDGER, read_ledger
from ragpipe.evaluation.runner import resume_evaluation, run_evaluation
from ragpipe.evaluation.suite import Suite, load_suite
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.service import Retriever


class Killed(Exception):
    pass


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--scifact", type=Path, default=Path("../shared/datasets/scifact"))
    ap.add_argument("--mode", default="hybrid")
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None, help="where to put the run folders (default: a temp dir, removed)")
    ap.add_argument("--limit", type=int, default=None, help="first N cases only (a quick run)")
    args = ap.parse_args()

    suite = load_suite(args.scifact, split="test")
    if args.limit:
        suite = Suite.of(suite.cases[: args.limit], suite.source)
    plan = load_plan()
    retriever = Retriever(args.bundle, plan=plan)
    if retriever.vector is not None:
        retriever.embedder()
    spec = EvaluationSpec.build(suite, plan, args.bundle, retriever.bundle_id, mode=args.mode, k=args.k)
    texts = [c.query for c in suite.cases]
    for text in texts[: args.warmup]:
        retriever.query(text, Subject.default(), k=args.k, mode=args.mode)

    work = args.out or Path(tempfile.mkdtemp(prefix="eval-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for text in texts:
        retriever.query(text, Subject.default(), k=args.k, mode=args.mode)
    bare = time.perf_counter() - started

    started = time.perf_counter()
    result = run_evaluation(spec, work / "run", retriever_factory=lambda _: retriever)
    evaluation = time.perf_counter() - started
    cells = result.report["cells"]["expected"]
    ledger_bytes = (work / "run" / LEDGER).stat().st_size
    trace_bytes = tree_bytes(work / "run" / "traces")

    half = cells // 2

    def kill_at_half(done: int, _total: int, _cell) -> None:
        if done == half:
            raise Killed()

    try:
        run_evaluation(spec, work / "killed", retriever_factory=lambda _: retriever, on_progress=kill_at_half)
    except Killed:
        pass
    before = sum(1 for r in read_ledger(work / "killed").records if r.kind == "CellCompleted")
    started = time.perf_counter()
    resumed = resume_evaluation(work / "killed", retriever_factory=lambda _: retriever)
    resume_seconds = time.perf_counter() - started
    after = sum(1 for r in read_ledger(work / "killed").records if r.kind == "CellCompleted")

    metrics = result.report["metrics"]
    print(json.dumps({
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        "bundle_id": retriever.bundle_id,
        "spec_id": spec.spec_id,
        "plan_id": plan.plan_id,
        "mode": args.mode,
        "k": args.k,
        "cases": len(suite.cases),
        "cells": cells,
        "bare_query_s": round(bare, 3),
        "eval_s": round(evaluation, 3),
        "ratio": round(evaluation / bare, 3),
        "ledger_bytes_per_cell": round(ledger_bytes / cells),
        "trace_bytes_per_cell": round(trace_bytes / cells),
        "resume": {"killed_after_cells": before, "resumed_cells": after - before, "resume_s": round(resume_seconds, 3),
                   "metrics_equal": resumed.report["metrics"] == metrics},
        "ndcg@10": metrics["ndcg@10"]["value"],
        "recall@100": metrics["recall@100"]["value"],
        "metrics": {name: m["value"] for name, m in metrics.items()},
        "latency_ms": result.report["latency_ms"],
    }, indent=2))
    retriever.close()
    if args.out is None:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
