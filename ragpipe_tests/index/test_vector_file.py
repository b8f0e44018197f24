"""``vectors.arrow``: the bytes written read back as the same IDs and the same float32 bits; any
other layout is refused with one line naming the file and the rule."""

from __future__ import annotations

import re
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.index.vector_file import read_vectors_file, vectors_file_bytes


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 40), dimension=st.integers(1, 48), seed=st.integers(0, 2**32 - 1))
def test_round_trip_is_bitwise(rows: int, dimension: int, seed: int):
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((rows, dimension)).astype(np.float32)
    matrix[rng.random(matrix.shape) < 0.05] = np.float32(-0.0)
    ids = [f"rep-{i:03d}" for i in range(rows)]
    got_ids, got = read_vectors_file(vectors_file_bytes(ids, matrix))
    assert got_ids == ids
    assert got.dtype == np.float32 and got.shape == (rows, dimension) and got.flags.c_contiguous
    assert got.tobytes() == matrix.tobytes()


def test_ids_and_rows_must_agree():
    with pytest.raises(ValueError, match=r"\(2, 4\) vectors for 3 representation IDs"):
        vectors_file_bytes(["a", "b", "c"], np.zeros((2, 4), dtype=np.float32))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _vectors(values, dimension: int, value_type: pa.DataType | None = None) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(values, type=value_type or pa.float32()), dimension)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not arrow at all", "vectors.arrow: not an Arrow IPC file"),
        (
            _ipc(pa.table({"id": ["a"], "vector": _vectors([1.0, 2.0], 2)})),
            "vectors.arrow: columns ['id', 'vector'], expected representation_id and vector",
        ),
        (
            _ipc(pa.table({"representation_id": ["a"], "vector": _vectors([1.0, 2.0], 2, pa.float64())})),
            "vectors.arrow: vector column is fixed_size_list<item: double>[2], expected a fixed-size list of float32",
        ),
        (
            _ipc(pa.table({"representation_id": [1], "vector": _vectors([1.0, 2.0], 2)})),
            "vectors.arrow: representation_id column is not a string column",
        ),
        (
            _ipc(
                pa.table({"representation_id": pa.array([None], type=pa.string()), "vector": _vectors([1.0, 2.0], 2)})
            ),
            "vectors.arrow: null values",
        ),
        (
            _ipc(pa.table({"representation_id": ["a"], "vector": _vectors([1.0, None], 2)})),
            "vectors.arrow: null values",
        ),
    ],
)
def test_other_layouts_are_refused(data: bytes, message: str):
    with pytest.raises(ValueError) as info:
        read_vectors_file(data)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_every_truncation_is_refused():
    data = vectors_file_bytes(["a", "b"], np.arange(32, dtype=np.float32).reshape(2, 16))
    for cut in range(len(data)):
        with pytest.raises(ValueError, match=r"^vectors\.arrow: "):
            read_vectors_file(data[:cut])


GOOD_IDS = ["a", "b"]
GOOD = np.arange(32, dtype=np.float32).reshape(2, 16)


@pytest.mark.parametrize(
    ("slot", "value"), [(s, v) for s in (0, 1, 2) for v in (-5, -1, 0, 1, 2, 3, 2**30) if v != s]
)  # the offsets written are 0, 1, 2
def test_forged_string_offsets_are_refused_before_any_value_is_read(slot: int, value: int):
    """A string offset pointing outside its buffer once crashed the reader (it read out of
    bounds): every buffer is validated in full first, and the bytes must be canonical. Offsets
    that stay valid Arrow are other IDs, read as such (the bundle check compares them)."""
    data = bytearray(vectors_file_bytes(GOOD_IDS, GOOD))
    at = data.find(struct.pack("<3i", 0, 1, 2)) + 4 * slot
    data[at : at + 4] = struct.pack("<i", value)
    try:
        ids, _ = read_vectors_file(bytes(data))
    except ValueError as exc:
        assert re.match(r"vectors\.arrow: (invalid record batch|not in the canonical layout)", str(exc)), exc
    else:
        assert (slot, value) in {(1, 0), (1, 2)} and ids == {0: ["", "ab"], 2: ["ab", ""]}[value]


def _written(batches: list[pa.RecordBatch], **options) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batches[0].schema, options=pa.ipc.IpcWriteOptions(**options)) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _batch(ids, matrix, metadata=None) -> pa.RecordBatch:
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])
    schema = pa.schema([("representation_id", pa.string()), ("vector", vectors.type)], metadata=metadata)
    return pa.RecordBatch.from_arrays([pa.array(ids, type=pa.string()), vectors], schema=schema)


def test_only_the_canonical_bytes_are_accepted():
    assert read_vectors_file(_written([_batch(GOOD_IDS, GOOD)]))[0] == GOOD_IDS  # the canonical bytes
    for data, message in [
        (_written([_batch(GOOD_IDS, GOOD)], compression="zstd"), "not in the canonical layout"),
        (_written([_batch(GOOD_IDS, GOOD, metadata={"x": "y"})]), "not in the canonical layout"),
        (_written([_batch(["a"], GOOD[:1]), _batch(["b"], GOOD[1:])]), "2 record batches, expected one"),
    ]:
        with pytest.raises(ValueError, match=f"^vectors\\.arrow: {message}"):
            read_vectors_file(data)


def test_a_compressed_file_never_expands_past_the_manifests_shape():
    """The manifest's shape bounds the bytes before any batch is read: a small compressed file
    claiming many zero vectors is refused unexpanded."""
    rows = 20_000
    bomb = _written(
        [_batch([f"r{i}" for i in range(rows)], np.zeros((rows, 384), dtype=np.float32))], compression="zstd"
    )
    assert len(bomb) < rows * 384 * 4 // 50
    with pytest.raises(ValueError, match=r"cannot hold 20000 vectors of 384 float32 uncompressed"):
        read_vectors_file(bomb, shape=(rows, 384))
    for shape, message in [
        ((2, 8), "16 dimensions, the manifest's vectors have 8"),
        ((1, 16), "holds 2 rows, the manifest counts 1 vectors"),
    ]:
        with pytest.raises(ValueError, match=message):
            read_vectors_file(vectors_file_bytes(GOOD_IDS, GOOD), shape=shape)
