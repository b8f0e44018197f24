"""The embedding cache shared through the object store (``ragpipe.embedding.cache``), both
backends: a machine's own shards are read before fetched ones, so a store entry never overrides a
local one; with a key configured only shards sealed with it are fetched, so a store writer without
the key cannot plant vectors that every entry digest vouches for."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from ragpipe.embedding.cache import EmbeddingCache
from ragpipe.kernel.seals import SealKey
from ragpipe.storage.objects import ObjectStore
from ragpipe_tests.embedding.test_cache import SPEC
from ragpipe_tests.support.storage_fixtures import overwrite

KEY, OTHER_KEY = SealKey(b"k" * 32), SealKey(b"o" * 32)
DIGEST = "sha256:" + "ab" * 32
HONEST, PLANTED = np.full((1, 384), 0.5, np.float32), np.full((1, 384), 9.0, np.float32)


def plant(tmp_path: Path, store: ObjectStore, key: SealKey | None) -> None:
    """Another writer of the store shares a shard for DIGEST with its own vector (``key``: sealed
    with that key, None: unsealed); its digests are all consistent."""
    EmbeddingCache(tmp_path / "writer", SPEC, 384, store=store, key=key).add([DIGEST], PLANTED)


def test_a_machine_s_own_entry_wins_over_a_fetched_one(tmp_path: Path, store: ObjectStore):
    mine = EmbeddingCache(tmp_path / "mine", SPEC, 384, store=store)
    mine.add([DIGEST], HONEST)
    plant(tmp_path, store, None)  # sorts before or after: it must not matter
    found = EmbeddingCache(tmp_path / "mine", SPEC, 384, store=store).lookup({DIGEST})
    assert np.array_equal(found[DIGEST], HONEST[0])
    assert len(list((tmp_path / "mine" / SPEC.hex / "fetched").glob("shard-*.parquet"))) == 1


@pytest.mark.parametrize("planted_with", [None, OTHER_KEY])
def test_with_a_key_a_shard_not_sealed_with_it_is_never_fetched(
    tmp_path: Path, store: ObjectStore, planted_with, caplog
):
    plant(tmp_path, store, planted_with)
    reader = EmbeddingCache(tmp_path / "reader", SPEC, 384, store=store, key=KEY)
    with caplog.at_level(logging.WARNING, logger="ragpipe.embedding.cache"):
        assert reader.lookup({DIGEST}) == {}
        assert reader.lookup({DIGEST}) == {}  # asked once: refused names are remembered
    (message,) = [r.getMessage() for r in caplog.records]
    rule = "no seal" if planted_with is None else "a seal not made"
    assert f"{rule} with key {KEY.key_id}; not used, its entries are encoded again" in message
    assert not (tmp_path / "reader" / SPEC.hex / "fetched").exists()


def test_with_a_key_a_shard_sealed_with_it_is_shared(tmp_path: Path, store: ObjectStore):
    plant(tmp_path, store, KEY)
    found = EmbeddingCache(tmp_path / "reader", SPEC, 384, store=store, key=KEY).lookup({DIGEST})
    assert np.array_equal(found[DIGEST], PLANTED[0])


def test_a_seal_is_bound_to_its_shard_s_bytes(tmp_path: Path, store: ObjectStore):
    """A sealed shard's bytes replaced (entry digests recomputed, seal kept) is not fetched."""
    plant(tmp_path, store, KEY)
    (key,) = [k for k in store.list(f"embedding-cache/{SPEC.hex}/") if k.endswith(".parquet")]
    forged = tmp_path / "forger"
    EmbeddingCache(forged, SPEC, 384).add([DIGEST], HONEST)
    (shard,) = (forged / SPEC.hex).glob("shard-*.parquet")
    overwrite(store, key, shard.read_bytes())
    assert EmbeddingCache(tmp_path / "reader", SPEC, 384, store=store, key=KEY).lookup({DIGEST}) == {}
