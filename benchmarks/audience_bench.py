"""Audience-view benchmark on SciFact: first-query latency for restricted audiences.

    python -m benchmarks.audience_bench --scifact PATH
        [--out var/bench-audience] [--sample 50]

1. Builds a lexical-only bundle (no embeddings) of the SciFact corpus with access scopes assigned
   deterministically from a SHA-256 of each document ID: one of four scopes, and 20 % of documents a
   second one — eight scope groups. Reports the lexical stage's time and the groups.
2. For each restricted subject, a fresh ``Retriever``: the latency of its very first lexical
   query (``k=10``, view opened on the query path), then p50/p95 of the 300 test claims.
3. First-query latency with a large sample: before each of the 300 claims, every open view is
   closed, so each query opens its audience's view again (page cache warm, as in a serving process).
4. What one view costs: memory maps, threads, file descriptors and RSS after opening eight views.
5. Exactness: for ``--sample`` claims per subject, the lexical channel's hits (depth 100) from the
   view equal, bit for bit, those of an index built from the subject's authorized rows only.
6. ``verify_scope_groups`` on the bundle's lexical index (what bundle verification will add).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.scifact import add_scifact_argument
from ragpipe.corpus.snapshot import read_snapshot_documents
from ragpipe.evaluation.suite_load import load_suite
from ragpipe.index.lexical import LexicalSearcher, build_lexical_index, verify_scope_groups
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexRow, index_rows
from ragpipe.index.segments import read_scope_groups
from ragpipe.representations.derive import read_representations
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
from ragpipe.spec import LexicalIndexSpec, PipelineSpec, load_pipeline_spec

SCOPES = ("public", "staff", "clinical", "legal")
SUBJECTS = [
    ("public",),
    ("staff",),
    ("clinical", "legal"),
    ("public", "staff"),
    ("legal",),
    ("clinical", "public", "staff"),
]
REVISION = "scifact-scoped"


def scopes_of(document_id: str) -> list[str]:
    """One scope from the ID's digest, and a second one (the next scope) for one document in five."""
    digest = hashlib.sha256(document_id.encode("utf-8")).digest()
    first = digest[0] % 4
    return sorted({SCOPES[first], SCOPES[(first + 1) % 4]}) if digest[1] % 5 == 0 else [SCOPES[first]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "n": len(samples),
        "p50_ms": round(statistics.median(samples), 3),
        "p95_ms": round(percentile(samples, 0.95), 3),
        "max_ms": round(max(samples), 3),
    }


def build_bundle(scifact: Path, out: Path) -> tuple[Path, float]:
    """The scoped corpus through every stage (lexical-only spec); (bundle path, lexical stage seconds)."""
    from ragpipe.corpus.registry import register_revision
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.stages import steps

    with gzip.open(scifact / "corpus.jsonl.gz", "rt", encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh]
    corpus = out / "scifact-scoped.jsonl"
    corpus.write_text(
        "".join(json.dumps({**d, "metadata": {"access_scopes": scopes_of(d["_id"])}}) + "\n" for d in docs),
        encoding="utf-8",
    )
    base = load_pipeline_spec()
    spec = PipelineSpec.model_validate(
        {**base.model_dump(by_alias=True), "vector_index": {"enabled": False, "metric": "cosine"}}
    )
    ws = Workspace(out / "home")
    register_revision(ws.registry, REVISION, corpus, "beir", "public")
    lexical_seconds = 0.0
    for run in steps.BUILD_STEPS:
        started = time.perf_counter()
        run(ws, REVISION, spec)
        if run is steps.run_lexical_index:
            lexical_seconds = time.perf_counter() - started
    return Path(str(steps.read_stage_record(ws, REVISION, "index_bundle").facts["bundle_path"])), lexical_seconds


def timed_query(retriever: Retriever, text: str, subject: Subject) -> float:
    started = time.perf_counter()
    retriever.query(text, subject, k=10, mode="lexical")
    return (time.perf_counter() - started) * 1000


def view_costs(retriever: Retriever) -> dict[str, float]:
    """Memory maps, threads, file descriptors and RSS added by opening eight views (then closed)."""

    def rss_kib() -> tuple[int, int]:
        # anonymous memory apart from file pages: a view maps the bundle's own files (same inodes),
        # whose pages count once per mapping in RSS but exist once in the page cache
        status = {line.split(":")[0]: line.split()[1] for line in open("/proc/self/status") if line.startswith("Rss")}
        return int(status["RssAnon"]), int(status["RssFile"])

    retriever.lexical.close()
    time.sleep(1.1)  # let tantivy's watcher threads of closed views end
    maps, threads, rss = len(open("/proc/self/maps").readlines()), threading.active_count(), rss_kib()
    tasks, fds = len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))
    subjects = [
        Subject("c", s)
        for s in [
            ("public",),
            ("staff",),
            ("clinical",),
            ("legal",),
            ("public", "staff"),
            ("staff", "clinical"),
            ("clinical", "legal"),
            ("legal", "public"),
        ]
    ]
    for s in subjects:
        retriever.query("cancer", s, k=10, mode="lexical")
    opened = retriever.lexical.cached_audiences
    out = {
        "views_open": opened,
        "memory_maps_per_view": round((len(open("/proc/self/maps").readlines()) - maps) / opened, 1),
        "os_threads_per_view": round((len(os.listdir("/proc/self/task")) - tasks) / opened, 2),
        "file_descriptors_per_view": round((len(os.listdir("/proc/self/fd")) - fds) / opened, 2),
        "rss_anon_kib_per_view": round((rss_kib()[0] - rss[0]) / opened, 1),
        "rss_file_kib_per_view": round((rss_kib()[1] - rss[1]) / opened, 1),
        "python_threads_added": threading.active_count() - threads,
    }
    retriever.lexical.close()
    return out


def exactness(
    retriever: Retriever, rows: list[IndexRow], spec: LexicalIndexSpec, claims: list[str], sample: int, work: Path
) -> dict[str, int]:
    """Lexical hits of each subject's view vs. an index of its authorized rows only (depth 100)."""
    compared = identical = 0
    for scopes in SUBJECTS:
        admitted = [r for r in rows if set(r.access_scopes) & set(scopes)]
        folder = work / ("ref-" + "-".join(scopes))
        folder.mkdir()
        build_lexical_index(folder, admitted, spec)
        reference = LexicalSearcher.open(folder, [(r.representation_id, r.chunk_id, r.document_id) for r in admitted])
        view, _ = retriever.lexical.searcher_for(Subject("x", scopes))
        for text in claims[:sample]:
            compared += 1
            identical += view.search(text, 100, Prefilter(scopes)) == reference.search(text, 100, Prefilter(scopes))
    return {
        "subjects": len(SUBJECTS),
        "claims_per_subject": sample,
        "depth": 100,
        "compared": compared,
        "identical": identical,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    add_scifact_argument(ap)
    ap.add_argument("--out", type=Path, default=Path("var/bench-audience"))
    ap.add_argument("--sample", type=int, default=50)
    args = ap.parse_args()
    out = args.out.resolve()
    if out.exists():
        raise SystemExit(f"{out} exists: remove it for a fresh run")
    out.mkdir(parents=True)
    claims = [case.query for case in sorted(load_suite(args.scifact, split="test").cases, key=lambda c: int(c.id))]

    bundle, lexical_seconds = build_bundle(args.scifact, out)
    groups = read_scope_groups(bundle / "lexical")
    fresh: dict[str, dict[str, object]] = {}
    for scopes in SUBJECTS:
        retriever = Retriever(bundle)  # fresh: no view open yet
        subject = Subject("bench", scopes)
        first = timed_query(retriever, claims[0], subject)
        later = [timed_query(retriever, text, subject) for text in claims[1:]]
        fresh["+".join(scopes)] = {
            "first_query_ms": round(first, 3),
            "next_299": summary(later),
            "builds": retriever.lexical.builds,
        }
        retriever.close()

    retriever = Retriever(bundle)
    reopen: dict[str, dict[str, float]] = {}
    for scopes in SUBJECTS[:3]:
        samples = []
        for text in claims:
            retriever.lexical.close()
            samples.append(timed_query(retriever, text, Subject("bench", scopes)))
        reopen["+".join(scopes)] = summary(samples)
    everyone = Subject("admin", SCOPES)
    bundle_index = summary([timed_query(retriever, text, everyone) for text in claims])
    costs = view_costs(retriever)
    rows = index_rows(
        read_snapshot_documents(bundle / "documents.parquet"), read_representations(bundle / "representations.parquet")
    )
    started = time.perf_counter()
    problems = verify_scope_groups(bundle / "lexical", [r.access_scopes for r in rows])
    verify_ms = (time.perf_counter() - started) * 1000
    spec = LexicalIndexSpec.model_validate(retriever.bundle.manifest.semantic.specs["lexical_index"].spec)
    with tempfile.TemporaryDirectory(dir=out) as work:
        exact = exactness(retriever, rows, spec, claims, args.sample, Path(work))
    retriever.close()
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
                "bundle_id": retriever.bundle_id,
                "lexical_rows": len(rows),
                "scope_groups": [
                    {"scopes": list(g.scopes), "rows": g.rows, "segments": len(g.segment_ids)} for g in groups
                ],
                "lexical_stage_seconds": round(lexical_seconds, 2),
                "fresh_retriever_per_subject": fresh,
                "first_query_view_reopened_each_claim": reopen,
                "bundle_index_all_scopes": bundle_index,
                "view_costs": costs,
                "verify_scope_groups": {"ms": round(verify_ms, 1), "problems": problems},
                "exactness": exact,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
