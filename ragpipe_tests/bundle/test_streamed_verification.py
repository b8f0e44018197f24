"""Verification reads each kept file once into private, read-only memory and streams the tables
in record batches (``ragpipe.bundle.tables``): what it checked is what is served even if a file
changes afterwards, a changed or truncated file is refused on the next open exactly as before,
and the checks hold across record-batch boundaries."""

from __future__ import annotations

import shutil
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from ragpipe.bundle import tables as tables_module
from ragpipe.bundle import verify
from ragpipe.bundle.verify import BundleVerificationError, open_bundle
from ragpipe.chunking.models import read_chunks, write_chunks
from ragpipe.corpus.snapshot import read_snapshot_documents
from ragpipe.index.vector_file import VECTORS_FILE, read_vectors_file
from ragpipe.kernel.ids import ContentDigest, bytes_digest
from ragpipe.representations.derive import read_representations, write_representations
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.bundle.test_forgery import reseal

STAFF = Subject("s", ("public", "staff"))


@pytest.fixture
def bundle(scoped_bundles, tmp_path: Path, monkeypatch) -> Path:
    full, _ = scoped_bundles
    dst = tmp_path / full.name
    shutil.copytree(full, dst)
    monkeypatch.setattr(verify, "_PAYLOAD_OK", OrderedDict())  # every open below checks in full
    return dst


def _refusal(root: Path) -> str:
    with pytest.raises(BundleVerificationError) as info:
        open_bundle(root, key=None)
    return str(info.value)


def test_what_was_verified_is_served_after_the_files_change(bundle: Path):
    opened = open_bundle(bundle, key=None)
    _, expected = read_vectors_file((bundle / VECTORS_FILE).read_bytes())
    matrix = opened.tables.vectors
    assert matrix is not None and not matrix.flags.writeable  # a view of the verified bytes
    assert np.array_equal(matrix, expected)
    documents = read_snapshot_documents(bundle / "documents.parquet")
    before = Retriever(opened).query("aspirin", STAFF, k=5, mode="hybrid", trace=True)
    # in place (same inode, same size) and truncated: a memory map of these files would now
    # read other bytes, or fault; the verified copy does not
    size = (bundle / VECTORS_FILE).stat().st_size
    with open(bundle / VECTORS_FILE, "r+b") as fh:
        fh.write(b"\x00" * size)
    with open(bundle / "documents.parquet", "r+b") as fh:
        fh.truncate(100)
    assert np.array_equal(opened.tables.vectors, expected)
    assert opened.tables.documents == documents
    after = Retriever(opened).query("aspirin", STAFF, k=5, mode="hybrid", trace=True)
    assert after.hits == before.hits
    message = _refusal(bundle)  # the next open refuses both, as it always did
    assert "vectors.arrow: content digest differs from the manifest" in message
    assert "documents.parquet: size 100 differs from manifest size" in message


def test_a_truncated_or_changed_vectors_file_is_refused(bundle: Path):
    data = (bundle / VECTORS_FILE).read_bytes()
    (bundle / VECTORS_FILE).write_bytes(data[:-8])
    assert f"vectors.arrow: size {len(data) - 8} differs from manifest size {len(data)} (truncated or extended)" in (
        _refusal(bundle)
    )
    changed = bytearray(data)
    changed[-100] ^= 1
    (bundle / VECTORS_FILE).write_bytes(bytes(changed))
    assert "vectors.arrow: content digest differs from the manifest" in _refusal(bundle)
    (bundle / VECTORS_FILE).write_bytes(data + b"\x00")
    assert "vectors.arrow: size" in _refusal(bundle) and "(truncated or extended)" in _refusal(bundle)


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_the_checks_hold_across_record_batches(bundle: Path, monkeypatch, rows: int):
    """With record batches of one to three rows, every table boundary falls inside a document's
    chunks somewhere: the untouched bundle verifies, and a forged last chunk or representation is
    refused with the message a whole-table check gives."""
    monkeypatch.setattr(tables_module, "BATCH_ROWS", rows)
    assert open_bundle(bundle, key=None).bundle_id
    pristine = bundle.parent / "pristine"
    shutil.copytree(bundle, pristine)

    chunks = read_chunks(bundle / "chunks.parquet")
    last = chunks[-1]
    text = last.text[:-1]
    chunks[-1] = last.model_copy(
        update={
            "byte_end": last.byte_end - len(last.text[-1].encode()),
            "text": text,
            "digest": ContentDigest(bytes_digest(text.encode())),
        }
    )
    write_chunks(bundle / "chunks.parquet", chunks)
    reseal(bundle)
    assert f"chunks.parquet: chunk {last.chunk_id}: byte_end, text, digest differ from re-chunking" in _refusal(bundle)

    shutil.rmtree(bundle)
    shutil.copytree(pristine, bundle)
    reps = read_representations(bundle / "representations.parquet")
    target = reps[-1]
    text = target.text + " aspirin"
    reps[-1] = target.model_copy(update={"text": text, "digest": ContentDigest(bytes_digest(text.encode()))})
    write_representations(bundle / "representations.parquet", reps)
    reseal(bundle)
    assert (
        f"representations.parquet: representation {target.representation_id}: text, digest differ from re-deriving"
        in _refusal(bundle)
    )


def test_served_chunks_are_the_verified_chunks(bundle: Path):
    retriever = Retriever(open_bundle(bundle, key=None))
    chunks = read_chunks(bundle / "chunks.parquet")
    assert sorted(retriever.chunks) == sorted(c.chunk_id for c in chunks) and len(retriever.chunks) == len(chunks)
    for chunk in chunks:
        assert retriever.chunks[chunk.chunk_id] == chunk
        assert retriever.chunks.text(chunk.chunk_id) == chunk.text
    assert "sha256:" + "0" * 64 not in retriever.chunks


# --- Parquet files whose page headers and footer disagree ------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            return bytes(out + bytes([low]))
        out.append(low | 0x80)


def _with_trailing_document(root: Path) -> int:
    """A forger's documents.parquet: the real documents and one more row — a copy of the secret
    document made public and retitled — whose text column's data page claims one value fewer than
    it holds and whose footer counts the real documents (the row group still counts them all).
    Streaming every column stops at the text column's short page (the real rows: every digest
    matches); reading other columns does not. Returns the real count."""
    import io
    import struct

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ragpipe.corpus.snapshot import DOCUMENTS_SCHEMA, documents_table

    docs = read_snapshot_documents(root / "documents.parquet")
    m = len(docs)
    secret = next(d for d in docs if d.document_id == "sec-aspirin")
    extra = secret.model_copy(update={"access_scopes": ("public",), "title": "FORGED TITLE"})
    out = io.BytesIO()
    table = documents_table([*docs, extra])
    pq.write_table(table, out, compression="none", use_dictionary=False, write_statistics=False, data_page_size=1 << 26)
    data = bytearray(out.getvalue())
    meta = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata
    offset = meta.row_group(0).column(DOCUMENTS_SCHEMA.names.index("text")).data_page_offset
    # the data page header's num_values (field 1 of DataPageHeader, zigzag i32)
    old, new = b"\x15" + _varint(2 * (m + 1)), b"\x15" + _varint(2 * m)
    at = bytes(data).index(old, offset, offset + 64)
    data[at : at + len(old)] = new
    # FileMetaData.num_rows (field 3, zigzag i64): the site whose change leaves the row group's
    footer_length = struct.unpack("<I", data[-8:-4])[0]
    start = len(data) - 8 - footer_length
    old, new = b"\x16" + _varint(2 * (m + 1)), b"\x16" + _varint(2 * m)
    for at in range(start, len(data) - 8):
        if bytes(data[at : at + len(old)]) == old:
            trial = bytearray(data)
            trial[at : at + len(old)] = new
            footer = pq.ParquetFile(pa.BufferReader(bytes(trial))).metadata
            if (footer.num_rows, footer.row_group(0).num_rows) == (m, m + 1):
                break
    else:
        raise AssertionError("no FileMetaData.num_rows in the footer")
    (root / "documents.parquet").write_bytes(bytes(trial))
    return m


@pytest.mark.parametrize("aligned", [False, True])
def test_a_table_two_readers_read_differently_is_refused(bundle: Path, monkeypatch, aligned: bool):
    """The forged table above, resealed: every digest matches the real documents, and a stream of
    every column reads exactly them — but a read of some columns, as a server's, finds one row more
    (the secret document made public). Every read must produce the manifest's count, so the
    bundle is refused on open, also when the documents fill whole record batches (``aligned``:
    the stream then stops cleanly at a batch boundary, as it would at 2,048 documents)."""
    m = _with_trailing_document(bundle)
    reseal(bundle)
    if aligned:
        monkeypatch.setattr(tables_module, "BATCH_ROWS", m)
    # each column read alone: every column but the forged page's has the extra row
    assert _refusal(bundle).splitlines()[1:] == [
        f"  content check failed: ValueError: documents.parquet: a read produced {m + 1} rows where the manifest "
        f"counts {m}"
    ]


def test_every_read_of_a_verified_table_has_the_manifests_rows():
    """VerifiedTables refuses a read — whole, some columns, or streamed — whose row count is not the
    manifest's, as soon as a stream exceeds it and at its end when it falls short."""
    import io

    import pyarrow.parquet as pq

    from ragpipe.bundle.tables import DOCUMENTS, VerifiedTables
    from ragpipe.corpus.models import Document
    from ragpipe.corpus.snapshot import documents_table

    docs = [
        Document(
            document_id=f"d{i}",
            title="t",
            text="x",
            content_digest=bytes_digest(b"x"),
            access_scopes=("public",),
            source_role="primary",
        )
        for i in range(5)
    ]
    out = io.BytesIO()
    pq.write_table(documents_table(docs), out)
    data = {DOCUMENTS: np.frombuffer(out.getvalue(), dtype=np.uint8)}
    assert VerifiedTables(data, rows={DOCUMENTS: 5}).table(DOCUMENTS, ["document_id"]).num_rows == 5
    for rows in (4, 6):
        tables = VerifiedTables(data, rows={DOCUMENTS: rows})
        message = f"^documents.parquet: a read produced 5 rows where the manifest counts {rows}$"
        with pytest.raises(ValueError, match=message):
            tables.table(DOCUMENTS)
        seen = []
        with pytest.raises(ValueError, match=message):
            for batch in tables.batches(DOCUMENTS, ["document_id"], batch_rows=2):
                seen.append(batch.num_rows)
        # past the count, the batch that passes it is never handed out; short, every batch is
        assert seen == ([2, 2] if rows == 4 else [2, 2, 1])
