"""Persistent embedding cache keyed by ``(embedder spec ID, text digest)``, verified on every load.

One folder per embedder spec ID holds immutable Parquet shards; each run that encodes something
adds one shard, published atomically, so concurrent runs never write the same file and a killed
run leaves at most an ignored temp file. Lookups read every shard of the spec.

Every entry carries its key and a digest of its value: the row holds ``text_digest``, ``vector``
and ``entry_digest`` = sha256 over (embedder spec ID, text digest, the vector's float32 bytes),
and the shard's schema metadata names the spec ID, the dimensions and the format. A shard is
trusted only if it reads, its metadata is this cache's, and every row's digest recomputes; a
shard that fails any of this — a flipped byte, a cut file, a shard of another spec copied in, one
written before entries carried digests — is reported (a warning naming the file and the rule),
moved aside as ``<name>.refused`` and none of its entries is used: they are encoded again, so a
bad shard never becomes a vector in a bundle.

With an object store (``RAGPIPE_STORE``) the cache is shared by every machine: each new shard is
also put there, create-only, as ``embedding-cache/<embedder spec hex>/<shard name>``, and a lookup
first downloads the store's shards this folder lacks into ``fetched/``. A downloaded shard is
verified like any other (a damaged one is refused and set aside here; the store's copy is never
read again by this folder), and the shards this machine encoded are read before the fetched ones,
so a store entry never overrides a local one. The entry digests are plain hashes: anyone who can
write the store can make a shard that verifies. So with a key configured (``RAGPIPE_BUNDLE_KEY``,
``ragpipe.kernel.seals``) each shard put there has a ``<shard name>.seal`` beside it — an HMAC
over the spec, the name and the shard's SHA-256 — and a shard without a valid seal is not
downloaded (a warning); without a key, a store writer is trusted as a writer of every machine's
cache (docs/trust.md).

The same holds for this machine's own folder: with a key configured every shard is written with
its ``<shard name>.seal`` beside it (a fetched one gets the store's seal, checked), and a lookup
uses only shards whose seal verifies — a shard planted in the home's cache with every entry digest
recomputed, or one written before the key was configured, is refused and set aside like a damaged
one (its entries are encoded again), so the key that seals a bundle also vouches for every vector
in it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.kernel.files import read_regular
from ragpipe.kernel.ids import SpecId
from ragpipe.kernel.publish import fsync_path, write_file_atomic
from ragpipe.kernel.seals import SealKey, mac
from ragpipe.storage.objects import ObjectStore, StorageError

log = logging.getLogger(__name__)
FORMAT = 2
META_KEY = b"ragpipe.embedding_cache"
SHARD_NAME = re.compile(r"shard-[0-9]+-[0-9a-f]{16}\.parquet")
FETCHED = "fetched"  # downloaded shards: read after this machine's own
SEAL_DOMAIN = "embedding-shard"
MAX_SHARD_BYTES = 2**31  # a run's new texts; a bound, so nothing unbounded is read


class ShardRefused(ValueError):
    """A shard that may not be used; ``str(e)`` is the rule it broke."""


def entry_digest(spec_hex: str, text_digest: str, vector: np.ndarray) -> str:
    """The digest one entry carries: its key (spec ID, text digest) and its value's bytes."""
    h = hashlib.sha256()
    h.update(f"{spec_hex}\n{text_digest}\n".encode())
    h.update(np.ascontiguousarray(vector, dtype="<f4").tobytes())
    return "sha256:" + h.hexdigest()


def shard_seal(key: SealKey, spec_hex: str, name: str, data: bytes) -> bytes:
    """The seal object of a shard shared on the store: binds the spec, the name and the bytes."""
    payload = f"{spec_hex}\n{name}\nsha256:{hashlib.sha256(data).hexdigest()}".encode()
    return mac(key, SEAL_DOMAIN, payload).encode()


def _seal_path(shard: Path) -> Path:
    return shard.with_name(shard.name + ".seal")


class EmbeddingCache:
    def __init__(
        self,
        root: Path,
        embedder_spec_id: SpecId,
        dimensions: int,
        store: ObjectStore | None = None,
        key: SealKey | None = None,
    ):
        self.spec_hex = embedder_spec_id.hex
        self.directory = root / embedder_spec_id.hex
        self.dimensions = dimensions
        self.store = store
        self.key = key
        self._read: set[str] = set()  # shards this object has read (or written): lookup_new skips them
        self._unsealed: set[str] = set()  # store shards refused for their seal: not asked again

    @property
    def store_prefix(self) -> str:
        return f"embedding-cache/{self.spec_hex}/"

    def _fetch(self) -> None:
        """Download the store's shards this folder has neither as a shard nor set aside (with a
        key: only those whose seal checks)."""
        if self.store is None:
            return
        try:
            for key in self.store.list(self.store_prefix):
                name = key[len(self.store_prefix) :]
                if not SHARD_NAME.fullmatch(name) or name in self._unsealed:
                    continue
                local = self.directory / FETCHED / name
                if (self.directory / name).exists() or local.exists() or local.with_name(name + ".refused").exists():
                    continue
                held = self.store.get(key)
                if held is not None and self._sealed(key, name, held.data):
                    local.parent.mkdir(parents=True, exist_ok=True)
                    if self.key is not None:  # the seal first: a shard is never found without it
                        seal = shard_seal(self.key, self.spec_hex, name, held.data)
                        write_file_atomic(_seal_path(local), seal, replace=True, sync=False)
                    write_file_atomic(local, held.data, replace=False, sync=False)  # verified on every load
        except StorageError as exc:  # the store is a cache here too: what it cannot give is encoded again
            log.warning("embedding cache: %s: %s; its entries are encoded again", self.store.url, exc)

    def _sealed(self, key: str, name: str, data: bytes) -> bool:
        if self.key is None:
            return True
        held = self.store.get(key + ".seal")
        if held is not None and hmac.compare_digest(held.data, shard_seal(self.key, self.spec_hex, name, data)):
            return True
        self._unsealed.add(name)
        log.warning("embedding cache: %s%s: %s with key %s; not used, its entries are encoded again", self.store.url,
                    key, "no seal" if held is None else "a seal not made", self.key.key_id)  # fmt: skip
        return False

    def _schema(self) -> pa.Schema:
        meta = {"format": FORMAT, "embedder_spec": self.spec_hex, "dimensions": self.dimensions}
        return pa.schema(
            [
                ("text_digest", pa.string()),
                ("vector", pa.list_(pa.float32(), self.dimensions)),
                ("entry_digest", pa.string()),
            ],
            metadata={META_KEY: json.dumps(meta, sort_keys=True).encode()},
        )

    def lookup(self, digests: set[str]) -> dict[str, np.ndarray]:
        """Vectors for the digests that are cached in shards that verify (missing digests are
        simply absent; a refused shard is set aside: module docstring)."""
        return self._lookup(digests, only_new=False)

    def lookup_new(self, digests: set[str]) -> dict[str, np.ndarray]:
        """``lookup`` over the shards this object has not read yet: the cheap re-check a step
        makes under a key's lease (what another run published meanwhile)."""
        return self._lookup(digests, only_new=True)

    def _lookup(self, digests: set[str], only_new: bool) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        if not digests:
            return found
        self._fetch()
        if not self.directory.is_dir():
            return found
        own = sorted(self.directory.glob("shard-*.parquet"))
        for shard in own + sorted((self.directory / FETCHED).glob("shard-*.parquet")):
            if only_new and shard.name in self._read:
                continue
            try:
                keys, matrix = self._read_shard(shard)
            except ShardRefused as exc:
                self._refuse(shard, str(exc))
                continue
            self._read.add(shard.name)
            for i, key in enumerate(keys):
                if key in digests and key not in found:
                    found[key] = matrix[i]
        return found

    def commit(self, entries: list[tuple[str, np.ndarray]]) -> None:
        """The step runner's commit: one shard with these entries."""
        if entries:
            self.add([k for k, _ in entries], np.stack([v for _, v in entries]))

    def _read_shard(self, shard: Path) -> tuple[list[str], np.ndarray]:
        """The shard's keys and vectors, each entry verified (and, with a key, the shard's seal);
        ``ShardRefused`` naming the rule."""
        try:  # never through a link, never waiting on a FIFO
            data = read_regular(shard, MAX_SHARD_BYTES)
        except OSError as exc:
            raise ShardRefused(f"cannot be read: {exc.strerror or exc}") from None
        if self.key is not None:
            try:
                seal = read_regular(_seal_path(shard), 4096)
            except OSError:
                seal = None
            if seal is None or not hmac.compare_digest(seal, shard_seal(self.key, self.spec_hex, shard.name, data)):
                raise ShardRefused(f"{'no seal' if seal is None else 'a seal not made'} with key {self.key.key_id}")
        try:
            table = pq.read_table(pa.BufferReader(data))
        except (OSError, pa.ArrowException) as exc:
            raise ShardRefused(f"cannot be read as Parquet: {exc}") from None
        expected = self._schema()
        if table.schema.metadata is None or table.schema.metadata.get(META_KEY) != expected.metadata[META_KEY]:
            raise ShardRefused(f"not a shard of embedder {self.spec_hex} (format {FORMAT}, {self.dimensions} dims)")
        if not table.schema.remove_metadata().equals(expected.remove_metadata()):
            raise ShardRefused(f"columns {table.schema.names} are not the cache's")
        keys = table.column("text_digest").to_pylist()
        recorded = table.column("entry_digest").to_pylist()
        vectors = table.column("vector").combine_chunks()
        if vectors.null_count or None in keys or None in recorded:
            raise ShardRefused("holds a null entry")
        matrix = vectors.flatten().to_numpy(zero_copy_only=False).reshape(len(keys), self.dimensions)
        for row, (key, digest) in enumerate(zip(keys, recorded, strict=True)):
            if entry_digest(self.spec_hex, key, matrix[row]) != digest:
                raise ShardRefused(f"row {row} (text {key}): its vector does not match its entry digest")
        return keys, matrix

    def _refuse(self, shard: Path, rule: str) -> None:  # the seal stays: it names a shard no longer there
        log.warning("embedding cache: %s: %s; set aside as %s.refused, its entries are encoded again", shard, rule,
                    shard.name)  # fmt: skip
        try:
            os.replace(shard, shard.with_name(shard.name + ".refused"))
        except OSError as exc:  # unmovable (read-only cache): still never used
            log.warning("embedding cache: %s: cannot set it aside: %s", shard, exc.strerror or exc)

    def add(self, digests: list[str], vectors: np.ndarray) -> Path | None:
        """Publish one new shard with these entries; returns its path (None if nothing to add)."""
        if not digests:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        matrix = np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(digests), self.dimensions)
        table = pa.table(
            {
                "text_digest": pa.array(digests, pa.string()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), self.dimensions),
                "entry_digest": pa.array([entry_digest(self.spec_hex, d, v) for d, v in zip(digests, matrix)]),
            },
            schema=self._schema(),
        )
        name = f"shard-{os.getpid()}-{secrets.token_hex(8)}.parquet"
        tmp = self.directory / f".tmp-{name}-{os.getpid()}-x"
        pq.write_table(table, tmp)
        fsync_path(tmp)
        final = self.directory / name
        data = tmp.read_bytes()
        seal = shard_seal(self.key, self.spec_hex, name, data) if self.key is not None else None
        if seal is not None:  # the seal first: a shard is never found without its seal
            write_file_atomic(_seal_path(final), seal, replace=True)
        os.rename(tmp, final)
        self._read.add(name)  # its own entries are in hand: never read back
        fsync_path(self.directory)
        if self.store is not None:  # shared with every machine; the name is unique (pid, random)
            try:
                self.store.put_new(self.store_prefix + name, data)
                if seal is not None:
                    self.store.put_new(self.store_prefix + name + ".seal", seal)
            except StorageError as exc:  # other machines encode these texts again
                log.warning("embedding cache: %s: cannot share %s: %s", self.store.url, name, exc)
        return final
