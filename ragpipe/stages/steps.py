"""One function per asset: read the revision's inputs, call domain code, publish the stage output.

Outputs are content-addressed (``ragpipe.stages.stage_store``): each materialization publishes
``work/<revision>/<stage>/<data version hex>/`` atomically unless that version exists, then points
the partition's ``latest.json`` at it. A stage reads each upstream pointer once, refuses upstream
outputs recorded under another spec or built from other versions than the ones it is combining,
and records the versions it read. Each function holds the workspace lock shared, so garbage
collection never runs in the middle of one.
"""

from __future__ import annotations

import time
from pathlib import Path

from ragpipe.chunking.chunkers import chunk_documents, make_chunker, verify_chunks
from ragpipe.chunking.models import chunk_set_digest, read_chunks, write_chunks
from ragpipe.corpus.models import SnapshotSummary
from ragpipe.corpus.registry import load_revision, read_registered_corpus
from ragpipe.corpus.snapshot import build_snapshot, read_snapshot, read_snapshot_documents, write_snapshot
from ragpipe.embedding.compute import Progress, embeddings_digest, write_embeddings
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.publish import StepHook
from ragpipe.kernel.workspace import Workspace
from ragpipe.representations.derive import (
    derive_representations,
    read_representations,
    representation_set_digest,
    write_representations,
)
from ragpipe.representations.generation_run import GenerationFailed, GenerationOutcome, generate_representations
from ragpipe.representations.generations import GENERATIONS_FILE, write_generations
from ragpipe.spec import PipelineSpec
from ragpipe.stages.embedding_shards import embed_revision, usage_metadata
from ragpipe.stages.generation_metadata import generation_metadata
from ragpipe.stages.index_steps import check_bundle, run_index_bundle, run_lexical_index, run_vector_index
from ragpipe.stages.results import StageResult, Table, finish, table
from ragpipe.stages.stage_store import (
    StageError,
    StageRecord,
    holding_workspace_lock,
    publish_stage,
    read_output,
    read_outputs,
    read_version,
    version_dir,
)
from ragpipe.work.failures import BudgetExhausted, BudgetUnenforceable
from ragpipe.work.usage import PriceError, load_prices

# The asset layer and the CLI call every stage through this module.
__all__ = [
    "BUILD_STEPS",
    "StageError",
    "StageRecord",
    "StageResult",
    "check_bundle",
    "check_chunks",
    "read_stage_record",
    "run_chunks",
    "run_embeddings",
    "run_index_bundle",
    "run_lexical_index",
    "run_representations",
    "run_source_snapshot",
    "run_vector_index",
]


def read_stage_record(ws: Workspace, revision: str, stage: str, spec: PipelineSpec | None = None) -> StageRecord:
    """The latest record of ``stage``; with ``spec``, refuse it if built under another spec."""
    return read_output(ws, revision, stage, spec).record


@holding_workspace_lock
def run_source_snapshot(
    ws: Workspace, revision: str, spec: PipelineSpec, *, on_step: StepHook | None = None
) -> StageResult:
    t0 = time.perf_counter()
    record = load_revision(ws.registry, revision)
    documents, summary = build_snapshot(
        read_registered_corpus(record, ws.sources), revision, record.default_scope, spec.snapshot
    )
    out = publish_stage(
        ws,
        revision,
        "source_snapshot",
        spec,
        summary.corpus_digest,
        lambda tmp: write_snapshot(tmp, documents, summary),
        {"documents": len(documents), "excluded": len(summary.excluded), "default_scope": record.default_scope},
        on_step=on_step,
    )
    scopes: dict[str, int] = {}
    for d in documents:
        for s in d.access_scopes:
            scopes[s] = scopes.get(s, 0) + 1
    return finish(
        out,
        t0,
        version_dir(ws, revision, "source_snapshot", out.data_version),
        len(documents),
        {
            "documents": len(documents),
            "excluded": len(summary.excluded),
            "corpus_digest": summary.corpus_digest,
            "default_scope": record.default_scope,
            "source": Path(record.source_path),
        },
        {
            "excluded_documents": table(
                [("document", "string"), ("location", "string"), ("reason", "string")],
                [[e.document_id, e.location, e.reason] for e in summary.excluded],
            ),
            "access_scopes": table(
                [("scope", "string"), ("documents", "int")], [[k, v] for k, v in sorted(scopes.items())]
            ),
            **metadata_tables(summary),
        },
    )


def metadata_tables(summary: SnapshotSummary) -> dict[str, Table | None]:
    """The snapshot's metadata facts as tables (``None``, so left out, when there are no rows)."""
    return {
        "metadata_fields": table(
            [("key", "string"), ("type", "string"), ("documents", "int")],
            [[k, t, n] for k, types in summary.metadata_fields.items() for t, n in types.items()],
        ),
        "metadata_not_kept": table(
            [("key", "string"), ("documents", "int"), ("reason", "string"), ("first", "string")],
            [[n.key, n.documents, n.reason, n.first] for n in summary.metadata_not_kept],
        ),
    }


@holding_workspace_lock
def run_chunks(ws: Workspace, revision: str, spec: PipelineSpec, *, on_step: StepHook | None = None) -> StageResult:
    t0 = time.perf_counter()
    snap = read_output(ws, revision, "source_snapshot", spec)
    documents, _ = read_snapshot(snap.path)
    chunks = chunk_documents(documents, make_chunker(spec.chunker, spec.own_spec_ids["chunks"]))
    digest = chunk_set_digest(chunks)
    out = publish_stage(
        ws,
        revision,
        "chunks",
        spec,
        digest,
        lambda tmp: write_chunks(tmp / "chunks.parquet", chunks),
        {"chunks": len(chunks)},
        {"source_snapshot": snap},
        on_step,
    )
    sizes = sorted(c.byte_end - c.byte_start for c in chunks) or [0]
    return finish(
        out,
        t0,
        version_dir(ws, revision, "chunks", out.data_version),
        len(chunks),
        {
            "chunks": len(chunks),
            "documents": len(documents),
            "chunk_set_digest": digest,
            "chunker_spec_id": spec.own_spec_ids["chunks"],
            "median_chunk_bytes": sizes[len(sizes) // 2],
            "max_chunk_bytes": sizes[-1],
        },
    )


@holding_workspace_lock
def check_chunks(ws: Workspace, revision: str) -> tuple[int, list[str]]:
    """Re-verify every chunk of the latest ``chunks`` output against the snapshot version it was
    built from: (chunks checked, problems)."""
    chunks = read_output(ws, revision, "chunks")
    snapshot = read_version(ws, revision, "source_snapshot", chunks.record.inputs["source_snapshot"], "chunks")
    documents = read_snapshot_documents(snapshot.path / "documents.parquet")
    items = read_chunks(chunks.path / "chunks.parquet")
    return len(items), verify_chunks(documents, items)


@holding_workspace_lock
def run_representations(
    ws: Workspace, revision: str, spec: PipelineSpec, *, on_step: StepHook | None = None
) -> StageResult:
    """Derive (and generate, for generated kinds) every chunk's representations; a generation
    that cannot finish publishes nothing (``StageError``, one line) and keeps what it finished."""
    t0 = time.perf_counter()
    ins = read_outputs(ws, revision, ["source_snapshot", "chunks"], spec)
    documents = read_snapshot_documents(ins["source_snapshot"].path / "documents.parquet")
    chunks = read_chunks(ins["chunks"].path / "chunks.parquet")
    producer = spec.own_spec_ids["representations"]
    generation = _generate(ws, spec, documents, chunks) if spec.representations.generated_kinds else None
    reps = derive_representations(
        documents, chunks, spec.representations.kinds, producer, generation.texts if generation else None
    )
    digest = representation_set_digest(reps)

    def write(tmp: Path) -> None:
        write_representations(tmp / "representations.parquet", reps)
        if generation is not None:
            write_generations(tmp / GENERATIONS_FILE, generation.records)

    facts = {"representations": len(reps)} | ({"generated": len(generation.records)} if generation else {})
    out = publish_stage(ws, revision, "representations", spec, digest, write, facts, ins, on_step)
    kinds = {k: sum(r.kind == k for r in reps) for k in spec.representations.kinds}
    return finish(
        out,
        t0,
        version_dir(ws, revision, "representations", out.data_version),
        len(reps),
        {"representations": len(reps), "representation_set_digest": digest}
        | (generation_metadata(generation) if generation else {}),
        {"kinds": table([("kind", "string"), ("representations", "int")], [[k, v] for k, v in kinds.items()])},
    )


def _generate(ws: Workspace, spec: PipelineSpec, documents, chunks) -> GenerationOutcome:
    try:
        return generate_representations(
            documents,
            chunks,
            spec.representations,
            spec.own_spec_ids["representations"],
            spec.execution.generation,
            ws.generation_cache,
            load_prices(),
        )
    except (GenerationFailed, BudgetExhausted, BudgetUnenforceable, PriceError) as exc:
        raise StageError(f"representations: {exc}") from None


@holding_workspace_lock
def run_embeddings(
    ws: Workspace,
    revision: str,
    spec: PipelineSpec,
    progress: Progress | None = None,
    *,
    on_step: StepHook | None = None,
) -> StageResult:
    t0 = time.perf_counter()
    ins = {"representations": read_output(ws, revision, "representations", spec)}
    if not spec.vector_index.enabled:
        out = publish_stage(
            ws,
            revision,
            "embeddings",
            spec,
            content_id("embeddings-disabled", 1, {}),
            lambda tmp: None,
            {"enabled": False},
            ins,
            on_step,
        )
        # A lexical-only pipeline: no vectors, so zero rows.
        return finish(out, t0, version_dir(ws, revision, "embeddings", out.data_version), 0, {"enabled": False})
    reps = read_representations(ins["representations"].path / "representations.parquet")
    embedder_id = spec.own_spec_ids["embeddings"]
    vectors, stats = embed_revision(ws, revision, spec, ins["representations"], reps, progress)
    # The exact vectors: a run with another batch size may differ in the last bits and then
    # publishes its own version folder (the bundle ID does not depend on it).
    digest = embeddings_digest([str(r.representation_id) for r in reps], vectors)
    out = publish_stage(
        ws,
        revision,
        "embeddings",
        spec,
        digest,
        lambda tmp: write_embeddings(tmp / "embeddings.parquet", reps, vectors),
        {"enabled": True, "encoded": stats.encoded, "cache_hits": stats.cache_hits, "unique_texts": stats.unique_texts},
        ins,
        on_step,
    )
    hit_rate = stats.cache_hits / stats.unique_texts if stats.unique_texts else 1.0
    return finish(
        out,
        t0,
        version_dir(ws, revision, "embeddings", out.data_version),
        stats.representations,
        {
            "enabled": True,
            "representations": stats.representations,
            "unique_texts": stats.unique_texts,
            "cache_hits": stats.cache_hits,
            "cache_misses": stats.encoded,
            "encoded": stats.encoded,
            "cache_hit_rate": round(hit_rate, 4),
            "embedder_spec_id": embedder_id,
            "model": spec.embedder.label,
            "dimensions": spec.embedder.dimensions,
            "embeddings_digest": digest,
            "encode_seconds": round(stats.encode_seconds, 3),
        }
        | (
            {"provider": "litellm", "endpoint": spec.embedder.endpoint} | usage_metadata(stats)
            if spec.embedder.remote
            else {}
        ),
    )


# Every build stage in dependency order: a whole build of one revision runs these one after another.
BUILD_STEPS = (
    run_source_snapshot,
    run_chunks,
    run_representations,
    run_embeddings,
    run_lexical_index,
    run_vector_index,
    run_index_bundle,
)
