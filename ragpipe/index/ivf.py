"""When a vector table gets an IVF_FLAT index, and how many partitions: the build rule, without
lancedb (``ragpipe.index.vector``); and how lance names the index of each ANN kind."""

from __future__ import annotations

import math

IVF_MIN_ROWS = 1024


def ivf_partitions(rows: int) -> int | None:
    """IVF partition count for a table of ``rows`` (None: too small, plain flat scan)."""
    return max(2, min(256, round(math.sqrt(rows) / 2))) if rows >= IVF_MIN_ROWS else None


# The vector-index spec's ANN kind -> lance's name of that index type (``index_stats(...).index_type``).
ANN_INDEX_TYPES = {"ivf_hnsw_sq": "IVF_HNSW_SQ", "ivf_pq": "IVF_PQ"}
