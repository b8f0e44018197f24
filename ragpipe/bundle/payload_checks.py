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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ragpipe.bundle.manifest import BundleManifest
from ragpipe.bundle.set_digests import CorpusDigest, SortedSetDigest
from ragpipe.bundle.tables import (
    CHUNKS,
    DOCUMENTS,
    REPRESENTATIONS,
    RowStream,
    VerifiedTables,
    release_free_memory,
)
from ragpipe.chunking.chunkers import Chunker, chunk_documents, make_chunker
from ragpipe.chunking.models import (
    Chunk,
    chunk_digest_row,
    chunks_from_arrow,
)
from ragpipe.corpus.models import NORMALIZATION, Document, corpus_digest_of_rows, corpus_digest_row
from ragpipe.corpus.snapshot import documents_from_arrow
from ragpipe.embedding.compute import embeddings_digest
from ragpipe.index.rows import INDEX_FIELDS, IndexColumns, RowScopes
from ragpipe.index.vector_file import VECTORS_FILE
from ragpipe.kernel.ids import SpecId, bytes_digest
from ragpipe.representations.derive import (
    Representation,
    derive_representations,
    representation_digest_row,
    representations_from_arrow,
)
from ragpipe.representations.generations import GENERATIONS_FILE, GenerationRecord, verify_generations
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


CHUNKS_WHAT = "re-chunking the documents under the manifest's chunker spec"
REPRESENTATIONS_WHAT = (
    "re-deriving them from the chunks (and the verified generations) under the manifest's representation spec"
)


def _difference(label: str, got, want, key: Callable[[object], str], what: str) -> str:
    """The message naming a stored item that differs from its recomputation, and the fields."""
    fields = [f for f in type(want).model_fields if getattr(got, f) != getattr(want, f)]
    return f"{label}: {key(got)}: {', '.join(fields)} differ from {what}"


@dataclass
class _Compared:
    """One table compared, a record batch at a time, with its recomputation: the rows stored and
    recomputed so far, the first pair that differs (its message), and the set digest of every
    stored item (``set_digests.SortedSetDigest``: its rows' bytes, not the rows)."""

    label: str
    what: str
    key: Callable[[object], str]
    digest_row: Callable[[object], list]
    digest: SortedSetDigest
    stored: int = 0
    expected: int = 0
    first: str | None = None

    def compare(self, got: list, want: list) -> None:
        self.stored += len(got)
        self.expected += len(want)
        for item in got:
            self.digest.add(self.digest_row(item))
        if self.first is None:
            self.first = next(
                (_difference(self.label, g, w, self.key, self.what) for g, w in zip(got, want) if g != w), None
            )

    def drain(self, stream: RowStream) -> None:
        """The stored items no recomputation asked for: counted and digested."""
        for got in stream.rest():
            self.stored += len(got)
            for item in got:
                self.digest.add(self.digest_row(item))

    def problems(self) -> list[str]:
        if self.stored != self.expected:
            return [f"{self.label}: holds {self.stored} rows, {self.what} gives {self.expected}"]
        return [] if self.first is None else [self.first]


class _Expected:
    """The index rows the verified representations give, collected a batch at a time as columns."""

    def __init__(self) -> None:
        self.columns: dict[str, list[pa.Array]] = {name: [] for name in INDEX_FIELDS}
        self.groups: dict[tuple[str, ...], int] = {}
        self.index: list[np.ndarray] = []

    def add(self, reps: list[Representation], documents: dict[str, Document]) -> None:
        docs = [documents[r.document_id] for r in reps]
        for name in ("representation_id", "chunk_id", "document_id", "kind"):
            self.columns[name].append(pa.array([str(getattr(r, name)) for r in reps], type=pa.string()))
        self.columns["source_role"].append(pa.array([d.source_role for d in docs], type=pa.string()))
        groups = self.groups
        self.index.append(
            np.fromiter((groups.setdefault(d.access_scopes, len(groups)) for d in docs), np.int32, count=len(docs))
        )

    def done(self) -> IndexColumns:
        columns = {
            name: pa.concat_arrays(parts) if parts else pa.array([], type=pa.string())
            for name, parts in self.columns.items()
        }
        index = np.concatenate(self.index) if self.index else np.empty(0, dtype=np.int32)
        return IndexColumns(**columns, scopes=RowScopes(list(self.groups), index))


@dataclass
class _Walk:
    """What one walk over the tables found (``_walk``)."""

    document_problems: list[str]
    chunks: _Compared
    representations: _Compared | None
    rows: IndexColumns | None


def _walk(
    tables: VerifiedTables,
    manifest: BundleManifest,
    chunker: Chunker | None,
    derive: Callable[[list[Document], list[Chunk]], list[Representation]] | None,
) -> _Walk:
    """Documents, chunks and representations side by side, a record batch of documents at a time
    (the chunks and representations of those documents alongside), so that no table is ever
    parsed whole: every document's content digest, their order and the corpus digest; with
    ``chunker``, the stored chunks against the documents re-chunked, and the chunk-set digest;
    with ``derive`` too, the stored representations against those derived from the re-chunked
    documents' chunks (equal to the stored ones whenever the chunk check passes: only then is
    the representation check reported), the representation-set digest, and the index rows the
    derived representations give."""
    digest_problems: list[str] = []
    ordered, previous = True, None
    sem = manifest.semantic
    corpus = CorpusDigest(NORMALIZATION, sem.default_scope)  # valid while the IDs increase
    chunks = _Compared(
        "chunks.parquet",
        CHUNKS_WHAT,
        lambda c: f"chunk {c.chunk_id}",
        chunk_digest_row,
        SortedSetDigest("chunk-set", 1),
    )
    reps = _Compared(
        "representations.parquet",
        REPRESENTATIONS_WHAT,
        lambda r: f"representation {r.representation_id}",
        representation_digest_row,
        SortedSetDigest("representation-set", 1),
    )
    stored_chunks = RowStream(tables.batches(CHUNKS), chunks_from_arrow)
    stored_reps = RowStream(tables.batches(REPRESENTATIONS), representations_from_arrow)
    expected = _Expected()
    for batch in tables.batches(DOCUMENTS):
        documents = documents_from_arrow(batch)
        for d in documents:
            if bytes_digest(d.text.encode("utf-8")) != d.content_digest:
                digest_problems.append(
                    f"documents.parquet: document {d.document_id!r}: content_digest does not match its text"
                )
            if previous is not None and d.document_id <= previous:
                ordered = False
            previous = d.document_id
            if ordered:
                corpus.add(corpus_digest_row(d))
        if chunker is None:
            continue
        want_chunks = chunk_documents(documents, chunker)
        chunks.compare(stored_chunks.take(len(want_chunks)), want_chunks)
        if derive is None:
            continue
        want_reps = derive(documents, want_chunks)
        reps.compare(stored_reps.take(len(want_reps)), want_reps)
        expected.add(want_reps, {d.document_id: d for d in documents})
    document_problems = digest_problems
    if ordered:
        actual = corpus.digest()
    else:  # the definition's sort, over every document (only a table that is refused anyway)
        document_problems.append("documents.parquet: document IDs are not unique and sorted")
        actual = corpus_digest_of_rows(
            [corpus_digest_row(d) for batch in tables.batches(DOCUMENTS) for d in documents_from_arrow(batch)],
            sem.default_scope,
        )
    if actual != sem.corpus_digest:
        document_problems.append(
            f"documents.parquet: corpus digest {actual} differs from the manifest's {sem.corpus_digest} "
            "(a document's text, title, access_scopes or source_role changed)"
        )
    if chunker is not None:
        chunks.drain(stored_chunks)
    if derive is not None:
        reps.drain(stored_reps)
    return _Walk(document_problems, chunks, reps if derive is not None else None, expected.done() if derive else None)


def _chunk_problems(walk: _Walk, manifest: BundleManifest) -> list[str]:
    problems = walk.chunks.problems()
    if walk.chunks.digest.digest() != manifest.semantic.chunk_set_digest:
        problems.append("chunks.parquet: chunk-set digest differs from the manifest")
    return problems


def _representation_problems(walk: _Walk, manifest: BundleManifest) -> list[str]:
    assert walk.representations is not None
    problems = walk.representations.problems()
    if walk.representations.digest.digest() != manifest.semantic.representation_set_digest:
        problems.append("representations.parquet: representation-set digest differs from the manifest")
    return problems


def _generated_texts(
    tables: VerifiedTables,
    manifest: BundleManifest,
    spec: RepresentationSpec,
    generations: list[GenerationRecord] | None,
) -> tuple[dict[tuple[str, str], str], list[str]]:
    """The generated representations' texts by (chunk, kind), from their verified evidence
    (``generations.parquet``; ``ragpipe.representations.generations``) — never re-generated — or the
    problems that stop the representation check. Parses the documents and chunks whole (a bundle
    with generated kinds is one whose every chunk went through a model)."""
    if spec.generated_kinds:
        if generations is None:
            return {}, [f"{GENERATIONS_FILE}: missing: the spec has generated kinds {list(spec.generated_kinds)}"]
        record = manifest.semantic.specs["representations"]
        texts, problems = verify_generations(tables.documents, tables.chunks, spec, record.spec_id, generations)
        return texts, problems[:MAX_PROBLEMS]
    if generations is not None:
        return {}, [f"{GENERATIONS_FILE}: present in a bundle whose spec has no generated kind"]
    return {}, []


def check_index_columns(label: str, stored: pa.Table, expected: IndexColumns) -> list[str]:
    """Row ``i`` of an index (``stored``: its rows as columns, sorted by ``row``) must carry exactly
    the IDs and authorization fields of representation ``i`` and its document: a forged scope in
    an index would otherwise disclose a document. Compared column by column; only when something
    differs are the rows read one by one, to name the first (at most ``MAX_PROBLEMS``) problems."""
    n = len(expected)
    positions = stored.column("row").to_numpy()
    if len(positions) != n or not np.array_equal(positions, np.arange(n)):
        return [f"{label}: rows are not exactly 0..{n - 1} once each ({stored.num_rows} stored)"]
    if all(_same(stored.column(name), expected.column(name)) for name in INDEX_FIELDS) and _same_scopes(
        stored.column("access_scopes"), expected.scopes
    ):
        return []
    problems: list[str] = []
    step = 65_536
    for start in range(0, n, step):
        rows = stored.slice(start, step).to_pylist()
        for row, want in zip(rows, expected.rows(start, min(n, start + step))):
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


def _same(stored: pa.ChunkedArray | pa.Array, expected: pa.Array) -> bool:
    stored = stored.combine_chunks() if isinstance(stored, pa.ChunkedArray) else stored
    return stored.type == expected.type and stored.equals(expected)


def _same_scopes(stored: pa.ChunkedArray, expected: RowScopes) -> bool:
    """Every row's stored scope list equals its document's scopes, in order."""
    lists = stored.combine_chunks()
    if stored.null_count or lists.values.null_count:
        return False
    groups = pa.array([list(g) for g in expected.groups], type=pa.list_(pa.string()))
    want = groups.take(pa.array(expected.index)) if len(expected) else pa.array([], type=pa.list_(pa.string()))
    return pc.list_value_length(lists).equals(pc.list_value_length(want)) and lists.flatten().cast(pa.string()).equals(
        want.flatten()
    )


def check_vectors(ids: list[str], vectors: np.ndarray, manifest: BundleManifest) -> list[str]:
    spec = EmbedderSpec.model_validate(manifest.semantic.specs["embeddings"].spec)
    if vectors.ndim != 2 or vectors.shape[1] != spec.dimensions:
        return [f"vector: vectors have shape {vectors.shape}, the embedder spec declares {spec.dimensions} dimensions"]
    per_block = max(1, (1 << 22) // max(1, vectors.shape[1]))  # a block's finiteness mask stays small
    for start in range(0, len(vectors), per_block):
        finite = np.isfinite(vectors[start : start + per_block]).all(axis=1)
        if not finite.all():
            row = start + int(np.argmin(finite))
            return [f"vector: row {row} (representation {ids[row]}): vector is not finite"]
    actual = embeddings_digest(ids, vectors)
    if actual != manifest.material.embeddings_digest:
        return [
            f"vector: embeddings digest {actual} of the stored vectors differs from the manifest's {manifest.material.embeddings_digest}"
        ]
    return []


def check_vectors_file(tables: VerifiedTables, expected: IndexColumns, manifest: BundleManifest) -> list[str]:
    """``vectors.arrow`` holds representation ``i``'s vector at row ``i`` and, all together, exactly
    the vectors whose digest the manifest binds (the lance table's, checked in
    ``check_vector_table``). Read as ``tables.vector_arrays`` reads it for serving: views of the
    verified bytes, bounded by the manifest's shape."""
    try:
        arrays = tables.vector_arrays
    except ValueError as exc:
        return [str(exc)]
    assert arrays is not None
    ids, matrix = arrays
    wanted = expected.representation_id
    if not ids.equals(wanted):
        if len(ids) != len(wanted):
            return [f"{VECTORS_FILE}: holds {len(ids)} rows for {len(wanted)} representations"]
        row = int(np.argmax(pc.not_equal(ids, wanted).to_numpy(zero_copy_only=False)))
        return [f"{VECTORS_FILE}: row {row} holds representation {ids[row].as_py()!r}, not {wanted[row].as_py()!r}"]
    return [p.replace("vector:", f"{VECTORS_FILE}:", 1) for p in check_vectors(ids.to_pylist(), matrix, manifest)]


def check_vector_table(
    root: Path, manifest: BundleManifest, expected: IndexColumns, verified_vectors: np.ndarray | None = None
) -> list[str]:
    """The lance table: rows, IDs and authorization fields as the representations say, the vectors
    the manifest's digest binds, and every scope's search path (``ragpipe.index.vector_checks``).
    Imports lancedb.

    ``verified_vectors``: the matrix of a ``vectors.arrow`` whose IDs and embeddings digest were
    checked (``check_vectors_file``). The lance vectors are then compared with it, bit for bit, a
    window of rows at a time: equal IDs (checked above) and equal vectors have the digest already
    checked, so the table's vectors are never held whole. Any difference (or no such matrix)
    recomputes the digest from the table, which names the problem."""
    from ragpipe.index.vector import read_vector_rows, vectors_equal
    from ragpipe.index.vector_checks import search_path_problems

    problems = check_index_columns("vector", read_vector_rows(root / "vector", ["row", *ROW_FIELDS]), expected)
    if not problems and (verified_vectors is None or not vectors_equal(root / "vector", verified_vectors)):
        problems += check_vectors(*stored_vectors(root / "vector"), manifest)
    release_free_memory()  # lance's reads of the vectors
    if not problems:
        spec = VectorIndexSpec.model_validate(manifest.semantic.specs["vector_index"].spec, context=RECORDED)
        problems += search_path_problems(root / "vector", spec.metric, expected.scopes, spec.ann)
    return problems


def check_payload(root: Path, manifest: BundleManifest, tables: VerifiedTables, vector_table: bool = True) -> list[str]:
    """Every recomputation and cross-check above, in dependency order; stops at the first layer
    that fails (later layers would only repeat its problem). The tables (and ``vectors.arrow``,
    if the bundle has one) come from the bytes that were digested (``tables``), read a record
    batch at a time (``_walk``); the indexes are read from ``root``. ``vector_table=False``
    leaves the lance table to ``check_vector_table`` (run when lancedb is to serve) — allowed
    only when the bundle has ``vectors.arrow``."""
    from ragpipe.index.lexical import read_lexical_table, verify_scope_groups  # heavy backends last
    from ragpipe.index.lexical_checks import structure_problems

    sem = manifest.semantic
    generations = tables.generations  # parsed first: a record that is not one refuses the bundle
    problems = check_specs(manifest)
    counts = sem.counts
    for label, name, expected in (
        ("documents.parquet: document count", DOCUMENTS, counts.documents),
        ("chunks.parquet: chunk count", CHUNKS, counts.chunks),
        ("representations.parquet: representation count", REPRESENTATIONS, counts.representations),
    ):
        if (actual := tables.num_rows(name)) != expected:
            problems.append(f"{label} {actual} differs from manifest count {expected}")
        else:
            tables.check_columns(name)  # every column, read alone, has exactly those rows
    if problems:  # the specs are not to be trusted: the documents alone, as far as they go
        return problems + _walk(tables, manifest, None, None).document_problems
    chunk_record, rep_record = sem.specs["chunks"], sem.specs["representations"]
    chunker = make_chunker(ChunkerSpec.model_validate(chunk_record.spec), SpecId(chunk_record.spec_id))
    rep_spec = RepresentationSpec.model_validate(rep_record.spec, context=RECORDED)

    def derive(texts: dict[tuple[str, str], str]) -> Callable[[list[Document], list[Chunk]], list[Representation]]:
        return lambda documents, chunks: derive_representations(
            documents, chunks, rep_spec.kinds, SpecId(rep_record.spec_id), texts
        )

    generated = bool(rep_spec.generated_kinds) or generations is not None
    # a bundle without generated kinds: one walk; with them, the generations are verified between
    # the chunk check and a second walk that derives the representations
    walk = _walk(tables, manifest, chunker, None if generated else derive({}))
    problems = walk.document_problems
    if problems:
        return problems
    problems = _chunk_problems(walk, manifest)
    if problems:
        return problems
    if generated:
        texts, problems = _generated_texts(tables, manifest, rep_spec, generations)
        if problems:
            return problems
        walk = _walk(tables, manifest, chunker, derive(texts))
    problems = _representation_problems(walk, manifest)
    if problems:
        return problems
    expected_rows = walk.rows
    assert expected_rows is not None
    del walk
    release_free_memory()  # the walk's objects and digest rows: gone before the indexes are read
    n_reps = len(expected_rows)
    if counts.lexical_documents != n_reps:
        problems.append(
            f"lexical: manifest counts {counts.lexical_documents} lexical documents for {n_reps} representations"
        )
    problems += check_index_columns("lexical", read_lexical_table(root / "lexical"), expected_rows)
    row_scopes = expected_rows.scopes
    problems += verify_scope_groups(root / "lexical", row_scopes)
    if not problems:
        spec = LexicalIndexSpec.model_validate(sem.specs["lexical_index"].spec)
        problems += structure_problems(root / "lexical", spec, row_scopes)
    vectors_file = tables.vectors_file
    if sem.has_vector_index:
        if counts.vectors != n_reps:
            problems.append(f"vector: manifest counts {counts.vectors} vectors for {n_reps} representations")
        if vectors_file is not None and not problems:
            problems += check_vectors_file(tables, expected_rows, manifest)
        if (vector_table or vectors_file is None) and not problems:
            problems += check_vector_table(root, manifest, expected_rows, tables.vectors)
    elif (root / "vector").exists() or vectors_file is not None:
        problems.append("vector: present in a bundle whose manifest declares no vector index")
    elif manifest.material.embeddings_digest is not None:
        problems.append("manifest.json: material.embeddings_digest is set for a bundle without a vector index")
    return problems


def stored_vectors(vector_dir: Path) -> tuple[list[str], np.ndarray]:
    """(representation IDs, float32 matrix) as stored in a lance table folder, in row order (one
    read of the two columns; the matrix is the one copy made of the vectors)."""
    from ragpipe.index.vector import read_vector_rows

    table = read_vector_rows(vector_dir, ["row", "representation_id", "vector"])
    ids = [str(i) for i in table.column("representation_id").to_pylist()]
    column = table.column("vector")
    dimension = column.type.list_size
    matrix = np.empty((table.num_rows, dimension), dtype=np.float32)
    at = 0
    for chunk in column.chunks:  # chunk by chunk into the matrix: no combined copy beside it
        values = chunk.values.slice(chunk.offset * dimension, len(chunk) * dimension)
        matrix[at : at + len(chunk)] = values.to_numpy(zero_copy_only=False).reshape(len(chunk), dimension)
        at += len(chunk)
    return ids, matrix


def stored_embeddings_digest(vector_dir: Path) -> str:
    """Digest of the vectors as stored in a lance table folder (what the material section binds)."""
    return embeddings_digest(*stored_vectors(vector_dir))
