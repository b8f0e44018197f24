"""The index-side stages: tantivy and lancedb indexes over a revision's representations, and the bundle."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.bundle.build import BundleInputs, bundle_semantic, publish_bundle
from ragpipe.bundle.manifest import BundleCounts
from ragpipe.bundle.objects import adopt_stored, open_bundle_here, push_bundle
from ragpipe.bundle.tables import release_free_memory
from ragpipe.bundle.verify import BundleVerificationError
from ragpipe.corpus.snapshot import DOCUMENTS_SCHEMA
from ragpipe.index.lexical import build_lexical_index
from ragpipe.index.rows import SLICE_ROWS, IndexColumns, IndexRow, index_columns
from ragpipe.index.vector import index_vector_table, vector_table, write_vector_table
from ragpipe.kernel.ids import content_id
from ragpipe.kernel.publish import PublishOutcome, StepHook
from ragpipe.kernel.workspace import Workspace
from ragpipe.representations.derive import REPRESENTATIONS_SCHEMA
from ragpipe.representations.generations import GENERATIONS_FILE
from ragpipe.spec import PipelineSpec
from ragpipe.stages.results import StageResult, finish, table
from ragpipe.stages.stage_store import (
    StageError,
    StageOutput,
    holding_workspace_lock,
    publish_stage,
    read_output,
    read_outputs,
    version_dir,
)
from ragpipe.storage.location import store_from_env


def _index_tables(ins: dict[str, StageOutput], text: bool = False) -> tuple[pa.Table, pa.Table]:
    """(documents, representations) as the index rows need them, read from the stage outputs'
    Parquet without any document text; ``text``: with the representations' texts."""
    documents = pq.read_table(
        ins["source_snapshot"].path / "documents.parquet",
        columns=["document_id", "access_scopes", "source_role"],
        schema=DOCUMENTS_SCHEMA,
    )
    reps = pq.read_table(
        ins["representations"].path / "representations.parquet",
        columns=["representation_id", "chunk_id", "document_id", "kind", *(["text"] if text else [])],
        schema=REPRESENTATIONS_SCHEMA,
    )
    return documents, reps


def _index_columns(ins: dict[str, StageOutput]) -> IndexColumns:
    """The index rows as columns, read from the stage outputs' Parquet without any text column."""
    return index_columns(*_index_tables(ins))


def _embeddings(path: Path) -> tuple[pa.Array, np.ndarray]:
    """``embedding.compute.read_embeddings`` as (IDs as an Arrow string array, float32 matrix),
    read a record batch at a time into the matrix: the vectors are held once, not as Parquet's
    decoded table, its combined copy and the matrix."""
    file = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)  # a column chunk is not read whole
    vector_type = file.schema_arrow.field("vector").type
    matrix = np.empty((file.metadata.num_rows, vector_type.list_size), dtype=np.float32)
    ids: list[pa.Array] = []
    at = 0
    for batch in file.iter_batches(batch_size=8192, columns=["representation_id", "vector"], use_threads=False):
        column = batch.column("vector")
        size = column.type.list_size
        values = column.values.slice(column.offset * size, len(column) * size)
        matrix[at : at + len(column)] = values.to_numpy(zero_copy_only=False).reshape(len(column), size)
        ids.append(batch.column("representation_id"))
        at += len(column)
    return (pa.concat_arrays(ids) if ids else pa.array([], type=pa.string())), matrix


def _lexical_rows(ins: dict[str, StageOutput]) -> list[IndexRow]:
    """The index rows with their representations' texts (what tantivy indexes), built from
    columns: no document's text and no Document or Representation object is read."""
    documents, reps = _index_tables(ins, text=True)
    columns = index_columns(documents, reps)
    texts = reps.column("text")
    rows: list[IndexRow] = []
    for start in range(0, len(columns), SLICE_ROWS):
        stop = min(len(columns), start + SLICE_ROWS)
        part = texts.slice(start, stop - start).to_pylist()
        rows += [row.with_text(text) for row, text in zip(columns.rows(start, stop), part, strict=True)]
    return rows


@holding_workspace_lock
def run_lexical_index(
    ws: Workspace, revision: str, spec: PipelineSpec, *, on_step: StepHook | None = None
) -> StageResult:
    t0 = time.perf_counter()
    ins = read_outputs(ws, revision, ["source_snapshot", "representations"], spec)
    n_reps = int(ins["representations"].record.facts["representations"])

    def write(tmp: Path) -> None:
        rows = _lexical_rows(ins)
        (tmp / "index").mkdir()
        built = build_lexical_index(tmp / "index", rows, spec.lexical_index, spec.execution.index_writer_heap_mb)
        if built != len(rows):
            raise StageError(f"lexical index holds {built} documents, expected {len(rows)}")

    # The index files are not byte-reproducible; the data version names what was indexed, how.
    # An already published version is reused without building the index again.
    version = content_id(
        "lexical-index",
        2,
        {k: o.data_version for k, o in ins.items()} | {"spec": spec.own_spec_ids["lexical_index"]},
    )
    out = publish_stage(ws, revision, "lexical_index", spec, version, write, {"documents": n_reps}, ins, on_step)
    return finish(
        out,
        t0,
        version_dir(ws, revision, "lexical_index", out.data_version),
        n_reps,
        {"indexed_representations": n_reps, "tokenizer": spec.lexical_index.tokenizer},
    )


@holding_workspace_lock
def run_vector_index(
    ws: Workspace, revision: str, spec: PipelineSpec, *, on_step: StepHook | None = None
) -> StageResult:
    t0 = time.perf_counter()
    ins = read_outputs(ws, revision, ["source_snapshot", "representations", "embeddings"], spec)
    if not spec.vector_index.enabled:
        out = publish_stage(
            ws,
            revision,
            "vector_index",
            spec,
            content_id("vector-index-disabled", 1, {}),
            lambda tmp: None,
            {"enabled": False},
            ins,
            on_step,
        )
        # A lexical-only pipeline: no vector index, so zero rows.
        return finish(out, t0, version_dir(ws, revision, "vector_index", out.data_version), 0, {"enabled": False})
    n_reps = int(ins["representations"].record.facts["representations"])

    def write(tmp: Path) -> None:
        # Columns only, never a document's or representation's text: the table needs the IDs, the
        # authorization fields and the vectors (a million rows: docs/benchmarks.md).
        columns = _index_columns(ins)
        ids, vectors = _embeddings(ins["embeddings"].path / "embeddings.parquet")
        if not ids.equals(columns.representation_id):
            raise StageError(
                f"embeddings for revision {revision!r} do not match its representations: re-materialize embeddings"
            )
        del ids
        table = vector_table(columns, vectors)
        del vectors  # the table holds them, and lance reads them back from disk to index them
        n_rows = len(columns)
        write_vector_table(tmp / "index", table)
        del table, columns
        release_free_memory()
        try:
            built = index_vector_table(tmp / "index", spec.vector_index.metric, spec.vector_index.ann)
        except ValueError as exc:  # an ANN index lance cannot build over every row: one line, nothing published
            raise StageError(f"revision {revision!r}: {exc}") from None
        if built != n_rows:
            raise StageError(f"vector index holds {built} rows, expected {n_rows}")

    version = content_id(
        "vector-index", 2, {k: o.data_version for k, o in ins.items()} | {"spec": spec.own_spec_ids["vector_index"]}
    )
    out = publish_stage(
        ws, revision, "vector_index", spec, version, write, {"enabled": True, "rows": n_reps}, ins, on_step
    )
    return finish(
        out,
        t0,
        version_dir(ws, revision, "vector_index", out.data_version),
        n_reps,
        {
            "enabled": True,
            "rows": n_reps,
            "metric": spec.vector_index.metric,
            **({"ann": spec.vector_index.ann.kind} if spec.vector_index.ann is not None else {}),
        },
    )


BUNDLE_INPUTS = ["source_snapshot", "chunks", "representations", "embeddings", "lexical_index", "vector_index"]


@holding_workspace_lock
def run_index_bundle(ws: Workspace, revision: str, spec: PipelineSpec, on_step: StepHook | None = None) -> StageResult:
    """Assemble and publish the bundle; ``on_step`` observes the *bundle's* publication steps."""
    t0 = time.perf_counter()
    ins = read_outputs(ws, revision, BUNDLE_INPUTS, spec)
    snap, chunks, reps, emb, lex, vec = (ins[s].record for s in BUNDLE_INPUTS)
    vector = spec.vector_index.enabled
    n_reps = int(reps.facts["representations"])
    semantic = bundle_semantic(
        spec,
        corpus_digest=snap.data_version,
        default_scope=snap.facts["default_scope"],
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
        documents_parquet=ins["source_snapshot"].path / "documents.parquet",
        chunks_parquet=ins["chunks"].path / "chunks.parquet",
        representations_parquet=ins["representations"].path / "representations.parquet",
        lexical_dir=ins["lexical_index"].path / "index",
        vector_dir=ins["vector_index"].path / "index" if vector else None,
        generations_parquet=generations
        if (generations := ins["representations"].path / GENERATIONS_FILE).exists()
        else None,
    )
    bundle, outcome = publish_bundle(semantic, inputs, ws.bundles, on_step)
    store = store_from_env()
    pushed = push_bundle(store, bundle) if store is not None else None  # the store is the record others read
    if store is not None and pushed is PublishOutcome.existing:
        bundle = adopt_stored(store, bundle)
    m = bundle.manifest
    out = publish_stage(
        ws,
        revision,
        "index_bundle",
        spec,
        m.bundle_id,
        lambda tmp: None,
        {"bundle_id": m.bundle_id, "bundle_path": ws.stored(bundle.path), "outcome": outcome.value},
        ins,
    )
    counts = m.semantic.counts
    return finish(
        out,
        t0,
        version_dir(ws, revision, "index_bundle", out.data_version),
        None,
        {
            "bundle_id": m.bundle_id,
            "bundle_path": Path(bundle.path),
            "publication": outcome.value,
            **({"store": store.url, "store_publication": pushed.value} if store and pushed else {}),
            "files": len(m.files),
            "bundle_bytes": sum(f.size for f in m.files),
            "documents": counts.documents,
            "chunks": counts.chunks,
            "representations": counts.representations,
            "vectors": counts.vectors,
        },
        {
            "specs": table(
                [("stage", "string"), ("spec_id", "string")], [[k, str(v.spec_id)] for k, v in m.semantic.specs.items()]
            )
        },
    )


@holding_workspace_lock
def check_bundle(ws: Workspace, revision: str) -> tuple[str, list[str]]:
    """Verify the revision's published bundle: (bundle path, problems)."""
    record = read_output(ws, revision, "index_bundle").record
    path = str(ws.located(str(record.facts["bundle_path"])))
    try:
        open_bundle_here(Path(path))
    except BundleVerificationError as exc:
        return path, exc.problems
    return path, []
