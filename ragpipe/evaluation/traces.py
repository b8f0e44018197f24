"""Per-cell traces: one Parquet file per cell in ``<run>/traces/``, its digest in the ledger.

Rows (``HIT_SCHEMA``), one per ranked item, by ``stage``:

* ``channel`` — each channel's collapsed hits before fusion (``channel``, ``rank``,
  ``representation_id``, ``chunk_id``, ``document_id``, ``score``), exactly as the retriever's
  audit trace reports them;
* ``fused`` — the weighted-RRF list (the trace's first ``max(k, 20)`` items), rank 1..n;
* ``final`` — the hits returned for the query (after any reranker), rank 1..k;
* ``collapsed`` — the final ranking collapsed to the case's target level (``target_id``), the
  list the metrics were computed on.

The file's key-value metadata ``ragpipe.cell`` holds the canonical JSON of the cell, its outcome,
metrics and latency, so one file describes its cell on its own. Files are named by the cell's
position in the run's expected cells (``cell-000001.parquet``); a resume finds cells through the
ledger, never through these names. A file is written atomically before its ``CellCompleted``
record, so a crash leaves at worst an unreferenced file that the rerun replaces.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import bytes_digest
from ragpipe.kernel.publish import write_file_atomic

TRACES = "traces"
CELL_METADATA_KEY = b"ragpipe.cell"
HIT_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("repeat", pa.int32()),
        ("arm", pa.string()),
        ("stage", pa.string()),
        ("channel", pa.string()),
        ("rank", pa.int32()),
        ("representation_id", pa.string()),
        ("chunk_id", pa.string()),
        ("document_id", pa.string()),
        ("target_id", pa.string()),
        ("score", pa.float64()),
    ]
)


class TraceError(ValueError):
    """A trace file is missing or differs from the digest its ledger record names."""


def trace_name(position: int) -> str:
    return f"{TRACES}/cell-{position:06d}.parquet"


def _stage(cols: dict[str, list[Any]], stage: str, items: Sequence[Mapping[str, Any]], channel: str | None, ranks: Sequence[int] | None, rep: bool) -> None:
    """Append one stage's rows; column-wise, because this runs for thousands of items per cell
    (a per-row loop cost ~20 ms a cell on SciFact at k = 1000, a tenth of the query itself)."""
    n = len(items)
    cols["stage"] += [stage] * n
    cols["channel"] += [channel] * n
    cols["rank"] += [h["rank"] for h in items] if ranks is None else ranks
    cols["representation_id"] += [h["representation_id"] for h in items] if rep else [None] * n
    cols["chunk_id"] += [h["chunk_id"] for h in items]
    cols["document_id"] += [h["document_id"] for h in items]
    cols["score"] += [h["score"] for h in items]


def hit_table(cell: Mapping[str, Any], trace: Mapping[str, Any], hits: Sequence[Mapping[str, Any]], targets: Sequence[str]) -> pa.Table:
    """The rows of one cell (module docstring) from a query's audit trace, hits and collapsed list."""
    cols: dict[str, list[Any]] = {name: [] for name in HIT_SCHEMA.names}
    for name, items in trace["channels"].items():
        _stage(cols, "channel", items, name, None, rep=True)
    fused = trace["fusion"]["items"]
    _stage(cols, "fused", fused, None, range(1, len(fused) + 1), rep=False)
    _stage(cols, "final", hits, None, None, rep=False)
    ranked = len(cols["stage"])
    m = len(targets)
    for name, values in (("stage", ["collapsed"] * m), ("rank", range(1, m + 1))):
        cols[name] += values
    for name in ("channel", "representation_id", "chunk_id", "document_id", "score"):
        cols[name] += [None] * m
    cols["target_id"] = [None] * ranked + list(targets)
    n = ranked + m
    cols["case_id"], cols["repeat"], cols["arm"] = [cell["case"]] * n, [cell["repeat"]] * n, [cell["arm"]] * n
    return pa.Table.from_arrays([pa.array(cols[f.name], type=f.type) for f in HIT_SCHEMA], schema=HIT_SCHEMA)


def write_trace(run: Path, name: str, table: pa.Table, cell_record: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``table`` (with the cell's metadata) atomically as ``run/name``; returns the
    ``{file, digest, rows, bytes}`` reference the ``CellCompleted`` record carries."""
    table = table.replace_schema_metadata({CELL_METADATA_KEY: canonical_bytes(cell_record)})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    data = buffer.getvalue()
    write_file_atomic(run / name, data)
    return {"file": name, "digest": bytes_digest(data), "rows": table.num_rows, "bytes": len(data)}


def verify_trace(run: Path, ref: Mapping[str, Any], where: str) -> None:
    """Refuse a trace file that is missing or whose bytes differ from ``ref['digest']``."""
    path = run / str(ref["file"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{where}: trace {path} cannot be read: {exc.strerror}") from None
    if bytes_digest(data) != ref["digest"]:
        raise TraceError(f"{where}: trace {path} does not match the digest in the ledger")
