"""Persistent embedding cache keyed by ``(embedder spec ID, text digest)``.

One folder per embedder spec ID holds immutable Parquet shards; each run that encodes something
adds one shard, published atomically, so concurrent runs never write the same file and a killed
run leaves at most an ignored temp file. Lookups read every shard of the spec.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.kernel.ids import SpecId
from ragpipe.kernel.publish import fsync_path


class EmbeddingCache:
    def __init__(self, root: Path, embedder_spec_id: SpecId, dimensions: int):
        self.directory = root / embedder_spec_id.hex
        self.dimensions = dimensions

    def _schema(self) -> pa.Schema:
        return pa.schema([("text_digest", pa.string()), ("vector", pa.list_(pa.float32(), self.dimensions))])

    def lookup(self, digests: set[str]) -> dict[str, np.ndarray]:
        """Vectors for the digests that are cached (missing digests are simply absent)."""
        found: dict[str, np.ndarray] = {}
        if not self.directory.is_dir() or not digests:
            return found
        for shard in sorted(self.directory.glob("shard-*.parquet")):
            table = pq.read_table(shard, schema=self._schema())
            keys = table.column("text_digest").to_pylist()
            wanted = [i for i, k in enumerate(keys) if k in digests and k not in found]
            if not wanted:
                continue
            flat = table.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            matrix = flat.reshape(len(keys), self.dimensions)
            for i in wanted:
                found[keys[i]] = matrix[i]
        return found

    def add(self, digests: list[str], vectors: np.ndarray) -> Path | None:
        """Publish one new shard with these entries; returns its path (None if nothing to add)."""
        if not digests:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
        table = pa.table(
            {"text_digest": pa.array(digests), "vector": pa.FixedSizeListArray.from_arrays(flat, self.dimensions)},
            schema=self._schema(),
        )
        name = f"shard-{os.getpid()}-{secrets.token_hex(8)}.parquet"
        tmp = self.directory / f".tmp-{name}-{os.getpid()}-x"
        pq.write_table(table, tmp)
        fsync_path(tmp)
        final = self.directory / name
        os.rename(tmp, final)
        fsync_path(self.directory)
        return final
