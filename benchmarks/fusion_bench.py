"""Does hybrid hold against its better channel on suites the fusion was not tuned on?

    python -m benchmarks.fusion_bench --bundle PATH --scifact PATH
        [--cache var/fusion_bench] [--per-suite 300] [--markdown] [--json OUT]

For each suite, one real hybrid ``Retriever.query(k=1000, trace=True)`` per case collects both
channels' rankings (``plan_cache``: cached on disk, each query embedded once); every fusion
variant is then applied offline with ``ragpipe.retrieval.fusion.fuse`` — the query path's own
dispatch — and scored at document level (nDCG@10 of the ``k = 1000`` ranking, the evaluation
runs' depth). The question for each suite: hybrid minus the better single channel (lexical or
vector mode of the same plan), which must not fall below −0.005.

Suites (document-level judgments; every synthetic suite is drawn with a fixed seed from the
corpus, one judged document per case, ``--per-suite`` cases):

* ``scifact-train``, ``scifact-test``: the BEIR judgments (test is reported, never tuned on);
  ``train-a``/``train-b``: the train claims split in two by a hash of the query ID.
* ``title``: a document's title; ``sentence``: one sentence of its abstract (not the first);
* ``rare-terms``: the four rarest words of the abstract (document frequency in the corpus) —
  keyword queries, where the lexical channel should dominate;
* ``typo-train``, ``typo-sentence``: every word of ≥ 4 letters has two adjacent letters swapped
  with probability 0.5 — spelling noise hurts the lexical channel more;
* ``stripped-train``: the train claims with English stop words removed;
* ``common-words``: a sentence of the abstract keeping only words found in at least 1 % of the
  corpus's documents, stop words removed (cases with fewer than four such words dropped);
* ``mismatch-train``: the train claims with every word that shares a term (the lexical channel's
  ``en_stem`` analysis) with a judged document removed
  (claims left with fewer than three words dropped) — total vocabulary mismatch: the lexical
  channel cannot match a judged document at all, only the vector channel can find one.

Per suite and fusion: hybrid nDCG@10, its difference from the better channel's (the channel with
the higher mean on that suite) and a 95 % paired bootstrap interval of that difference (10,000
resamples of the cases, seed 0). Nothing here is a target: it is the evidence for
``docs/retrieval.md`` ("Fusion off the tuning corpus"). Which suites shaped the checked-in fusion
and which did not is said there.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import platform
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import tantivy

from benchmarks.plan_cache import CachedQueryEmbedder, Collected, load_or_collect
from benchmarks.plan_search import variant_plan
from benchmarks.scifact import add_scifact_argument
from ragpipe.evaluation.metrics import collapse, default_metric_specs, score_cases
from ragpipe.evaluation.suite import Case, Suite
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.retrieval.fusion import fuse
from ragpipe.retrieval.plan import QueryPlan, load_plan
from ragpipe.retrieval.retriever import MODES, Retriever

UNITS = 1000  # the evaluation runs' k
TOLERANCE = 0.005
WORD = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
STOP = frozenset(
    "a an and are as at be by for from has have in is it its of on or that the to was were which with "
    "this these those not no than then there their they we our can may might do does did been being "
    "into over under after before between during through about against".split()
)
COLLECTION = {"fusion": {"kind": "normalized_convex", "normalization": "z_score"}}
VARIANTS: dict[str, dict] = {
    "bounded_convex (checked-in)": {},
    "normalized_convex": {"fusion": {"kind": "normalized_convex", "normalization": "z_score"}},
    "rrf k=60": {"fusion": {"kind": "weighted_rrf", "k": 60}},
}


def _corpus(scifact: Path) -> list[dict]:
    with gzip.open(scifact / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _en_stem() -> tantivy.TextAnalyzer:
    """The lexical channel's ``en_stem`` analysis (tantivy's: simple tokenizer, long tokens
    removed, lower case, English stemmer), so "a word of the document" means what the index means."""
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def _typos(text: str, rng: random.Random) -> str:
    def swap(m: re.Match) -> str:
        w = m.group(0)
        if len(w) < 4 or rng.random() >= 0.5:
            return w
        i = rng.randrange(1, len(w) - 2)  # keep the first letter (as most typos do)
        return w[:i] + w[i + 1] + w[i] + w[i + 2 :]

    return WORD.sub(swap, text)


def _case(cid: str, query: str, doc_id: str) -> Case:
    return Case.model_validate({"id": cid, "query": query, "target_level": "document", "judgments": {doc_id: 1}})


def synthetic_suites(scifact: Path, train: Suite, per_suite: int) -> dict[str, Suite]:
    """The synthetic suites (module docstring), deterministic for a corpus and ``per_suite``."""
    docs = [d for d in _corpus(scifact) if d.get("title") and len(SENTENCE.split(d["text"])) >= 3]
    df = Counter()
    for d in docs:
        df.update({w.lower() for w in WORD.findall(d["title"] + " " + d["text"])})
    common_df = len(docs) / 100
    suites: dict[str, list[Case]] = {
        n: [] for n in ("title", "sentence", "rare-terms", "typo-sentence", "common-words")
    }
    rng = random.Random(20261207)
    for d in rng.sample(docs, min(per_suite, len(docs))):
        sentences = SENTENCE.split(d["text"])
        sentence = rng.choice(sentences[1:])
        words = WORD.findall(d["text"])
        rare = sorted({w.lower() for w in words if len(w) >= 4}, key=lambda w: (df[w], w))[:4]
        common = [w for w in WORD.findall(sentence) if df[w.lower()] >= common_df and w.lower() not in STOP]
        i = d["_id"]
        suites["title"].append(_case(f"title-{i}", d["title"], i))
        suites["sentence"].append(_case(f"sentence-{i}", sentence, i))
        suites["rare-terms"].append(_case(f"rare-{i}", " ".join(rare), i))
        suites["typo-sentence"].append(_case(f"typo-sentence-{i}", _typos(sentence, rng), i))
        if len(common) >= 4:
            suites["common-words"].append(_case(f"common-{i}", " ".join(common), i))
    claims = train.cases
    suites["mismatch-train"] = []
    typo_rng = random.Random(20261208)  # its own seed: the train typos do not depend on --per-suite
    suites["typo-train"] = [c.model_copy(update={"query": _typos(c.query, typo_rng)}) for c in claims]
    suites["stripped-train"] = [
        c.model_copy(update={"query": " ".join(w for w in c.query.split() if w.lower().strip(",.;:") not in STOP)})
        for c in claims
    ]
    analyze = _en_stem().analyze
    text = {d["_id"]: (d.get("title") or "") + " " + d["text"] for d in _corpus(scifact)}
    for c in claims:
        judged = {token for t in c.judgments for token in analyze(text.get(t, ""))}
        left = [w for w in c.query.split() if (tokens := analyze(w)) and not judged.intersection(tokens)]
        if len(left) >= 3:
            suites["mismatch-train"].append(c.model_copy(update={"query": " ".join(left)}))
    return {name: Suite.of(cases, f"synthetic:{name}") for name, cases in suites.items()}


def all_suites(scifact: Path, per_suite: int) -> dict[str, Suite]:
    train = load_suite(scifact, split="train")
    half = {
        c.id: int(hashlib.sha256(c.id.encode()).hexdigest(), 16) % 2 for c in train.cases
    }  # a fixed split of the train claims
    return {
        "scifact-train": train,
        "train-a": Suite.of([c for c in train.cases if half[c.id] == 0], "train-a"),
        "train-b": Suite.of([c for c in train.cases if half[c.id] == 1], "train-b"),
        **synthetic_suites(scifact, train, per_suite),
        "scifact-test": load_suite(scifact, split="test"),
    }


def ndcg(plan: QueryPlan, collected: Collected, cases: dict[str, Case], mode: str) -> dict[str, float]:
    """Per case nDCG@10 of the mode's ``k = 1000`` ranking (document level)."""
    spec = [s for s in default_metric_specs() if s.name == "ndcg@10"]
    plan = plan.with_channels(MODES[mode])
    runs = {}
    for cid, rankings in collected.rankings.items():
        hits = fuse(plan, {n: rankings[n][: max(plan.channels[n].depth, UNITS)] for n in plan.channels})
        runs[cid] = collapse([(f.document_id, f.chunk_id) for f in hits], "document")[:10]
    scored = score_cases({cid: cases[cid].judgments for cid in runs}, runs, spec)
    return {cid: row["ndcg@10"] for cid, row in scored.items()}


def evaluate(
    bundle: Path, suites: dict[str, Suite], variants: dict[str, dict], cache: Path, log: Callable[[str], None]
) -> dict[str, object]:
    base = load_plan()
    opener = Retriever(bundle, plan=base)
    embedder = CachedQueryEmbedder(opener.embedder())
    bundle_id = opener.bundle_id
    opener.close()
    report: dict[str, object] = {"bundle_id": bundle_id, "units": UNITS, "tolerance": TOLERANCE, "suites": {}}
    for name, suite in suites.items():
        started = time.perf_counter()
        # channel rankings do not depend on fusion: one fixed collection plan keeps the cache valid
        collector = Retriever(bundle, plan=variant_plan(base, COLLECTION, base.collapse), embedder=embedder)
        collected, hit = load_or_collect(cache / f"{name}-u{UNITS}.pkl", collector, suite.cases, UNITS)
        collector.close()
        cases = suite.by_id()
        lexical = ndcg(base, collected, cases, "lexical")
        vector = ndcg(base, collected, cases, "vector")
        better = lexical if statistics.fmean(lexical.values()) >= statistics.fmean(vector.values()) else vector
        rows = {}
        for vname, patch in variants.items():
            hybrid = ndcg(variant_plan(base, patch, base.collapse), collected, cases, "hybrid")
            diff = np.array([hybrid[c] - better[c] for c in sorted(hybrid)])
            rows[vname] = {
                "hybrid": round(statistics.fmean(hybrid.values()), 4),
                "vs_better_channel": round(float(diff.mean()), 4),
                "interval95": [round(float(x), 4) for x in _bootstrap(diff)],
            }
        report["suites"][name] = {
            "cases": len(cases),
            "digest": suite.digest,
            "lexical": round(statistics.fmean(lexical.values()), 4),
            "vector": round(statistics.fmean(vector.values()), 4),
            "variants": rows,
            "collection": {"from_cache": hit, "seconds": round(time.perf_counter() - started, 1)},
        }
        log(f"{name}: {json.dumps(report['suites'][name])}")
    return report


def _bootstrap(diff: np.ndarray, resamples: int = 10_000) -> tuple[float, float]:
    """95 % percentile interval of the mean of paired per-case differences (seed 0)."""
    rng = np.random.default_rng(0)
    means = diff[rng.integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def markdown(report: dict, variants: Sequence[str]) -> str:
    head = "| suite | cases | lexical | vector | " + " | ".join(f"{v} (Δ vs better)" for v in variants) + " |"
    lines = [head, "|" + "---|" * (4 + len(variants))]
    for name, s in report["suites"].items():
        cells = [
            f"{r['hybrid']:.4f} ({r['vs_better_channel']:+.4f} [{r['interval95'][0]:+.4f}, {r['interval95'][1]:+.4f}])"
            for r in (s["variants"][v] for v in variants)
        ]
        lines.append(f"| {name} | {s['cases']} | {s['lexical']:.4f} | {s['vector']:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    add_scifact_argument(parser)
    parser.add_argument("--cache", type=Path, default=Path("var/fusion_bench"))
    parser.add_argument("--per-suite", type=int, default=300)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    suites = all_suites(args.scifact, args.per_suite)
    report = evaluate(args.bundle, suites, VARIANTS, args.cache, lambda s: print(s, flush=True))
    report["machine"] = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        print(markdown(report, list(VARIANTS)))


if __name__ == "__main__":
    main()
