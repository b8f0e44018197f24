"""``vectors.arrow``: the bytes written read back as the same IDs and the same float32 bits; any
other layout is refused with one line naming the file and the rule."""

from __future__ import annotations

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
            "vectors.arrow: null vector components",
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
