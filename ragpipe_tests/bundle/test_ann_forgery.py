"""A bundle's ANN index rebuilt with other parameters, every digest recomputed: refused on open.

The forger keeps the rows, the vectors and the semantic section (so the bundle ID, the directory
name and the embeddings digest stay right), rebuilds lance's ANN index with parameters the
bundle's vector-index spec does not declare, and re-lists every file, recomputing the material
digest and the (unkeyed) seal. Only verification's reading of the index itself can tell; it names
the spec's field, the spec's value and the index's in one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lancedb
import pytest
from lancedb.index import HnswSq, IvfPq

from ragpipe.index.vector import ANN_INDEX_NAME, TABLE_NAME
from ragpipe_tests.bundle.test_forgery import manifest_of, refusal, reseal
from ragpipe_tests.support.ann_support import ANN, ann_bundle  # noqa: F401  (fixture)
from ragpipe_tests.support.eval_support import eval_bundle  # noqa: F401  (fixture)

# the spec's: {kind: ivf_hnsw_sq, num_partitions: 2, m: 16, ef_construction: 100}, cosine
SPEC = {k: v for k, v in ANN.items() if k != "kind"}

REBUILDS = {
    "num_partitions": (
        HnswSq(distance_type="cosine", **{**SPEC, "num_partitions": 3}),
        "vector: vector_index.ann.num_partitions is 2 in the spec, 3 in the lance index",
    ),
    "single_partition": (
        HnswSq(distance_type="cosine", **{**SPEC, "num_partitions": 1}),
        "vector: vector_index.ann.num_partitions is 2 in the spec, 1 in the lance index",
    ),
    "m": (
        HnswSq(distance_type="cosine", **{**SPEC, "m": 12}),
        "vector: vector_index.ann.m is 16 in the spec, 12 in the lance index (lance's max_connections)",
    ),
    "ef_construction": (
        HnswSq(distance_type="cosine", **{**SPEC, "ef_construction": 40}),
        "vector: vector_index.ann.ef_construction is 100 in the spec, 40 in the lance index (lance's construction_ef)",
    ),
    "metric": (
        HnswSq(distance_type="l2", **SPEC),
        "vector: vector_index.metric is 'cosine' in the spec, 'l2' in the lance index",
    ),
    "kind": (
        IvfPq(distance_type="cosine", num_partitions=2, num_sub_vectors=48, num_bits=4),
        "vector: vector_index.ann.kind is ivf_hnsw_sq (IVF_HNSW_SQ) in the spec, ivf_pq (IVF_PQ) in the lance index",
    ),
}


@pytest.mark.parametrize("field", sorted(REBUILDS))
def test_an_ann_index_rebuilt_with_other_parameters_and_resealed_is_refused(ann_bundle, tmp_path: Path, field):  # noqa: F811
    source, _ = ann_bundle
    root = tmp_path / source.name
    shutil.copytree(source, root)
    before = manifest_of(root)
    config, message = REBUILDS[field]
    table = lancedb.connect(str(root / "vector")).open_table(TABLE_NAME)
    table.create_index("vector", config=config, name=ANN_INDEX_NAME, replace=True)
    reseal(root)  # every file re-listed, material digest and seal recomputed
    after = manifest_of(root)
    assert after.bundle_id == before.bundle_id and after.material_digest != before.material_digest
    assert after.material.embeddings_digest == before.material.embeddings_digest  # the vectors are untouched
    problem = refusal(root).split("\n  ")[1:]
    assert problem == [message]
