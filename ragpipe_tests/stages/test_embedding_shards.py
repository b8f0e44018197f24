"""Shards of the embedding step (``ragpipe.stages.embedding_shards``): disjoint and complete by
text digest (a law); shards run in two homes that share only the object store fill the cache so
that the ``embeddings`` step, in a third place, encodes nothing and publishes the bundle of a
one-step build (its vectors equal to float32 rounding); a shard run again encodes nothing (resumable per shard). Both backends."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ragpipe.embedding.compute import read_embeddings
from ragpipe.kernel.workspace import Workspace
from ragpipe.representations.derive import read_representations
from ragpipe.stages import steps
from ragpipe.stages.embedding_shards import run_embedding_shard, shard_of
from ragpipe.stages.stage_store import read_output
from ragpipe_tests.stages.test_store_handoff import configured, registered_elsewhere  # noqa: F401 - fixture

DIGESTS = st.lists(st.binary(max_size=40).map(lambda b: "sha256:" + hashlib.sha256(b).hexdigest()), unique=True)


@given(digests=DIGESTS, shards=st.integers(1, 64), factor=st.integers(1, 8))
def test_a_text_s_shard_is_in_range_and_refines_with_the_count(digests: list[str], shards: int, factor: int):
    """Each text in exactly one of ``0 … n-1``; with ``n·k`` shards a text's shard is one of the
    ``k`` that split its shard of ``n`` (the digest decides, not the order or the other texts)."""
    assert all(0 <= shard_of(d, shards) < shards for d in digests)
    assert all(shard_of(d, shards * factor) % shards == shard_of(d, shards) for d in digests)
    assert {shard_of(d, 1) for d in digests} <= {0}


def test_shards_spread_texts_evenly():
    """640 texts in 8 shards: every shard between 50 and 110 (uniform digests give 80 ± 9)."""
    digests = ["sha256:" + hashlib.sha256(str(i).encode()).hexdigest() for i in range(640)]
    sizes = [sum(1 for d in digests if shard_of(d, 8) == i) for i in range(8)]
    assert sum(sizes) == 640 and min(sizes) >= 50 and max(sizes) <= 110, sizes


def test_shards_on_two_homes_meet_in_the_stores_cache(built_workspace, tmp_path: Path, configured):  # noqa: F811
    reference, spec = built_workspace  # one home, no store, one-step embeddings
    a, b, c = registered_elsewhere(tmp_path), Workspace(tmp_path / "b"), Workspace(tmp_path / "c")
    for run in steps.BUILD_STEPS[:3]:  # snapshot, chunks, representations
        run(a, "hb", spec)
    reps = read_representations(read_output(a, "hb", "representations", spec).path / "representations.parquet")
    figures = [run_embedding_shard(home, "hb", spec, i, 3) for i, home in enumerate([a, b, a])]
    assert [f["representations"] for f in figures] == [
        sum(1 for r in reps if shard_of(str(r.digest), 3) == i) for i in range(3)
    ]
    assert sum(f["encoded"] for f in figures) == len({str(r.digest) for r in reps})  # each text once
    assert run_embedding_shard(b, "hb", spec, 0, 3)["encoded"] == 0  # run again: all in the cache
    result = steps.run_embeddings(c, "hb", spec)  # the assembling step, on a machine that encoded nothing
    assert (result.metadata["encoded"], result.metadata["cache_hits"]) == (0, len({str(r.digest) for r in reps}))
    for run in steps.BUILD_STEPS[4:]:
        run(c, "hb", spec)
    bundle = steps.read_stage_record(c, "hb", "index_bundle").data_version
    assert bundle == steps.read_stage_record(reference, "hb", "index_bundle").data_version
    # the same texts' vectors, encoded in other batches: equal to float32 rounding
    (ids, got), (want_ids, want) = (
        read_embeddings(read_output(home, "hb", "embeddings").path / "embeddings.parquet") for home in (c, reference)
    )
    assert ids == want_ids and float(np.max(np.abs(got - want))) < 1e-5
