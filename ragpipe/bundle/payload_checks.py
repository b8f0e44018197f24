"""Recompute a bundle's payload from its documents and cross-check both indexes against it.

The file list and seal only prove that the bytes are those the manifest lists; an unkeyed seal can
be recomputed by anyone who rewrites the files. These checks make the *semantic* claims true
again from content: the corpus digest from ``documents.parquet`` (each document's digest from its
text), the chunks by re-chunking those documents under the manifest's chunker spec, the
representations by re-deriving them, and every lexical and vector row's IDs, ``access_scopes`` and
``source_role`` against its representation's document. The vectors' digest is recomputed from
``vectors.arrow`` and from the lance table (whose check may be deferred to when lancedb serves).
Each problem names the file, the row or ID, and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ragpipe.bundle.manifest import BundleManifest
from ragpipe.chunking.chunkers import chunk_documents, make_chunker
from ragpipe.chunking.models import Chunk, chunk_set_digest
from ragpipe.corpus.models import Document, corpus_digest
from ragpipe.embedding.compute import embeddings_digest
from ragpipe.index.rows import IndexRow, index_rows
from ragpipe.index.vector_file import VECTORS_FILE, read_vectors_file
from ragpipe.kernel.ids import SpecId, bytes_digest
from ragpipe.representations.derive import Representation, derive_representations, representation_set_digest
from ragpipe.representations.evidence import GENERATIONS_FILE, GenerationRecord, verify_generations
from ragpipe.spec import (
    RECORDED,
    SEMANTIC,
    ChunkerSpec,
    EmbedderSpec,
    LexicalIndexSpec,
    RepresentationSpec,
    SnapshotSpec,
    VectorIndexSpec,
    ann_dimension_problem,
    own_spec_id,
)

SPEC_MODELS = {
    "source_snapshot": SnapshotSpec,
    "chunks": ChunkerSpec,
    "representations": RepresentationSpec,
    "embeddings": EmbedderSpec,
    "lexical_index": LexicalIndexSpec,
    "vector_index": VectorIndexSpec,
}
ROW_FIELDS = ("representation_id", "chunk_id", "document_id", "kind", "source_role", "access_scopes")
MAX_PROBLEMS = 20


def check_specs(manifest: BundleManifest) -> list[str]:
    """Every stage spec record's ID recomputes from its spec."""
    problems = []
    for stage, record in manifest.semantic.specs.items():
        model = SPEC_MODELS.get(stage)
        if model is None:
            problems.append(f"manifest.json: specs.{stage}: unknown stage")
            continue
        try:
            parsed = model.model_validate(record.spec, context=RECORDED)
            actual = own_spec_id(stage, parsed)
        except ValueError as exc:
            problems.append(f"manifest.json: specs.{stage}: invalid spec: {exc}")
            continue
        # canonical encoding folds 1200.0 into 1200: only the model's own rendering is accepted, so
        # two different manifests can never share one bundle ID
        if json.dumps(record.spec, sort_keys=True) != json.dumps(
            parsed.model_dump(mode="json", context=SEMANTIC), sort_keys=True
        ):
            problems.append(f"manifest.json: specs.{stage}: spec is not written in its canonical form")
        if actual != record.spec_id:
            problems.append(
                f"manifest.json: specs.{stage}: spec_id {record.spec_id} does not recompute from its spec ({actual})"
            )
    return problems or _ann_problems(manifest)


def _ann_problems(manifest: BundleManifest) -> list[str]:
    """The vector index's ANN index fits the embedder's dimensions (``spec.ann_dimension_problem``)."""
    specs = manifest.semantic.specs
    if "vector_index" not in specs or "embeddings" not in specs:
        return []
    ann = VectorIndexSpec.model_validate(specs["vector_index"].spec, context=RECORDED).ann
    dimensions = EmbedderSpec.model_validate(specs["embeddings"].spec, context=RECORDED).dimensions
    problem = ann_dimension_problem(ann, dimensions)
    return [] if problem is None else [f"manifest.json: specs.vector_index: ann.num_sub_vectors: {problem}"]


def check_documents(documents: list[Document], manifest: BundleManifest) -> list[str]:
    problems = [
        f"documents.parquet: document {d.document_id!r}: content_digest does not match its text"
        for d in documents
        if bytes_digest(d.text.encode("utf-8")) != d.content_digest
    ]
    ids = [d.document_id for d in documents]
    if ids != sorted(set(ids)):
        problems.append("documents.parquet: document IDs are not unique and sorted")
    sem = manifest.semantic
    actual = corpus_digest(documents, sem.default_scope)
    if actual != sem.corpus_digest:
        problems.append(
            f"documents.parquet: corpus digest {actual} differs from the manifest's {sem.corpus_digest} "
            "(a document's text, title, access_scopes or source_role changed)"
        )
    return problems


def _first_difference(
    label: str, stored: Sequence, expected: Sequence, key: Callable[[object], str], what: str
) -> list[str]:
    """One message naming the first stored item that differs from its recomputation, and the field."""
    if len(stored) != len(expected):
        return [f"{label}: holds {len(stored)} rows, {what} gives {len(expected)}"]
    for got, want in zip(stored, expected):
        if got != want:
            fields = [f for f in type(want).model_fields if getattr(got, f) != getattr(want, f)]
            return [f"{label}: {key(got)}: {', '.join(fields)} differ from {what}"]
    return []


def check_chunks(documents: list[Document], chunks: list[Chunk], manifest: BundleManifest) -> list[str]:
    record = manifest.semantic.specs["chunks"]
    expected = chunk_documents(documents, make_chunker(ChunkerSpec.model_validate(record.spec), SpecId(record.spec_id)))
    problems = _first_difference(
        "chunks.parquet",
        chunks,
        expected,
        lambda c: f"chunk {c.chunk_id}",
        "re-chunking the documents under the manifest's chunker spec",
    )
    if chunk_set_digest(chunks) != manifest.semantic.chunk_set_digest:
        problems.append("chunks.parquet: chunk-set digest differs from the manifest")
    return problems


def check_representations(
    documents: list[Document],
    chunks: list[Chunk],
    reps: list[Representation],
    manifest: BundleManifest,
    generations: list[GenerationRecord] | None = None,
) -> list[str]:
    """The representations are those the manifest's spec makes: derived kinds re-derived from the
    chunks, generated kinds taken from their verified evidence (``generations.parquet``;
    ``ragpipe.representations.evidence``) — never re-generated."""
    record = manifest.semantic.specs["representations"]
    spec = RepresentationSpec.model_validate(record.spec, context=RECORDED)
    texts: dict[tuple[str, str], str] = {}
    if spec.generated_kinds:
        if generations is None:
            return [f"{GENERATIONS_FILE}: missing: the spec has generated kinds {list(spec.generated_kinds)}"]
        texts, problems = verify_generations(documents, chunks, spec, record.spec_id, generations)
        if problems:
            return problems[:MAX_PROBLEMS]
    elif generations is not None:
        return [f"{GENERATIONS_FILE}: present in a bundle whose spec has no generated kind"]
    expected = derive_representations(documents, chunks, spec.kinds, SpecId(record.spec_id), texts)
    problems = _first_difference(
        "representations.parquet",
        reps,
        expected,
        lambda r: f"representation {r.representation_id}",
        "re-deriving them from the chunks (and the verified generations) under the manifest's representation spec",
    )
    if representation_set_digest(reps) != manifest.semantic.representation_set_digest:
        problems.append("representations.parquet: representation-set digest differs from the manifest")
    return problems


def check_index_rows(label: str, stored: list[dict[str, object]], expected: list[IndexRow]) -> list[str]:
    """Row ``i`` of an index must carry exactly the IDs and authorization fields of representation
    ``i`` and its document: a forged scope in an index would otherwise disclose a document."""
    problems: list[str] = []
    positions = [row["row"] for row in stored]
    if positions != list(range(len(expected))):
        return [f"{label}: rows are not exactly 0..{len(expected) - 1} once each ({len(stored)} stored)"]
    for row, want in zip(stored, expected):
        for name in ROW_FIELDS:
            got, exp = row[name], getattr(want, name)
            if name == "access_scopes":
                got, exp = tuple(got), tuple(exp)
            if got != exp:
                problems.append(
                    f"{label}: row {row['row']} (representation {want.representation_id}): {name} {got!r} "
                    f"differs from its representation's document ({exp!r})"
                )
                if len(problems) >= MAX_PROBLEMS:
                    return problems
    return problems


def check_vectors(ids: list[str], vectors: np.ndarray, manifest: BundleManifest) -> list[str]:
    spec = EmbedderSpec.model_validate(manifest.semantic.specs["embeddings"].spec)
    if vectors.ndim != 2 or vectors.shape[1] != spec.dimensions:
        return [f"vector: vectors have shape {vectors.shape}, the embedder spec declares {spec.dimensions} dimensions"]
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        return [
            f"vector: row {int(np.argmin(finite))} (representation {ids[int(np.argmin(finite))]}): vector is not finite"
        ]
    actual = embeddings_digest(ids, vectors)
    if actual != manifest.material.embeddings_digest:
        return [
            f"vector: embeddings digest {actual} of the stored vectors differs from the manifest's {manifest.material.embeddings_digest}"
        ]
    return []


def check_vectors_file(data: bytes, expected: list[IndexRow], manifest: BundleManifest) -> list[str]:
    """``vectors.arrow`` holds representation ``i``'s vector at row ``i`` and, all together, exactly
    the vectors whose digest the manifest binds (the lance table's, checked in
    ``check_vector_table``)."""
    dimensions = EmbedderSpec.model_validate(manifest.semantic.specs["embeddings"].spec).dimensions
    try:
        ids, matrix = read_vectors_file(data, shape=(manifest.semantic.counts.vectors, dimensions))
    except ValueError as exc:
        return [str(exc)]
    wanted = [row.representation_id for row in expected]
    if ids != wanted:
        if len(ids) != len(wanted):
            return [f"{VECTORS_FILE}: holds {len(ids)} rows for {len(wanted)} representations"]
        row = next(i for i, (got, want) in enumerate(zip(ids, wanted)) if got != want)
        return [f"{VECTORS_FILE}: row {row} holds representation {ids[row]!r}, not {wanted[row]!r}"]
    return [p.replace("vector:", f"{VECTORS_FILE}:", 1) for p in check_vectors(ids, matrix, manifest)]


def check_vector_table(root: Path, manifest: BundleManifest, expected: list[IndexRow]) -> list[str]:
    """The lance table: rows, IDs and authorization fields as the representations say, the vectors
    the manifest's digest binds, and every scope's search path (``ragpipe.index.vector_checks``).
    Imports lancedb."""
    from ragpipe.index.vector import read_vector_rows
    from ragpipe.index.vector_checks import search_path_problems

    table = read_vector_rows(root / "vector")
    stored = table.drop_columns(["vector"]).to_pylist()
    problems = check_index_rows("vector", stored, expected)
    if not problems:
        problems += check_vectors([str(r["representation_id"]) for r in stored], _matrix(table), manifest)
    if not problems:
        spec = VectorIndexSpec.model_validate(manifest.semantic.specs["vector_index"].spec, context=RECORDED)
        problems += search_path_problems(
            root / "vector", spec.metric, [row.access_scopes for row in expected], spec.ann
        )
    return problems


def check_payload(
    root: Path,
    manifest: BundleManifest,
    documents: list[Document],
    chunks: list[Chunk],
    reps: list[Representation],
    vectors_file: bytes | None = None,
    vector_table: bool = True,
    generations: list[GenerationRecord] | None = None,
) -> list[str]:
    """Every recomputation and cross-check above, in dependency order; stops at the first layer
    that fails (later layers would only repeat its problem). The tables (and ``vectors_file``, the
    bytes of ``vectors.arrow`` if the bundle has one) come parsed from the bytes that were
    digested; the indexes are read from ``root``. ``vector_table=False`` leaves the lance table to
    ``check_vector_table`` (run when lancedb is to serve) — allowed only when ``vectors_file``
    holds the vectors."""
    from ragpipe.index.lexical import read_lexical_rows, verify_scope_groups  # heavy backends last
    from ragpipe.index.lexical_checks import structure_problems

    sem = manifest.semantic
    problems = check_specs(manifest)
    counts = sem.counts
    for label, actual, expected in (
        ("documents.parquet: document count", len(documents), counts.documents),
        ("chunks.parquet: chunk count", len(chunks), counts.chunks),
        ("representations.parquet: representation count", len(reps), counts.representations),
    ):
        if actual != expected:
            problems.append(f"{label} {actual} differs from manifest count {expected}")
    problems += check_documents(documents, manifest)
    if problems:
        return problems
    problems += check_chunks(documents, chunks, manifest) or check_representations(
        documents, chunks, reps, manifest, generations
    )
    if problems:
        return problems
    expected_rows = index_rows(documents, reps)
    if counts.lexical_documents != len(reps):
        problems.append(
            f"lexical: manifest counts {counts.lexical_documents} lexical documents for {len(reps)} representations"
        )
    problems += check_index_rows("lexical", read_lexical_rows(root / "lexical"), expected_rows)
    row_scopes = [row.access_scopes for row in expected_rows]
    problems += verify_scope_groups(root / "lexical", row_scopes)
    if not problems:
        spec = LexicalIndexSpec.model_validate(sem.specs["lexical_index"].spec)
        problems += structure_problems(root / "lexical", spec, row_scopes)
    if sem.has_vector_index:
        if counts.vectors != len(reps):
            problems.append(f"vector: manifest counts {counts.vectors} vectors for {len(reps)} representations")
        if vectors_file is not None and not problems:
            problems += check_vectors_file(vectors_file, expected_rows, manifest)
        if (vector_table or vectors_file is None) and not problems:
            problems += check_vector_table(root, manifest, expected_rows)
    elif (root / "vector").exists() or vectors_file is not None:
        problems.append("vector: present in a bundle whose manifest declares no vector index")
    elif manifest.material.embeddings_digest is not None:
        problems.append("manifest.json: material.embeddings_digest is set for a bundle without a vector index")
    return problems


def _matrix(table) -> np.ndarray:
    column = table.column("vector").combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size)


def stored_vectors(vector_dir: Path) -> tuple[list[str], np.ndarray]:
    """(representation IDs, float32 matrix) as stored in a lance table folder, in row order."""
    from ragpipe.index.vector import read_vector_rows

    table = read_vector_rows(vector_dir)
    return [str(i) for i in table.column("representation_id").to_pylist()], _matrix(table)


def stored_embeddings_digest(vector_dir: Path) -> str:
    """Digest of the vectors as stored in a lance table folder (what the material section binds)."""
    return embeddings_digest(*stored_vectors(vector_dir))
