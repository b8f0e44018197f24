"""``vectors.arrow``: a bundle's vectors as one Arrow IPC file, readable without lancedb.

The lance table stays the store of record; this file holds the same rows' representation IDs and float32 vectors, in row order, so that opening a
bundle for the in-memory engine (``ragpipe.index.vector_memory``) needs pyarrow only — importing
lancedb costs seconds, more than a whole ``ragpipe query`` may take. The bundle manifest lists it
with its size and SHA-256 like every file, and verification recomputes its embeddings digest and
checks it equals ``material.embeddings_digest``, the digest the lance table must also have
(``ragpipe.bundle.payload_checks``): the two stores hold the same vectors, bit for bit.

Schema: ``representation_id: string``, ``vector: fixed_size_list<float32>[dimension]``; one record
batch, uncompressed. Uncompressed, the vectors are stored as the matrix itself: ``read_vectors``
hands out the matrix as a zero-copy view of the file's (verified) bytes, so a reader holds the
vectors once — a million rows of 384 dimensions are 1.5 GB.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

VECTORS_FILE = "vectors.arrow"


def _batch(representation_ids: pa.Array, matrix: np.ndarray) -> pa.RecordBatch:
    """The file's one record batch; ``matrix`` is wrapped, not copied."""
    values = pa.Array.from_buffers(pa.float32(), matrix.size, [None, pa.py_buffer(matrix)])
    return pa.RecordBatch.from_arrays(
        [representation_ids, pa.FixedSizeListArray.from_arrays(values, matrix.shape[1])],
        names=["representation_id", "vector"],
    )


def _checked_matrix(representation_ids, vectors: np.ndarray) -> np.ndarray:
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or len(matrix) != len(representation_ids):
        raise ValueError(f"{matrix.shape} vectors for {len(representation_ids)} representation IDs")
    return matrix


def _write(sink, batch: pa.RecordBatch) -> None:
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)  # exactly one batch, also when there are no rows


def vectors_file_bytes(representation_ids: list[str], vectors: np.ndarray) -> bytes:
    """The file for ``vectors`` (row ``i`` is representation ``representation_ids[i]``)."""
    matrix = _checked_matrix(representation_ids, vectors)
    sink = pa.BufferOutputStream()
    _write(sink, _batch(pa.array(representation_ids, type=pa.string()), matrix))
    return sink.getvalue().to_pybytes()


def write_vectors_file(path: Path, representation_ids: list[str], vectors: np.ndarray) -> None:
    """Write the file for ``vectors`` to ``path`` (the bytes of ``vectors_file_bytes``), streamed:
    the matrix is written from where it is, never copied into one more buffer."""
    matrix = _checked_matrix(representation_ids, vectors)
    with pa.OSFile(str(path), "wb") as sink:
        _write(sink, _batch(pa.array(representation_ids, type=pa.string()), matrix))


class _Digest:
    """A write-only file that keeps only the SHA-256 of what is written to it: the IPC writer
    hands it the record batch's buffers as they are (zero-copy), so rendering a file to compare
    it with another costs no second copy of the vectors."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data)
        self.hash.update(view)
        return view.nbytes

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _canonical_ids(ids: pa.Array) -> pa.Array:
    """``ids`` as ``pa.array`` builds them from their values: offsets from 0, the characters and
    nothing else, no validity bitmap (the caller checked there is no null) — whatever the layout
    they were read in. Built from the buffers read, not from Python strings."""
    if len(ids) == 0:
        return pa.array([], type=pa.string())
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32, count=len(ids) + 1, offset=ids.offset * 4)
    start, end = int(offsets[0]), int(offsets[-1])
    data = ids.buffers()[2]
    return pa.Array.from_buffers(
        pa.string(),
        len(ids),
        [None, pa.py_buffer(offsets - np.int32(start)), data.slice(start, end - start) if data else pa.py_buffer(b"")],
    )


def read_vectors_file(data, shape: tuple[int, int] | None = None) -> tuple[list[str], np.ndarray]:
    """(representation IDs, float32 matrix) from the file's bytes: ``read_vectors`` with the IDs
    as a list."""
    ids, matrix = read_vectors(data, shape)
    return ids.to_pylist(), matrix


def read_vectors(data, shape: tuple[int, int] | None = None, digest: str | None = None) -> tuple[pa.Array, np.ndarray]:
    """(representation IDs as an Arrow string array, float32 matrix) from the file's bytes
    (``bytes`` or any buffer: a ``pa.Buffer``, a read-only numpy array); ``ValueError`` naming the
    file and the rule when they are not exactly what ``vectors_file_bytes`` writes for them.

    Both are zero-copy views of ``data``: the matrix is the file's vector buffer, read-only, so
    the caller holds the vectors once (and must keep ``data`` unchanged while they are used:
    verified bytes that nobody writes). ``digest``: the SHA-256 (hex) of ``data`` when the caller
    has it already (computed otherwise).

    Hostile bytes are refused before anything trusts them: one record batch, the schema above,
    no more than ``shape`` (rows, dimensions) — the manifest's — can hold uncompressed (a small
    compressed file never expands into memory), every buffer and offset validated in full before
    a value is read (a forged string offset would otherwise read outside the buffer), and the
    bytes must be the canonical rendering of what they hold (no compression, metadata or other
    batch layout: one file per content) — checked by rendering the canonical file of the values
    read into a SHA-256, which must be the file's own, so no second copy of the vectors is made."""
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    try:
        reader = pa.ipc.open_file(pa.BufferReader(buffer))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{VECTORS_FILE}: not an Arrow IPC file: {_line(exc)}") from None
    schema = reader.schema
    if schema.names != ["representation_id", "vector"]:
        raise ValueError(f"{VECTORS_FILE}: columns {schema.names}, expected representation_id and vector")
    kind = schema.field("vector").type
    if not pa.types.is_fixed_size_list(kind) or kind.value_type != pa.float32() or kind.list_size < 1:
        raise ValueError(f"{VECTORS_FILE}: vector column is {kind}, expected a fixed-size list of float32")
    if not pa.types.is_string(schema.field("representation_id").type):
        raise ValueError(f"{VECTORS_FILE}: representation_id column is not a string column")
    if reader.num_record_batches != 1:
        raise ValueError(f"{VECTORS_FILE}: {reader.num_record_batches} record batches, expected one")
    if shape is not None:
        rows, dimension = shape
        if kind.list_size != dimension:
            raise ValueError(f"{VECTORS_FILE}: {kind.list_size} dimensions, the manifest's vectors have {dimension}")
        if buffer.size < rows * dimension * 4:
            raise ValueError(
                f"{VECTORS_FILE}: {buffer.size} bytes cannot hold {rows} vectors of {dimension} float32 uncompressed"
            )
    try:
        batch = reader.get_batch(0)
        batch.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise ValueError(f"{VECTORS_FILE}: invalid record batch: {_line(exc)}") from None
    if shape is not None and batch.num_rows != shape[0]:
        raise ValueError(f"{VECTORS_FILE}: holds {batch.num_rows} rows, the manifest counts {shape[0]} vectors")
    if batch.column(0).null_count or batch.column(1).null_count or batch.column(1).values.null_count:
        raise ValueError(f"{VECTORS_FILE}: null values")
    column = batch.column(1)
    flat = column.values.slice(column.offset * kind.list_size, len(column) * kind.list_size)
    # zero-copy when the values are the file's own buffer (an uncompressed file: every canonical
    # one); a compressed file's are decoded, and refused as not canonical below
    matrix = flat.to_numpy(zero_copy_only=False).reshape(len(column), kind.list_size)
    if matrix.dtype != np.float32 or not matrix.flags.c_contiguous:
        matrix = np.ascontiguousarray(matrix, dtype=np.float32)
    matrix.setflags(write=False)
    ids = batch.column(0)
    rendered = _Digest()
    _write(rendered, _batch(_canonical_ids(ids), matrix))
    if rendered.hash.hexdigest() != (digest or hashlib.sha256(memoryview(buffer)).hexdigest()):
        raise ValueError(f"{VECTORS_FILE}: not in the canonical layout (compression, metadata or batch layout differ)")
    return ids, matrix


def _line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
