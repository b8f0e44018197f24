"""One function per asset: read the revision's inputs, call domain code, write the stage output.

Every stage writes its output folder atomically together with a ``stage.json`` record holding the
cumulative spec ID it was built with and its data version (the artifact digest). A stage refuses
inputs recorded under a different spec ID than the current pipeline spec expects: building on a
stale upstream would produce an artifact whose identity lies.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ragpipe.bundle.build import BundleInputs, bundle_semantic, publish_bundle
from ragpipe.bundle.manifest import BundleCounts
from ragpipe.bundle.verify import BundleVerificationError, open_bundle
from ragpipe.chunking.chunkers import chunk_documents, make_chunker, verify_chunks
from ragpipe.chunking.models import chunk_set_digest, read_chunks, write_chunks
from ragpipe.corpus.registry import load_revision, read_registered_corpus
from ragpipe.corpus.snapshot import build_snapshot, read_snapshot, read_snapshot_documents, write_snapshot
from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.embedding.compute import compute_embeddings, embeddings_digest, read_embeddings, write_embeddings
from ragpipe.index.lexical import build_lexical_index
from ragpipe.index.rows import index_rows
from ragpipe.index.vector import build_vector_index
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.publish import StepHook, replace_directory
from ragpipe.pipeline_spec import PipelineSpec
from ragpipe.representations.derive import derive_representations, read_representations, representation_set_digest, write_representations
from ragpipe.stages.workspace import Workspace

Progress = Callable[[str], None]
STAGE_RECORD = "stage.json"


class StageError(RuntimeError):
    pass


class StageRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str
    revision: str
    spec_id: str
    data_version: str
    facts: dict[str, str | int | float | bool | None] = {}


@dataclass
class StageResult:
    """What an asset reports: the data version, small metadata, and markdown tables."""

    record: StageRecord
    metadata: dict[str, str | int | float] = field(default_factory=dict)
    markdown: dict[str, str] = field(default_factory=dict)

    @property
    def data_version(self) -> str:
        return self.record.data_version


def read_stage_record(ws: Workspace, revision: str, stage: str, spec: PipelineSpec | None = None) -> StageRecord:
    """The recorded output of ``stage``; with ``spec``, refuse it if built under another spec."""
    path = ws.stage_dir(revision, stage) / STAGE_RECORD
    if not path.exists():
        raise StageError(f"{stage} has not been materialized for revision {revision!r}: materialize it first")
    record = StageRecord.model_validate(json.loads(path.read_text(encoding="utf-8")))
    if spec is not None and record.spec_id != spec.spec_ids[stage]:
        raise StageError(
            f"{stage} for revision {revision!r} was built with spec {record.spec_id}, the current pipeline "
            f"spec expects {spec.spec_ids[stage]}: re-materialize {stage} first"
        )
    return record


def _finish(ws: Workspace, revision: str, stage: str, spec: PipelineSpec, data_version: str, write, facts=None) -> StageRecord:
    record = StageRecord(
        stage=stage, revision=revision, spec_id=spec.spec_ids[stage], data_version=data_version, facts=facts or {}
    )

    def write_all(tmp: Path) -> None:
        write(tmp)
        (tmp / STAGE_RECORD).write_text(record.model_dump_json(indent=2), encoding="utf-8")

    replace_directory(ws.stage_dir(revision, stage), write_all)
    return record


def _table(header: list[str], rows: list[list[object]], limit: int = 20) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"\n… {len(rows) - limit} more")
    return "\n".join(lines)


def run_source_snapshot(ws: Workspace, revision: str, spec: PipelineSpec) -> StageResult:
    t0 = time.perf_counter()
    record = load_revision(ws.registry, revision)
    documents, summary = build_snapshot(
        read_registered_corpus(record), revision, record.default_scope, spec.snapshot
    )
    out = _finish(
        ws, revision, "source_snapshot", spec, summary.corpus_digest,
        lambda tmp: write_snapshot(tmp, documents, summary),
        {"documents": len(documents), "excluded": len(summary.excluded), "default_scope": record.default_scope},
    )
    scopes: dict[str, int] = {}
    for d in documents:
        for s in d.access_scopes:
            scopes[s] = scopes.get(s, 0) + 1
    return StageResult(
        out,
        {
            "documents": len(documents),
            "excluded": len(summary.excluded),
            "corpus_digest": summary.corpus_digest,
            "default_scope": record.default_scope,
            "source": record.source_path,
            "seconds": round(time.perf_counter() - t0, 3),
        },
        {
            "excluded_documents": _table(
                ["document", "location", "reason"], [[e.document_id, e.location, e.reason] for e in summary.excluded], 50
            )
            if summary.excluded
            else "none",
            "access_scopes": _table(["scope", "documents"], sorted(map(list, scopes.items()))),
        },
    )


def run_chunks(ws: Workspace, revision: str, spec: PipelineSpec) -> StageResult:
    t0 = time.perf_counter()
    read_stage_record(ws, revision, "source_snapshot", spec)
    documents, _ = read_snapshot(ws.stage_dir(revision, "source_snapshot"))
    chunks = chunk_documents(documents, make_chunker(spec.chunker, spec.own_spec_ids["chunks"]))
    digest = chunk_set_digest(chunks)
    out = _finish(ws, revision, "chunks", spec, digest, lambda tmp: write_chunks(tmp / "chunks.parquet", chunks), {"chunks": len(chunks)})
    sizes = sorted(c.byte_end - c.byte_start for c in chunks) or [0]
    return StageResult(
        out,
        {
            "chunks": len(chunks),
            "documents": len(documents),
            "chunk_set_digest": digest,
            "chunker_spec_id": spec.own_spec_ids["chunks"],
            "median_chunk_bytes": sizes[len(sizes) // 2],
            "max_chunk_bytes": sizes[-1],
            "seconds": round(time.perf_counter() - t0, 3),
        },
    )


def check_chunks(ws: Workspace, revision: str) -> tuple[int, list[str]]:
    """Re-verify every chunk against its source document: (chunks checked, problems)."""
    documents = read_snapshot_documents(ws.stage_dir(revision, "source_snapshot") / "documents.parquet")
    chunks = read_chunks(ws.stage_dir(revision, "chunks") / "chunks.parquet")
    return len(chunks), verify_chunks(documents, chunks)


def run_representations(ws: Workspace, revision: str, spec: PipelineSpec) -> StageResult:
    t0 = time.perf_counter()
    read_stage_record(ws, revision, "chunks", spec)
    documents = read_snapshot_documents(ws.stage_dir(revision, "source_snapshot") / "documents.parquet")
    chunks = read_chunks(ws.stage_dir(revision, "chunks") / "chunks.parquet")
    reps = derive_representations(documents, chunks, spec.representations.kinds, spec.own_spec_ids["representations"])
    digest = representation_set_digest(reps)
    out = _finish(
        ws, revision, "representations", spec, digest,
        lambda tmp: write_representations(tmp / "representations.parquet", reps), {"representations": len(reps)},
    )
    kinds = {k: sum(r.kind == k for r in reps) for k in spec.representations.kinds}
    return StageResult(
        out,
        {"representations": len(reps), "representation_set_digest": digest, "seconds": round(time.perf_counter() - t0, 3)},
        {"kinds": _table(["kind", "representations"], [[k, v] for k, v in kinds.items()])},
    )


@lru_cache(maxsize=2)
def _embedder(spec: PipelineSpec):
    from ragpipe.embedding.embedder import SentenceTransformerEmbedder  # torch is heavy: load on demand

    return SentenceTransformerEmbedder(spec.embedder, spec.execution.embed_batch_size, spec.execution.torch_threads)


def run_embeddings(ws: Workspace, revision: str, spec: PipelineSpec, progress: Progress | None = None) -> StageResult:
    t0 = time.perf_counter()
    read_stage_record(ws, revision, "representations", spec)
    if not spec.vector_index.enabled:
        out = _finish(ws, revision, "embeddings", spec, content_id("embeddings-disabled", 1, {}), lambda tmp: None, {"enabled": False})
        return StageResult(out, {"enabled": "false (lexical-only pipeline)"})
    reps = read_representations(ws.stage_dir(revision, "representations") / "representations.parquet")
    embedder_id = spec.own_spec_ids["embeddings"]
    cache = EmbeddingCache(ws.embedding_cache, embedder_id, spec.embedder.dimensions)
    vectors, stats = compute_embeddings(reps, cache, lambda: _embedder(spec), progress=progress)
    digest = embeddings_digest([str(r.representation_id) for r in reps], vectors)
    out = _finish(
        ws, revision, "embeddings", spec, digest,
        lambda tmp: write_embeddings(tmp / "embeddings.parquet", reps, vectors),
        {"enabled": True, "encoded": stats.encoded, "cache_hits": stats.cache_hits, "unique_texts": stats.unique_texts},
    )
    hit_rate = stats.cache_hits / stats.unique_texts if stats.unique_texts else 1.0
    return StageResult(
        out,
        {
            "representations": stats.representations,
            "unique_texts": stats.unique_texts,
            "cache_hits": stats.cache_hits,
            "cache_misses": stats.encoded,
            "encoded": stats.encoded,
            "cache_hit_rate": round(hit_rate, 4),
            "embedder_spec_id": embedder_id,
            "model": spec.embedder.model_name,
            "dimensions": spec.embedder.dimensions,
            "embeddings_digest": digest,
            "encode_seconds": round(stats.encode_seconds, 3),
            "seconds": round(time.perf_counter() - t0, 3),
        },
    )


def _rows(ws: Workspace, revision: str):
    documents = read_snapshot_documents(ws.stage_dir(revision, "source_snapshot") / "documents.parquet")
    reps = read_representations(ws.stage_dir(revision, "representations") / "representations.parquet")
    return reps, index_rows(documents, reps)


def run_lexical_index(ws: Workspace, revision: str, spec: PipelineSpec) -> StageResult:
    t0 = time.perf_counter()
    rep_record = read_stage_record(ws, revision, "representations", spec)
    reps, rows = _rows(ws, revision)
    count = len(rows)

    def write(tmp: Path) -> None:
        (tmp / "index").mkdir()
        built = build_lexical_index(tmp / "index", rows, spec.lexical_index, spec.execution.index_writer_heap_mb)
        if built != count:
            raise StageError(f"lexical index holds {built} documents, expected {count}")

    # The index files are not byte-reproducible; the data version names what was indexed, how.
    version = content_id("lexical-index", 1, {"representations": rep_record.data_version, "spec": spec.own_spec_ids["lexical_index"]})
    out = _finish(ws, revision, "lexical_index", spec, version, write, {"documents": count})
    return StageResult(
        out,
        {"indexed_representations": count, "tokenizer": spec.lexical_index.tokenizer, "seconds": round(time.perf_counter() - t0, 3)},
    )


def run_vector_index(ws: Workspace, revision: str, spec: PipelineSpec) -> StageResult:
    t0 = time.perf_counter()
    emb_record = read_stage_record(ws, revision, "embeddings", spec)
    if not spec.vector_index.enabled:
        out = _finish(ws, revision, "vector_index", spec, content_id("vector-index-disabled", 1, {}), lambda tmp: None, {"enabled": False})
        return StageResult(out, {"enabled": "false (lexical-only pipeline)"})
    reps, rows = _rows(ws, revision)
    ids, vectors = read_embeddings(ws.stage_dir(revision, "embeddings") / "embeddings.parquet")
    if ids != [r.representation_id for r in reps]:
        raise StageError(f"embeddings for revision {revision!r} do not match its representations: re-materialize embeddings")
    count = len(rows)

    def write(tmp: Path) -> None:
        if (built := build_vector_index(tmp / "index", rows, vectors, spec.vector_index.metric)) != count:
            raise StageError(f"vector index holds {built} rows, expected {count}")

    version = content_id("vector-index", 1, {"embeddings": emb_record.data_version, "spec": spec.own_spec_ids["vector_index"]})
    out = _finish(ws, revision, "vector_index", spec, version, write, {"enabled": True, "rows": count})
    return StageResult(out, {"rows": count, "metric": spec.vector_index.metric, "seconds": round(time.perf_counter() - t0, 3)})


def run_index_bundle(ws: Workspace, revision: str, spec: PipelineSpec, on_step: StepHook | None = None) -> StageResult:
    t0 = time.perf_counter()
    snap = read_stage_record(ws, revision, "source_snapshot", spec)
    chunks = read_stage_record(ws, revision, "chunks", spec)
    reps = read_stage_record(ws, revision, "representations", spec)
    emb = read_stage_record(ws, revision, "embeddings", spec)
    lex = read_stage_record(ws, revision, "lexical_index", spec)
    vec = read_stage_record(ws, revision, "vector_index", spec)
    vector = spec.vector_index.enabled
    n_reps = int(reps.facts["representations"])
    semantic = bundle_semantic(
        spec,
        corpus_digest=snap.data_version,
        default_scope=str(snap.facts["default_scope"]),
        chunk_set_digest=chunks.data_version,
        representation_set_digest=reps.data_version,
        embeddings_digest=emb.data_version if vector else None,
        counts=BundleCounts(
            documents=int(snap.facts["documents"]),
            chunks=int(chunks.facts["chunks"]),
            representations=n_reps,
            lexical_documents=int(lex.facts["documents"]),
            vectors=int(vec.facts["rows"]) if vector else 0,
        ),
    )
    inputs = BundleInputs(
        documents_parquet=ws.stage_dir(revision, "source_snapshot") / "documents.parquet",
        chunks_parquet=ws.stage_dir(revision, "chunks") / "chunks.parquet",
        representations_parquet=ws.stage_dir(revision, "representations") / "representations.parquet",
        lexical_dir=ws.stage_dir(revision, "lexical_index") / "index",
        vector_dir=ws.stage_dir(revision, "vector_index") / "index" if vector else None,
    )
    bundle, outcome = publish_bundle(semantic, inputs, ws.bundles, on_step)
    m = bundle.manifest
    out = _finish(
        ws, revision, "index_bundle", spec, m.bundle_id, lambda tmp: None,
        {"bundle_id": m.bundle_id, "bundle_path": str(bundle.path), "outcome": outcome.value},
    )
    counts = m.semantic.counts
    return StageResult(
        out,
        {
            "bundle_id": m.bundle_id,
            "bundle_path": str(bundle.path),
            "publication": outcome.value,
            "files": len(m.files),
            "bundle_bytes": sum(f.size for f in m.files),
            "documents": counts.documents,
            "chunks": counts.chunks,
            "representations": counts.representations,
            "vectors": counts.vectors,
            "seconds": round(time.perf_counter() - t0, 3),
        },
        {"specs": _table(["stage", "spec ID"], [[k, v.spec_id] for k, v in m.semantic.specs.items()])},
    )


def check_bundle(ws: Workspace, revision: str) -> tuple[str, list[str]]:
    """Verify the revision's published bundle: (bundle path, problems)."""
    record = read_stage_record(ws, revision, "index_bundle")
    path = str(record.facts["bundle_path"])
    try:
        open_bundle(Path(path))
    except BundleVerificationError as exc:
        return path, exc.problems
    return path, []
