"""Where a build step's or a query process's memory goes: resident memory per phase.

    python -m benchmarks.memory_phases --home H --step vector_index|index_bundle|query [--tracemalloc N]
        [--scifact PATH]

``H`` is a home ``ann_bench --hybrid --keep`` built (``var/ann_bench/hybrid-<n>-<key>``): its
revision ``bench`` with every stage published. The process runs one thing, as the build or a
query process runs it — the ``vector_index`` step (built again, into a throwaway workspace copy
of the stage records it reads), the ``index_bundle`` step (published again, into a fresh
``bundles`` folder, so the whole publication and its verification run), or ``query``
(``open_bundle`` with the lance table's checks deferred, then a ``Retriever`` of the checked-in
plan) — with the functions listed in ``PHASES`` wrapped: for each call, the resident set size
(``VmRSS``) before and after, and the peak (``VmHWM``, reset at the call's start through
``/proc/self/clear_refs``, so it is the call's own peak; an enclosing call's peak includes it).
Nested calls are indented. ``--tracemalloc N`` also prints the ``N`` source lines holding the
most Python-allocated memory at the end (slow; its own figures only, RSS is then inflated).
``--scifact PATH``: the SciFact folder the home's ``ann_bench`` run was given (the ``query`` step
reads its queries; without it, the in-repo sample's, as ``ann_bench``).

Prints one line per call (MiB) and a JSON summary. Linux only. Nothing here is imported by the
package.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import shutil
import sys
import time
import tracemalloc
from pathlib import Path

from benchmarks.scifact import add_scifact_argument

# module:attribute (functions) or module:Class.method, wrapped where they are looked up
PHASES = {
    "vector_index": [
        "ragpipe.stages.index_steps:_rows",
        "ragpipe.corpus.snapshot:read_snapshot_documents",
        "ragpipe.representations.derive:read_representations",
        "ragpipe.index.rows:index_rows",
        "ragpipe.embedding.compute:read_embeddings",
        "ragpipe.stages.index_steps:_embeddings",
        "ragpipe.stages.index_steps:_index_columns",
        "ragpipe.index.vector:write_vector_table",
        "ragpipe.index.vector:index_vector_table",
        "ragpipe.index.vector:build_vector_index",
        "ragpipe.index.vector:vector_row_count",
        "ragpipe.index.vector:_create_ann_index",
    ],
    "index_bundle": [
        "ragpipe.bundle.build:publish_bundle",
        "ragpipe.bundle.build:_copy_payload",
        "ragpipe.bundle.build:_file_entries",
        "ragpipe.bundle.payload_checks:stored_vectors",
        "ragpipe.bundle.payload_checks:stored_embeddings_digest",
        "ragpipe.index.vector_file:vectors_file_bytes",
    ],
    "query": [
        "ragpipe.retrieval.retriever:Retriever.__init__",
        "ragpipe.index.lexical:LexicalSearcher.open",
        "ragpipe.retrieval.filtering:BundleFilters.__init__",
        "ragpipe.retrieval.vector_engine:open_bundle_vectors",
        "ragpipe.index.vector_memory:MemoryVectorSearcher.__init__",
        "ragpipe.index.vector_memory:verified_vectors",
    ],
}
VERIFY = [
    "ragpipe.bundle.verify:open_bundle",
    "ragpipe.bundle.verify:_check_files",
    "ragpipe.corpus.snapshot:read_snapshot_documents",
    "ragpipe.chunking.models:read_chunks",
    "ragpipe.representations.derive:read_representations",
    "ragpipe.bundle.payload_checks:check_payload",
    "ragpipe.bundle.payload_checks:check_documents",
    "ragpipe.bundle.payload_checks:check_chunks",
    "ragpipe.bundle.payload_checks:check_representations",
    "ragpipe.index.rows:index_rows",
    "ragpipe.index.lexical:read_lexical_rows",
    "ragpipe.index.lexical:verify_scope_groups",
    "ragpipe.index.lexical_checks:structure_problems",
    "ragpipe.bundle.payload_checks:check_vectors_file",
    "ragpipe.bundle.payload_checks:check_vector_table",
    "ragpipe.index.vector_file:read_vectors_file",
    "ragpipe.index.vector_checks:search_path_problems",
    # the streaming verification (names of the current code; the ones above are the earlier code's)
    "ragpipe.bundle.payload_checks:_walk",
    "ragpipe.bundle.payload_checks:check_index_columns",
    "ragpipe.index.lexical:read_lexical_table",
    "ragpipe.index.vector_file:read_vectors",
    "ragpipe.bundle.payload_checks:stored_vectors",
    "ragpipe.index.rows:index_columns",
    "ragpipe.bundle.tables:ChunkTable.__init__",
    "ragpipe.retrieval.audience:AudienceIndexes.__init__",
]


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as fh:  # "5": reset the peak resident set size
        fh.write("5")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, object]] = []
        self.depth = 0
        self.peaks: list[float] = []  # running peak of each enclosing call

    def wrap(self, name: str, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            before = _status("VmRSS")
            if self.peaks:  # the enclosing call's window so far
                self.peaks[-1] = max(self.peaks[-1], _status("VmHWM"))
            self.peaks.append(0.0)
            _reset_peak()
            entry = {"call": name, "depth": self.depth, "before": round(before, 1)}
            self.calls.append(entry)
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1
                peak = max(self.peaks.pop(), _status("VmHWM"))
                if self.peaks:
                    self.peaks[-1] = max(self.peaks[-1], peak)
                entry |= {
                    "after": round(_status("VmRSS"), 1),
                    "peak": round(peak, 1),
                    "seconds": round(time.perf_counter() - t0, 2),
                }

        return wrapper

    def install(self, targets: list[str]) -> None:
        for target in dict.fromkeys(targets):
            module_name, attr = target.split(":")
            try:
                module = importlib.import_module(module_name)
                if "." in attr:
                    cls_name, meth = attr.split(".")
                    cls = getattr(module, cls_name)
                    original = cls.__dict__[meth]
                    is_class = isinstance(original, classmethod)
                    fn = original.__func__ if is_class else original
                    wrapped = self.wrap(attr, fn)
                    setattr(cls, meth, classmethod(wrapped) if is_class else wrapped)
                    continue
                original = getattr(module, attr)
            except (ImportError, AttributeError, KeyError):
                continue  # a name the code measured does not have (phases of earlier and later code)
            wrapped = self.wrap(attr, original)
            for loaded in list(sys.modules.values()):  # every module that bound the same function
                if getattr(loaded, "__name__", "").startswith("ragpipe") and getattr(loaded, attr, None) is original:
                    setattr(loaded, attr, wrapped)

    def print(self) -> None:
        print(f"{'call':<60} {'before':>9} {'peak':>9} {'after':>9} {'s':>7}", file=sys.stderr)
        for c in self.calls:
            label = "  " * int(c["depth"]) + str(c["call"])  # type: ignore[call-overload]
            print(
                f"{label:<60} {c['before']:>9} {c.get('peak', '?'):>9} {c.get('after', '?'):>9} "
                f"{c.get('seconds', '?'):>7}",
                file=sys.stderr,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, required=True, help="an ann_bench --hybrid --keep home")
    parser.add_argument("--step", choices=["vector_index", "index_bundle", "query"], required=True)
    parser.add_argument("--tracemalloc", type=int, default=0)
    add_scifact_argument(parser, fallback="the in-repo sample data/scifact-sample, as ann_bench")
    args = parser.parse_args()
    os.environ.pop("RAGPIPE_STORE", None)
    if args.tracemalloc:
        tracemalloc.start(1)
    import ragpipe.bundle.build  # noqa: F401  (loaded before wrapping: every binding is found)
    import ragpipe.bundle.payload_checks  # noqa: F401
    import ragpipe.index.lexical_checks  # noqa: F401
    import ragpipe.index.vector  # noqa: F401
    import ragpipe.index.vector_checks  # noqa: F401
    import ragpipe.retrieval.retriever  # noqa: F401
    import ragpipe.stages.index_steps  # noqa: F401
    from benchmarks.ann_bench import bench_spec, real_vectors

    build = json.loads((args.home / "build.json").read_text(encoding="utf-8"))
    ann = build["ann"]
    from ragpipe.spec import HnswSqIndex, PqIndex

    spec = bench_spec((HnswSqIndex if ann["kind"] == "ivf_hnsw_sq" else PqIndex)(**ann))
    recorder = Recorder()
    recorder.install(PHASES[args.step] + VERIFY)
    out: dict[str, object] = {"step": args.step, "start_rss_mib": round(_status("VmRSS"), 1)}
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.stages import steps

    ws = Workspace(args.home / "ragpipe")
    if args.step == "vector_index":
        from ragpipe.stages.stage_store import read_output

        stage = read_output(ws, "bench", "vector_index", spec).path.parent
        moved = stage.with_name(stage.name + ".memory-phases")
        stage.rename(moved)  # published again from scratch; the original comes back afterwards
        try:
            steps.run_vector_index(ws, "bench", spec)
        finally:
            shutil.rmtree(stage)
            moved.rename(stage)
    elif args.step == "index_bundle":
        from ragpipe.stages.stage_store import read_output

        stage = read_output(ws, "bench", "index_bundle", spec).path.parent
        bundles, moved_bundles = ws.bundles, ws.bundles.with_name("bundles.memory-phases")
        moved = stage.with_name(stage.name + ".memory-phases")
        stage.rename(moved)
        bundles.rename(moved_bundles)
        try:
            steps.run_index_bundle(ws, "bench", spec)
        finally:
            shutil.rmtree(stage)
            shutil.rmtree(bundles)
            moved.rename(stage)
            moved_bundles.rename(bundles)
    else:
        from benchmarks.ann_bench import PrecomputedQueries, query_texts
        from ragpipe.bundle.verify import open_bundle
        from ragpipe.retrieval.authz import Subject
        from ragpipe.retrieval.plan import load_plan
        from ragpipe.retrieval.retriever import Retriever

        texts = query_texts(args.scifact, 50)
        vectors, _ = real_vectors(args.home.parent, texts, queries=True)
        embedder = PrecomputedQueries(spec.embedder, texts, vectors)
        verified = open_bundle(Path(build["bundle"]), defer_vector_table=True)
        out["verified_rss_mib"] = round(_status("VmRSS"), 1)
        retriever = Retriever(verified, plan=load_plan(), embedder=embedder, query_graph_dir=args.home / "qg")
        out["retriever_rss_mib"] = round(_status("VmRSS"), 1)
        for mode in ("lexical", "vector", "hybrid"):
            for text in texts:
                retriever.query(text, Subject("bench", ("public",)), k=10, mode=mode)
        out["queried_rss_mib"] = round(_status("VmRSS"), 1)
    out["end_rss_mib"] = round(_status("VmRSS"), 1)
    top = [float(c["peak"]) for c in recorder.calls if c["depth"] == 0 and "peak" in c]  # type: ignore[arg-type]
    out["peak_rss_mib"] = round(max([*top, _status("VmHWM")]), 1)  # the largest call's peak, or since
    recorder.print()
    if args.tracemalloc:
        snapshot = tracemalloc.take_snapshot()
        for stat in snapshot.statistics("lineno")[: args.tracemalloc]:
            print(f"{stat.size / 2**20:9.1f} MiB {stat.count:>9} {stat.traceback}", file=sys.stderr)
    out["calls"] = recorder.calls
    print(json.dumps(out))


if __name__ == "__main__":
    main()
