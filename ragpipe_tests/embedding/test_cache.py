"""The embedding cache verifies what it returns: a damaged, cut, foreign or digest-less shard is
set aside and its entries encoded again, so the vectors equal a cold computation's."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ragpipe.embedding.cache import META_KEY, EmbeddingCache, entry_digest
from ragpipe.embedding.compute import compute_embeddings
from ragpipe.embedding.embedder import SentenceTransformerEmbedder
from ragpipe.kernel.ids import SpecId, content_id
from ragpipe.spec import load_pipeline_spec
from ragpipe_tests.embedding.test_embedding import rep
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import HANDBOOK, write_tree

SPEC = SpecId(content_id("embedder", 1, {"t": 1}))
TEXTS = ["alpha beta", "gamma delta", "epsilon zeta"]


@pytest.fixture(scope="module")
def embedder():
    return SentenceTransformerEmbedder(load_pipeline_spec().embedder, batch_size=16, threads=2)


@pytest.fixture
def cached(tmp_path: Path, embedder):
    """A cache holding one shard of TEXTS, the cold vectors, and the shard's path."""
    reps = [rep(t, i) for i, t in enumerate(TEXTS)]
    cold, _ = compute_embeddings(reps, EmbeddingCache(tmp_path, SPEC, 384), lambda: embedder)
    (shard,) = (tmp_path / SPEC.hex).glob("shard-*.parquet")
    return reps, cold, shard


def recompute(tmp_path: Path, reps, embedder) -> tuple[np.ndarray, int]:
    vectors, stats = compute_embeddings(reps, EmbeddingCache(tmp_path, SPEC, 384), lambda: embedder)
    return vectors, stats.encoded


def refused(shard: Path) -> bool:
    return not shard.exists() and shard.with_name(shard.name + ".refused").exists()


def test_a_good_shard_is_used_without_the_model(tmp_path: Path, cached):
    reps, cold, shard = cached

    def must_not_load():
        raise AssertionError("model loaded although everything is cached")

    vectors, stats = compute_embeddings(reps, EmbeddingCache(tmp_path, SPEC, 384), must_not_load)
    assert stats.encoded == 0 and np.array_equal(vectors, cold) and shard.exists()


def test_a_vector_changed_with_the_file_rewritten_cleanly_is_refused(tmp_path: Path, cached, embedder, caplog):
    reps, cold, shard = cached
    table = pq.read_table(shard)
    matrix = np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    matrix[1, 7] += 0.5  # a valid Parquet file whose second vector is not what was encoded
    forged = table.set_column(1, "vector", pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), 384))
    pq.write_table(forged.replace_schema_metadata(table.schema.metadata), shard)
    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.cache"):
        vectors, encoded = recompute(tmp_path, reps, embedder)
    assert encoded == 3 and np.array_equal(vectors, cold) and refused(shard)
    key = table.column("text_digest")[1].as_py()
    assert f"{shard}: row 1 (text {key}): its vector does not match its entry digest" in caplog.text


@pytest.mark.parametrize("where", [0.1, 0.3, 0.5, 0.7, 0.9, 0.99])
def test_a_flipped_byte_anywhere_is_never_used(tmp_path: Path, cached, embedder, where: float):
    reps, cold, shard = cached
    data = bytearray(shard.read_bytes())
    data[int(len(data) * where)] ^= 0x40
    shard.write_bytes(bytes(data))
    vectors, encoded = recompute(tmp_path, reps, embedder)
    assert np.array_equal(vectors, cold)
    # the flipped byte either breaks the file or an entry (refused), or lies in bytes no value uses
    # (Parquet statistics, padding): then the shard still verifies and nothing is encoded
    assert (encoded, refused(shard)) in {(3, True), (0, False)}


def test_a_cut_shard_is_refused(tmp_path: Path, cached, embedder):
    reps, cold, shard = cached
    shard.write_bytes(shard.read_bytes()[: len(shard.read_bytes()) // 2])
    vectors, encoded = recompute(tmp_path, reps, embedder)
    assert encoded == 3 and np.array_equal(vectors, cold) and refused(shard)


def test_a_shard_without_entry_digests_or_of_another_spec_is_refused(tmp_path: Path, cached, embedder):
    reps, cold, shard = cached
    table = pq.read_table(shard)
    old = table.drop_columns(["entry_digest"]).replace_schema_metadata(None)  # the format before digests
    pq.write_table(old, shard)
    assert recompute(tmp_path, reps, embedder)[1] == 3 and refused(shard)
    (fresh,) = (tmp_path / SPEC.hex).glob("shard-*.parquet")
    other = SpecId(content_id("embedder", 1, {"t": 2}))
    (tmp_path / other.hex).mkdir()
    shutil.copyfile(fresh, tmp_path / other.hex / fresh.name)  # another spec's folder, this spec's shard
    _, stats = compute_embeddings(reps, EmbeddingCache(tmp_path, other, 384), lambda: embedder)
    assert stats.encoded == 3
    meta = json.loads(pq.read_schema(fresh).metadata[META_KEY])
    assert meta == {"dimensions": 384, "embedder_spec": SPEC.hex, "format": 2}


def test_entry_digest_binds_key_and_value():
    v = np.arange(4, dtype=np.float32)
    base = entry_digest("a" * 64, "sha256:" + "1" * 64, v)
    assert base != entry_digest("b" * 64, "sha256:" + "1" * 64, v)
    assert base != entry_digest("a" * 64, "sha256:" + "2" * 64, v)
    assert base != entry_digest("a" * 64, "sha256:" + "1" * 64, v + np.float32(1e-7))


def test_a_damaged_shard_never_reaches_a_bundle(tmp_path: Path):
    """Flip bytes in the cache a cold build left, build again in a new home with that cache: the
    bundle's vectors equal the cold build's."""
    corpus = write_tree(tmp_path / "handbook", HANDBOOK)
    ws, _, cold_bundle = build_all_stages(tmp_path / "cold", "hb", corpus, "markdown")
    shutil.copytree(ws.embedding_cache, tmp_path / "warm" / "embedding_cache")
    for shard in (tmp_path / "warm" / "embedding_cache").rglob("shard-*.parquet"):
        table = pq.read_table(shard)
        matrix = np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
        matrix[0] = -matrix[0]
        pq.write_table(
            table.set_column(1, "vector", pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), 384)),
            shard,
        )
    _, _, warm_bundle = build_all_stages(tmp_path / "warm", "hb", corpus, "markdown")
    assert (warm_bundle / "vectors.arrow").read_bytes() == (cold_bundle / "vectors.arrow").read_bytes()
    assert warm_bundle.name == cold_bundle.name
    assert list((tmp_path / "warm" / "embedding_cache").rglob("*.refused"))


def plant(shard: Path, reps) -> np.ndarray:
    """Rewrite ``shard`` with other vectors and every entry digest recomputed (no seal)."""
    table = pq.read_table(shard)
    matrix = -np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    keys = table.column("text_digest").to_pylist()
    planted = pa.table(
        {
            "text_digest": pa.array(keys, pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), 384),
            "entry_digest": pa.array([entry_digest(SPEC.hex, k, v) for k, v in zip(keys, matrix)]),
        },
        schema=table.schema,
    )
    pq.write_table(planted, shard)
    return matrix


def test_with_a_key_only_shards_sealed_with_it_are_used(tmp_path: Path, embedder, caplog):
    """With a key configured every shard is written with its seal: a later process uses it without
    the model; a shard planted with every entry digest recomputed, one whose seal was made with
    another key, and one written before the key was configured are refused and encoded again."""
    from ragpipe.kernel.seals import SealKey

    key, other = SealKey(b"k" * 32), SealKey(b"o" * 32)
    reps = [rep(t, i) for i, t in enumerate(TEXTS)]

    def keyed(k=key) -> EmbeddingCache:
        return EmbeddingCache(tmp_path, SPEC, 384, key=k)

    cold, _ = compute_embeddings(reps, keyed(), lambda: embedder)
    (shard,) = (tmp_path / SPEC.hex).glob("shard-*.parquet")
    assert shard.with_name(shard.name + ".seal").is_file()
    vectors, stats = compute_embeddings(reps, keyed(), lambda: pytest.fail("model loaded"))
    assert stats.encoded == 0 and np.array_equal(vectors, cold)

    plant(shard, reps)  # the seal no longer matches the bytes
    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.cache"):
        vectors, stats = compute_embeddings(reps, keyed(), lambda: embedder)
    assert stats.encoded == 3 and np.array_equal(vectors, cold) and refused(shard)
    assert f"{shard}: a seal not made with key {key.key_id}" in caplog.text

    (fresh,) = (tmp_path / SPEC.hex).glob("shard-*.parquet")  # the shard that encoding wrote
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.cache"):
        vectors, stats = compute_embeddings(reps, keyed(other), lambda: embedder)
    assert stats.encoded == 3 and np.array_equal(vectors, cold) and refused(fresh)
    assert f"{fresh}: a seal not made with key {other.key_id}" in caplog.text

    unkeyed = tmp_path / "unkeyed"
    compute_embeddings(reps, EmbeddingCache(unkeyed, SPEC, 384), lambda: embedder)  # before a key existed
    (old,) = (unkeyed / SPEC.hex).glob("shard-*.parquet")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.cache"):
        _, stats = compute_embeddings(reps, EmbeddingCache(unkeyed, SPEC, 384, key=key), lambda: embedder)
    assert stats.encoded == 3 and refused(old) and f"{old}: no seal with key {key.key_id}" in caplog.text
