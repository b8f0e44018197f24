"""A verified bundle's tables and vectors: the exact bytes digested during verification.

``open_bundle`` reads each kept file once, into one buffer of its own, digesting it on the way
(``ragpipe.bundle.verify``); callers read those bytes, never the files again, so what they use
is what was verified, even if someone replaces a file in the store afterwards (docs/trust.md).

Memory is the point of this module's shape. A table is kept as its Parquet bytes (compressed, as
verified) and parsed on each access into what the caller asks for — Arrow columns (``table``,
``batches``) or the row objects (``documents`` …) — so nothing parsed stays alive unless its
caller keeps it: verification streams the tables in record batches, a ``Retriever`` keeps the
Arrow columns it serves from. The vectors are kept once: ``vectors.arrow``'s bytes, of which the
float32 matrix is a zero-copy view (``ragpipe.index.vector_file.read_vectors``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from typing import Generic, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ragpipe.chunking.models import CHUNKS_SCHEMA, Chunk, chunks_from_arrow
from ragpipe.corpus.models import Document
from ragpipe.corpus.snapshot import DOCUMENTS_SCHEMA, documents_from_arrow
from ragpipe.index.vector_file import VECTORS_FILE, read_vectors
from ragpipe.kernel.memory import release_free_memory as release_c_heap
from ragpipe.representations.derive import REPRESENTATIONS_SCHEMA, Representation, representations_from_arrow
from ragpipe.representations.generations import GENERATIONS_FILE, GenerationRecord, read_generations

DOCUMENTS, CHUNKS, REPRESENTATIONS = "documents.parquet", "chunks.parquet", "representations.parquet"
TABLE_FILES = (DOCUMENTS, CHUNKS, REPRESENTATIONS)
SCHEMAS = {DOCUMENTS: DOCUMENTS_SCHEMA, CHUNKS: CHUNKS_SCHEMA, REPRESENTATIONS: REPRESENTATIONS_SCHEMA}
# Rows per record batch when a table is streamed: objects of a few thousand rows at a time.
BATCH_ROWS = 2048

T = TypeVar("T")


def parquet_dataset(data: pa.Buffer, schema: pa.Schema) -> ds.Dataset:
    """The Parquet file in ``data`` read under ``schema``, exactly as ``pq.read_table(…,
    schema=schema)`` reads it (one fragment, that schema), but able to stream record batches."""
    fmt = ds.ParquetFileFormat()
    fragment = fmt.make_fragment(pa.BufferReader(data))
    return ds.FileSystemDataset([fragment], schema=schema, format=fmt, filesystem=fragment.filesystem)


class VerifiedTables:
    """The verified bytes of a bundle's tables (and of ``vectors.arrow``, ``generations.parquet``
    when it has them), each a read-only buffer; see the module docstring. ``vector_shape``: the
    manifest's (rows, dimensions) of the vectors, which bounds what ``vectors.arrow`` may expand to.

    ``rows``: the manifest's row count of each table. Every read — whole or in batches, all
    columns or some — must produce exactly that many rows, or it raises ``ValueError``: Parquet
    readers do not agree on a file whose page headers and footer disagree (a stream of every column
    can stop at one column's short page where a read of other columns goes on), so without this a
    check could verify one set of rows and a server serve another."""

    def __init__(
        self,
        data: Mapping[str, np.ndarray | bytes],
        vector_shape: tuple[int, int] | None = None,
        rows: Mapping[str, int] | None = None,
    ):
        self._data = {name: pa.py_buffer(value) for name, value in data.items()}
        self._vector_shape = vector_shape
        self._rows = dict(rows or {})

    def _count(self, name: str, n: int, done: bool = True) -> None:
        """Refuse a read of ``name`` that produced ``n`` rows (``done``: all of them; else so far)
        where the manifest counts another number."""
        expected = self._rows.get(name)
        if expected is not None and (n > expected or (done and n != expected)):
            raise ValueError(f"{name}: a read produced {n} rows where the manifest counts {expected}")

    def _buffer(self, name: str) -> pa.Buffer:
        return self._data[name]

    def _file(self, name: str) -> pq.ParquetFile | None:
        """Table ``name`` as a Parquet file whose schema is exactly the table's (None otherwise:
        it is then read as a dataset under that schema, as ``pq.read_table(…, schema=)`` reads it).
        A file reads page by page, in far less memory than a dataset scan of the same bytes."""
        file = pq.ParquetFile(pa.BufferReader(self._buffer(name)))
        return file if file.schema_arrow.remove_metadata().equals(SCHEMAS[name]) else None

    def table(self, name: str, columns: Sequence[str] | None = None) -> pa.Table:
        """Table ``name`` (``documents.parquet`` …) as Arrow, only ``columns`` if given."""
        selected = None if columns is None else list(columns)
        file = self._file(name)
        if file is not None:
            table = file.read(columns=selected, use_threads=False)
        else:
            table = parquet_dataset(self._buffer(name), SCHEMAS[name]).to_table(columns=selected)
        self._count(name, table.num_rows)
        return table

    def batches(
        self, name: str, columns: Sequence[str] | None = None, batch_rows: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Table ``name`` as record batches of at most ``batch_rows`` (default ``BATCH_ROWS``)
        rows, in row order."""
        batch_rows = batch_rows or BATCH_ROWS
        selected = None if columns is None else list(columns)
        file = self._file(name)
        if file is not None:
            stream = file.iter_batches(batch_size=batch_rows, columns=selected, use_threads=False)
        else:
            dataset = parquet_dataset(self._buffer(name), SCHEMAS[name])
            stream = dataset.to_batches(columns=selected, batch_size=batch_rows, use_threads=False)
        read = 0
        for batch in stream:
            read += batch.num_rows
            self._count(name, read, done=False)
            yield batch
        self._count(name, read)

    def check_columns(self, name: str) -> None:
        """Read each column of table ``name`` alone, a batch at a time, so that every column is
        proven to hold exactly the manifest's count of rows (``ValueError`` otherwise): a stream of
        every column stops at the shortest column, and a later read of other columns — a server's
        — must not find rows the checks never saw."""
        for column in SCHEMAS[name].names:
            for _ in self.batches(name, [column]):
                pass

    def num_rows(self, name: str) -> int:
        return parquet_dataset(self._buffer(name), SCHEMAS[name]).count_rows()

    @property
    def documents(self) -> list[Document]:
        """Every document, parsed from the verified bytes on each access (nothing is cached)."""
        return documents_from_arrow(self.table(DOCUMENTS))

    @property
    def chunks(self) -> list[Chunk]:
        """Every chunk, parsed on each access."""
        return chunks_from_arrow(self.table(CHUNKS))

    @property
    def representations(self) -> list[Representation]:
        """Every representation, parsed on each access."""
        return representations_from_arrow(self.table(REPRESENTATIONS))

    @property
    def generations(self) -> list[GenerationRecord] | None:
        """The evidence of generated representations (None: the bundle has no generated kinds)."""
        data = self._data.get(GENERATIONS_FILE)
        return None if data is None else read_generations(pa.BufferReader(data))

    @property
    def vectors_file(self) -> pa.Buffer | None:
        """The verified bytes of ``vectors.arrow`` (None: the bundle has none)."""
        return self._data.get(VECTORS_FILE)

    @cached_property
    def vector_arrays(self) -> tuple[pa.Array, np.ndarray] | None:
        """(representation IDs, float32 matrix) of ``vectors.arrow``, both zero-copy views of its
        verified bytes, checked as ``read_vectors`` checks them against the manifest's shape
        (``ValueError`` naming the rule); None: no file. Parsed once."""
        data = self.vectors_file
        return None if data is None else read_vectors(data, self._vector_shape)

    @property
    def vectors(self) -> np.ndarray | None:
        """The float32 matrix of ``vectors.arrow``, row ``i`` for representation ``i`` (None: no
        file): a read-only view of the verified bytes, not a copy."""
        arrays = self.vector_arrays
        return None if arrays is None else arrays[1]


class RowStream(Generic[T]):
    """The rows of a table as objects, in order, parsed one record batch at a time: ``take(n)``
    hands out the next ``n`` (fewer at the end), so two tables that correspond row by row (the
    chunks of the documents …) are walked side by side without either being parsed whole."""

    def __init__(self, batches: Iterator[pa.RecordBatch], convert: Callable[[pa.RecordBatch], list[T]]):
        self._batches = batches
        self._convert = convert
        self._pending: list[T] = []
        self._at = 0
        self.taken = 0

    def take(self, n: int) -> list[T]:
        out: list[T] = []
        while len(out) < n:
            if self._at == len(self._pending):
                batch = next(self._batches, None)
                if batch is None:
                    break
                self._pending, self._at = self._convert(batch), 0
                continue
            step = min(n - len(out), len(self._pending) - self._at)
            out += self._pending[self._at : self._at + step]
            self._at += step
        self.taken += len(out)
        return out

    def rest(self) -> Iterator[list[T]]:
        """What ``take`` has not handed out, a batch at a time."""
        while chunk := self.take(max(1, BATCH_ROWS)):
            yield chunk


class ChunkTable(Mapping[str, Chunk]):
    """A verified bundle's chunks by ID, held as Arrow columns (``CHUNKS_SCHEMA``) with a position
    per ID: a ``Chunk`` is built when one is asked for, so serving a million chunks costs their
    columns (about the Parquet bytes uncompressed) and one dictionary entry each, not a million
    objects. Read-only; any number of threads may read it."""

    def __init__(self, batches: Iterable[pa.RecordBatch]):
        """From the chunk table's record batches (``VerifiedTables.batches``): no moment holds
        the table twice, parsed and combined."""
        kept: list[pa.RecordBatch] = []
        self._at: dict[str, int] = {}  # (verified chunk IDs are distinct: each is one span of one document)
        rows = 0
        for batch in batches:
            self._at.update(zip(batch.column("chunk_id").to_pylist(), range(rows, rows + batch.num_rows)))
            rows += batch.num_rows
            kept.append(batch)
        self._table = pa.Table.from_batches(kept, schema=CHUNKS_SCHEMA)

    def __getitem__(self, chunk_id: str) -> Chunk:
        at = self._at[chunk_id]
        return chunks_from_arrow(self._table.slice(at, 1))[0]

    def __contains__(self, chunk_id: object) -> bool:
        return chunk_id in self._at

    def __iter__(self) -> Iterator[str]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def text(self, chunk_id: str) -> str:
        """The chunk's text (``self[chunk_id].text`` without building the chunk)."""
        return self._table.column("text")[self._at[chunk_id]].as_py()


def release_free_memory() -> None:
    """Return what a phase freed to the operating system: Arrow's memory pool's unused pages and
    the C heap's free pages (``ragpipe.kernel.memory``)."""
    pa.default_memory_pool().release_unused()
    release_c_heap()
