"""Query-plan variants on the SciFact **train** split, against an existing bundle.

    python -m benchmarks.plan_search --bundle PATH --scifact PATH
        [--levels chunk[,document]] [--replay 10] [--cache var/plan_search] [--markdown]

Only ``qrels/train.tsv`` is read — never the test judgments, which are reported once, at the end,
by whoever picks a plan. Method (docs/retrieval.md, "Fusion"):

1. Per collapse level, one real hybrid ``Retriever.query(k=1000, trace=True)`` per train claim
   (``k = 1000``: the evaluation runs' depth) collects each channel's ranking (``plan_cache``);
   queries are embedded once and the rankings cached on disk for later runs.
2. Each variant (a patch of the checked-in plan: fusion kind and parameters, channel depth,
   collapse) is fused from those rankings with ``ragpipe.retrieval.fusion.fuse`` — the dispatch the query
   path uses — and scored at document level with ``ragpipe.evaluation.metrics``: nDCG@10 and
   recall@100 of the ``k = 1000`` query, and nDCG@10 of a ``k = 10`` query (the channels cut to
   ``max(depth, 10)`` units: a channel's ranking is exactly a prefix of its full collapsed
   ranking, so the cut is what such a query sees). Lexical and vector mode do not depend on the
   fusion (one channel keeps its order): they are scored once per level, and replayed per variant.
3. Against RRF k=60 (the checked-in fusion when this benchmark was written; same level): the paired nDCG@10 delta, wins/losses
   and a paired randomization p-value (``scipy.stats.permutation_test``, 10,000 resamples,
   seed 0), and hybrid nDCG@10 on two slices — claims where the lexical channel alone scores
   below the vector channel alone, and the reverse — to show how each fusion copes with a weak
   channel.
4. Replay: the first ``--replay`` claims are run through a real ``Retriever`` with each variant
   plan in every mode; its hits (chunk IDs and scores) must equal the offline fusion exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.stats import permutation_test

from benchmarks.plan_cache import CachedQueryEmbedder, Collected, Rankings, load_or_collect
from benchmarks.scifact import add_scifact_argument
from ragpipe.evaluation.metrics import collapse, default_metric_specs, score_cases
from ragpipe.evaluation.suite import Case
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.fusion import fuse
from ragpipe.retrieval.fusion.order import FusedHit
from ragpipe.retrieval.plan import QueryPlan, load_plan, parse_plan
from ragpipe.retrieval.retriever import MODES, Retriever

SPLIT = "train"  # the only split this module reads
UNITS = 1000  # the evaluation runs' k
METRICS = ("ndcg@10", "recall@100")

RRF60 = {"fusion": {"kind": "weighted_rrf", "k": 60}}
ZSCORE = {"fusion": {"kind": "normalized_convex", "normalization": "z_score"}}
MINMAX = {"fusion": {"kind": "normalized_convex", "normalization": "min_max"}}
# name -> patch of the checked-in plan (channel depth 100, weights 1; ``collapse`` set per level)
VARIANTS: dict[str, dict] = {
    "rrf k=60 (baseline)": RRF60,
    "rrf k=20": {"fusion": {"kind": "weighted_rrf", "k": 20}},
    "rrf k=10": {"fusion": {"kind": "weighted_rrf", "k": 10}},
    "rrf k=100": {"fusion": {"kind": "weighted_rrf", "k": 100}},
    "min_max, depth 100": MINMAX,
    "z_score, depth 100 (recommended)": ZSCORE,
    "min_max, depth 50": {**MINMAX, "depth": 50},
    "z_score, depth 50": {**ZSCORE, "depth": 50},
    "z_score, depth 200": {**ZSCORE, "depth": 200},
    "bounded z_score, depth 100 (checked-in)": {
        "fusion": {"kind": "bounded_convex", "normalization": "z_score", "window": "eligible"}
    },
}
BASELINE = "rrf k=60 (baseline)"
COLLECTION = RRF60  # channel rankings do not depend on fusion; the collection's own hits are checked under it


def variant_plan(base: QueryPlan, patch: dict, level: str) -> QueryPlan:
    """The checked-in plan with ``patch`` applied, validated like a plan file."""
    raw = base.model_dump(mode="json", by_alias=True)
    raw["collapse"] = level
    if "fusion" in patch:
        raw["fusion"] = patch["fusion"]
    if "depth" in patch:
        raw["channels"] = {n: {**c, "depth": patch["depth"]} for n, c in raw["channels"].items()}
    return parse_plan(raw, f"variant {patch}")


def fused(plan: QueryPlan, rankings: Rankings, mode: str, k: int) -> list[FusedHit]:
    """What ``Retriever.query(k=k, mode=mode)`` ranks, from channel rankings at least
    ``max(depth, k)`` units deep: each channel cut to that prefix, then the plan's fusion."""
    plan = plan.with_channels(MODES[mode])
    return fuse(plan, {n: rankings[n][: max(plan.channels[n].depth, k)] for n in plan.channels})[:k]


def score(
    plan: QueryPlan, collected: Collected, cases: dict[str, Case], mode: str, k: int
) -> dict[str, dict[str, float]]:
    """Per case: nDCG@10 and recall@100 at document level of the mode's ``k``-query ranking."""
    specs = [s for s in default_metric_specs() if s.name in METRICS]
    deepest = max(s.k for s in specs)  # no metric looks further: the rest is not handed over
    runs = {
        cid: collapse([(f.document_id, f.chunk_id) for f in fused(plan, rk, mode, k)], "document")[:deepest]
        for cid, rk in collected.rankings.items()
    }
    return score_cases({cid: cases[cid].judgments for cid in runs}, runs, specs)


def mean(per_case: dict[str, dict[str, float]], metric: str, ids: Sequence[str] | None = None) -> float:
    ids = sorted(per_case) if ids is None else ids
    return round(statistics.fmean(per_case[i][metric] for i in ids), 4)


def paired(challenger: dict, baseline: dict, metric: str = "ndcg@10") -> dict[str, object]:
    ids = sorted(baseline)
    x = np.array([challenger[i][metric] for i in ids])
    y = np.array([baseline[i][metric] for i in ids])
    d = x - y
    if not d.any():
        return {"delta": 0.0, "wins": 0, "losses": 0, "p_value": 1.0}
    test = permutation_test(
        (x, y),
        lambda a, b, axis: np.mean(a - b, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=10_000,
        random_state=0,
    )
    return {
        "delta": round(float(d.mean()), 4),
        "wins": int((d > 0).sum()),
        "losses": int((d < 0).sum()),
        "p_value": round(float(test.pvalue), 4),
    }


def replay(bundle: Path, plan: QueryPlan, embedder, collected: Collected, cases: Sequence[Case]) -> int:
    """Run ``cases`` through a real ``Retriever`` with ``plan`` in every mode; raise on the first
    hit list that differs from the offline fusion. Returns the number of queries compared."""
    retriever = Retriever(bundle, plan=plan, embedder=embedder)
    try:
        for case in cases:
            for mode in MODES:
                got = [
                    (h["chunk_id"], h["score"])
                    for h in retriever.query(case.query, Subject.default(), k=UNITS, mode=mode).hits
                ]
                want = [(f.chunk_id, f.score) for f in fused(plan, collected.rankings[case.id], mode, UNITS)]
                if got != want:
                    raise RuntimeError(
                        f"replay: plan {plan.plan_id}, case {case.id}, mode {mode}: Retriever differs from the offline fusion"
                    )
    finally:
        retriever.close()
    return len(cases) * len(MODES)


def search(bundle: Path, scifact: Path, levels: Sequence[str], replay_n: int, cache: Path) -> dict[str, object]:
    suite = load_suite(scifact, split=SPLIT)
    cases = {c.id: c for c in suite.cases}
    base = load_plan()
    opener = Retriever(bundle, plan=base)
    embedder = CachedQueryEmbedder(opener.embedder())
    opener.close()
    report: dict[str, object] = {
        "split": SPLIT,
        "cases": len(cases),
        "suite_digest": suite.digest,
        "units": UNITS,
        "levels": {},
    }
    replayed = 0
    for level in levels:
        started = time.perf_counter()
        collector = Retriever(bundle, plan=variant_plan(base, COLLECTION, level), embedder=embedder)
        collected, hit = load_or_collect(cache / f"channels-{level}-u{UNITS}.pkl", collector, suite.cases, UNITS)
        collector.close()
        _check_collection(collected, base, level)
        rows, singles = {}, {}
        for mode in ("lexical", "vector"):  # one channel: every fusion keeps the channel's order
            singles[mode] = score(variant_plan(base, COLLECTION, level), collected, cases, mode, UNITS)
        weak_lexical = [i for i in sorted(cases) if singles["lexical"][i]["ndcg@10"] < singles["vector"][i]["ndcg@10"]]
        weak_vector = [i for i in sorted(cases) if singles["vector"][i]["ndcg@10"] < singles["lexical"][i]["ndcg@10"]]
        per_variant = {}
        for name, patch in VARIANTS.items():
            plan = variant_plan(base, patch, level)
            per_variant[name] = hybrid = score(plan, collected, cases, "hybrid", UNITS)
            shallow = score(plan, collected, cases, "hybrid", 10)
            rows[name] = {
                "plan_id": plan.plan_id,
                "hybrid": {m: mean(hybrid, m) for m in METRICS},
                "hybrid_ndcg@10_of_k10_query": mean(shallow, "ndcg@10"),
                "hybrid_ndcg@10_lexical_weaker": mean(hybrid, "ndcg@10", weak_lexical),
                "hybrid_ndcg@10_vector_weaker": mean(hybrid, "ndcg@10", weak_vector),
                "vs_baseline": paired(hybrid, per_variant[BASELINE]),
            }
            if replay_n:
                replayed += replay(bundle, plan, embedder, collected, suite.cases[:replay_n])
        report["levels"][level] = {
            "collection": {"from_cache": hit, "seconds": round(time.perf_counter() - started, 1)},
            "lexical": {m: mean(singles["lexical"], m) for m in METRICS},
            "vector": {m: mean(singles["vector"], m) for m in METRICS},
            "slices": {"lexical_weaker": len(weak_lexical), "vector_weaker": len(weak_vector)},
            "variants": rows,
        }
    report["replayed_queries_equal"] = replayed
    report["query_embeddings_computed"] = embedder.embedded
    return report


def _check_collection(collected: Collected, base: QueryPlan, level: str) -> None:
    """The collection's own hybrid hits are its plan's fusion of its channel rankings."""
    plan = variant_plan(base, COLLECTION, level)
    for cid, rankings in collected.rankings.items():
        if [(f.chunk_id, f.score) for f in fused(plan, rankings, "hybrid", UNITS)] != collected.hybrid_hits[cid]:
            raise RuntimeError(
                f"collection of case {cid}: the cached channel rankings do not reproduce the query's hits"
            )


def markdown(report: dict) -> str:
    lines = []
    for level, found in report["levels"].items():
        lines.append(
            f"\ncollapse `{level}` — lexical {found['lexical']['ndcg@10']} / {found['lexical']['recall@100']}, "
            f"vector {found['vector']['ndcg@10']} / {found['vector']['recall@100']} (nDCG@10 / recall@100); "
            f"slices: lexical weaker {found['slices']['lexical_weaker']}, vector weaker {found['slices']['vector_weaker']} claims\n"
        )
        lines.append(
            "| variant | hybrid nDCG@10 | recall@100 | nDCG@10, k=10 query | Δ nDCG@10 vs rrf k=60 (wins/losses, p) | lexical-weaker slice | vector-weaker slice |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        for name, row in found["variants"].items():
            v = row["vs_baseline"]
            lines.append(
                f"| {name} | {row['hybrid']['ndcg@10']:.4f} | {row['hybrid']['recall@100']:.4f} | {row['hybrid_ndcg@10_of_k10_query']:.4f} | "
                f"{v['delta']:+.4f} ({v['wins']}/{v['losses']}, {v['p_value']}) | {row['hybrid_ndcg@10_lexical_weaker']:.4f} | {row['hybrid_ndcg@10_vector_weaker']:.4f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    add_scifact_argument(ap)
    ap.add_argument("--levels", default="chunk", help="collapse levels, comma-separated (chunk, document)")
    ap.add_argument("--replay", type=int, default=10, help="claims replayed through a real Retriever per variant")
    ap.add_argument("--cache", type=Path, default=Path("var/plan_search"))
    ap.add_argument("--markdown", action="store_true", help="also print the tables (stderr)")
    args = ap.parse_args()
    started = time.perf_counter()
    report = search(args.bundle, args.scifact, [x for x in args.levels.split(",") if x], args.replay, args.cache)
    report.update(
        date=time.strftime("%Y-%m-%d"),
        machine=f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
        bundle=str(args.bundle),
        wall_seconds=round(time.perf_counter() - started, 1),
    )
    print(json.dumps(report, indent=2))
    if args.markdown:
        print(markdown(report), file=sys.stderr)


if __name__ == "__main__":
    main()
