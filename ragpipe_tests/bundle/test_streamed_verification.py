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
