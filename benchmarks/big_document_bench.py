"""Query cost on a corpus whose largest document is 20 MB (before scope-grouped views, one query took 31 s).

    python -m benchmarks.big_document_bench [--mb 20] [--home var/bench/bigdoc]
        [--vectors] [--queries 200] [--warmup 20]

Builds (once per ``--home``; reused when its bundle exists) a corpus of one synthetic Markdown
document of ``--mb`` MB — paragraphs of 30–120 words drawn with Zipf frequencies (1/rank) from a
seeded vocabulary of ~20,000 invented words, so a few words occur in most chunks and most in few,
a ``##`` heading before about one paragraph in ten — and three small documents,
through every stage with the checked-in pipeline spec; lexical-only unless ``--vectors`` (embedding
the ~52,000 representations of the 20 MB document takes ~50 min on 2 cores). Then, in this
process: the time to open (verify and load) the bundle, and p50/p95 of ``Retriever.query`` over
``--queries`` seeded queries of 1–3 words drawn with the same frequencies after ``--warmup`` queries, for every mode the
bundle has, collapse by chunk and by document, k = 10 and 100, checking that each query returns
min(k, matching units). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.plan import load_plan
from ragpipe.retrieval.retriever import Retriever
from ragpipe.spec import PipelineSpec, load_pipeline_spec

SEED = 7
REVISION = "bigdoc"
SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "tu",
    "ra",
    "si",
    "po",
    "ve",
    "da",
    "qu",
    "ber",
    "gon",
    "tix",
    "mar",
    "sel",
    "vin",
    "dor",
    "pha",
    "lum",
]
SMALL = {
    "small-1.md": "# Harbour notes\n\nThe harbour master logs every ship that enters at dawn.\n",
    "small-2.md": "# Orchard\n\nApple and pear trees need pruning in late winter.\n",
    "small-3.md": "# Kalomi\n\nA short public note that shares some words with the big document: kalo mine tura.\n",
}


def vocabulary(rng: random.Random) -> list[str]:
    return sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))) for _ in range(20_000)})


def zipf_weights(words: list[str]) -> list[float]:
    """Cumulative weights 1/rank: a few words occur in most chunks, most words in few."""
    total, out = 0.0, []
    for rank in range(1, len(words) + 1):
        total += 1.0 / rank
        out.append(total)
    return out


def big_document(target_bytes: int, words: list[str], rng: random.Random) -> str:
    weights = zipf_weights(words)
    parts, size, section = ["# Big document\n\n"], 16, 0
    while size < target_bytes:
        if rng.random() < 0.1:
            section += 1
            part = f"## Section {section} {rng.choice(words)}\n\n"
        else:
            part = " ".join(rng.choices(words, cum_weights=weights, k=rng.randint(30, 120))) + ".\n\n"
        parts.append(part)
        size += len(part.encode("utf-8"))
    return "".join(parts)


def build(home: Path, megabytes: float, vectors: bool) -> Path:
    """The bundle of the synthetic corpus under ``home`` (built by the stage functions, no Dagster)."""
    from ragpipe.corpus.bounds import CorpusBounds
    from ragpipe.corpus.registry import register_revision
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.stages import steps

    ws = Workspace(home / "ragpipe")
    try:
        return Path(str(steps.read_stage_record(ws, REVISION, "index_bundle").facts["bundle_path"]))
    except steps.StageError:
        pass
    rng = random.Random(SEED)
    corpus = home / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    (corpus / "big.md").write_text(big_document(int(megabytes * 1024 * 1024), vocabulary(rng), rng), encoding="utf-8")
    for name, text in SMALL.items():
        (corpus / name).write_text(text, encoding="utf-8")
    spec = load_pipeline_spec()
    if not vectors:
        spec = PipelineSpec.model_validate(
            {**spec.model_dump(by_alias=True), "vector_index": {"enabled": False, "metric": spec.vector_index.metric}}
        )
    # the document is the point: lift the default 8 MiB bound on one document's text
    big = CorpusBounds(document_bytes=int(megabytes * 1024 * 1024) + 1024 * 1024)
    register_revision(ws.registry, REVISION, corpus, "markdown", "public", bounds=big)
    for run in steps.BUILD_STEPS:
        run(ws, REVISION, spec)
    return Path(str(steps.read_stage_record(ws, REVISION, "index_bundle").facts["bundle_path"]))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(retriever: Retriever, queries: list[str], mode: str, k: int, warmup: int) -> dict[str, float]:
    subject = Subject.default()
    for text in queries[:warmup]:
        retriever.query(text, subject, k=k, mode=mode)
    samples, short = [], 0
    for text in queries:
        t0 = time.perf_counter()
        result = retriever.query(text, subject, k=k, mode=mode, trace=True)
        samples.append((time.perf_counter() - t0) * 1000)
        channels = result.trace["depth"]["channels"].values()
        # k means k: fewer than k hits only when every channel ranked all the units it matched
        short += len(result.hits) < k and not all(c["complete"] for c in channels)
    if short:
        raise SystemExit(f"{short} {mode} queries returned fewer than k={k} hits without exhausting a channel")
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p95_ms": round(percentile(samples, 0.95), 2),
        "mean_ms": round(statistics.fmean(samples), 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20.0)
    ap.add_argument("--home", type=Path, default=Path("var/bench/bigdoc"))
    ap.add_argument("--vectors", action="store_true")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()

    t0 = time.perf_counter()
    bundle = build(args.home, args.mb, args.vectors)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    opened = Retriever(bundle)
    open_s = time.perf_counter() - t0
    big = max(opened.titles, key=lambda d: sum(1 for c in opened.chunks.values() if c.document_id == d))
    words = vocabulary(random.Random(SEED))  # the document's words, by frequency rank
    rng = random.Random(SEED + 1)
    weights = zipf_weights(words)
    queries = [" ".join(rng.choices(words, cum_weights=weights, k=rng.randint(1, 3))) for _ in range(args.queries)]
    modes = ("lexical", "vector", "hybrid") if opened.vector is not None else ("lexical",)
    base = load_plan()
    latency: dict[str, dict[str, dict[str, float]]] = {}
    for level in ("chunk", "document"):
        retriever = (
            opened
            if level == base.collapse
            else Retriever(
                bundle,
                plan=base.model_copy(update={"collapse": level}),
                embedder=opened.embedder() if opened.vector is not None else None,
            )
        )
        for mode in modes:
            for k in (10, 100):
                latency.setdefault(level, {})[f"{mode}@k={k}"] = measure(retriever, queries, mode, k, args.warmup)
        if retriever is not opened:
            retriever.close()
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
                "bundle_id": opened.bundle_id,
                "plan_id": base.plan_id,
                "largest_document": {
                    "bytes": max(c.byte_end for c in opened.chunks.values() if c.document_id == big),
                    "chunks": sum(1 for c in opened.chunks.values() if c.document_id == big),
                },
                "documents": len(opened.titles),
                "chunks": len(opened.chunks),
                "vectors": opened.vector is not None,
                "build_s": round(build_s, 1),
                "open_s": round(open_s, 2),
                "queries": len(queries),
                "latency": latency,
            },
            indent=2,
        )
    )
    opened.close()


if __name__ == "__main__":
    main()
