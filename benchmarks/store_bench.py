"""Object-store benchmark: publishing and hydrating a bundle, and a build's stage hand-off, on the
folder backend and on S3 (moto's server on 127.0.0.1, in its own process), against plain local
verification; and the first query on a machine that must fetch the bundle (cold) or has it (warm).

    python -m benchmarks.store_bench [--corpus data/scifact-sample/rev-1.jsonl] [--rounds 3]

The corpus is built once with the stage functions (no Dagster) into a temporary home. For each
backend and round: ``push_bundle`` into an empty store; ``hydrate_bundle`` into an empty folder
(download, every blob's digest, complete bundle verification, atomic publication);
``open_bundle`` of the local copy (verification alone, its in-process memo cleared); the stage
hand-off — every stage output of the revision read by a second, empty home (``read_output``:
pointer, listing, blobs); and the first query through ``Retriever`` with the bundle fetched
(cold) or present (warm). Medians over rounds; prints one JSON object. moto keeps objects in
memory and talks plain HTTP on loopback: the S3 figures are a lower bound for a real service,
where each request pays a network round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from ragpipe.bundle import verify
from ragpipe.bundle.objects import hydrate_bundle, push_bundle
from ragpipe.bundle.verify import open_bundle
from ragpipe.corpus.registry import register_revision
from ragpipe.kernel.workspace import Workspace
from ragpipe.retrieval.retriever import Retriever
from ragpipe.spec import load_pipeline_spec
from ragpipe.stages import steps
from ragpipe.stages.stage_replica import push_version
from ragpipe.stages.stage_store import read_output
from ragpipe.storage.local import LocalObjectStore
from ragpipe.storage.s3 import S3ObjectStore
from ragpipe_tests.support.s3_server import CREDENTIALS, REGION, S3Server

STAGES = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index", "index_bundle"]
QUERY = "Aspirin reduces the risk of cardiovascular events"


def timed(work) -> tuple[float, object]:
    t0 = time.perf_counter()
    result = work()
    return time.perf_counter() - t0, result


def forget_verifications() -> None:
    verify._PAYLOAD_OK.clear()  # the process-wide memo of verified payloads: every round verifies


def build(root: Path, corpus: Path) -> tuple[Workspace, Path]:
    ws, spec = Workspace(root / "built"), load_pipeline_spec()
    register_revision(ws.registry, "r", corpus, "beir", "public")
    for run in steps.BUILD_STEPS:
        run(ws, "r", spec)
    return ws, ws.located(str(steps.read_stage_record(ws, "r", "index_bundle").facts["bundle_path"]))


def one_round(store, bundle: Path, root: Path, env: dict[str, str], ws: Workspace) -> dict[str, float]:
    forget_verifications()
    push_s, _ = timed(lambda: push_bundle(store, open_bundle(bundle)))
    forget_verifications()
    verify_s, _ = timed(lambda: open_bundle(bundle))
    forget_verifications()
    hydrate_s, got = timed(lambda: hydrate_bundle(store, open_bundle(bundle).bundle_id, root / "cache"))
    forget_verifications()
    cold_s, _ = timed(lambda: Retriever(got.path).query(QUERY, k=10))
    warm_s, _ = timed(lambda: Retriever(got.path).query(QUERY, k=10))
    # the stage hand-off: publish the revision's outputs to the store, then read them from an empty home
    outputs = [read_output(ws, "r", stage) for stage in STAGES]  # the local build's, before a store is set
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        for out in outputs:
            push_version(store, out.record, out.path, lambda _: None)
        other = Workspace(root / "other")
        handoff_s, _ = timed(lambda: [read_output(other, "r", stage) for stage in STAGES])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {
        "push_s": push_s,
        "hydrate_s": hydrate_s,
        "verify_local_s": verify_s,
        "stage_handoff_s": handoff_s,
        "first_query_cold_s": hydrate_s + cold_s,
        "first_query_warm_s": warm_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=Path("data/scifact-sample/rev-1.jsonl"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ragpipe-store-bench-"))
    server = S3Server.start()
    try:
        ws, bundle = build(root, args.corpus)
        Retriever(bundle).query(QUERY, k=10)  # the query graph is exported once, before any round
        client = server.client()
        results: dict[str, list[dict[str, float]]] = {"folder": [], "s3": []}
        for i in range(args.rounds):
            for backend in ("folder", "s3"):
                folder = root / f"{backend}-{i}"
                if backend == "folder":
                    store, env = LocalObjectStore(folder / "store"), {"RAGPIPE_STORE": str(folder / "store")}
                else:
                    name = server.bucket()
                    store = S3ObjectStore(name, "b", endpoint_url=server.endpoint, region_name=REGION, **CREDENTIALS)
                    env = {"RAGPIPE_STORE": f"s3://{name}/b", **server.env()}
                results[backend].append(one_round(store, bundle, folder, env, ws))
                shutil.rmtree(folder, ignore_errors=True)
        del client
        files = sorted(p for p in bundle.rglob("*") if p.is_file())
        print(
            json.dumps(
                {
                    "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
                    "corpus": str(args.corpus),
                    "bundle_files": len(files),
                    "bundle_bytes": sum(p.stat().st_size for p in files),
                    "rounds": args.rounds,
                    "median": {
                        backend: {k: round(statistics.median(r[k] for r in rounds), 3) for k in rounds[0]}
                        for backend, rounds in results.items()
                    },
                },
                indent=2,
            )
        )
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
