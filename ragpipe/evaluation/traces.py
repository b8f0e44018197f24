"""Per-cell traces: one Parquet file per cell in ``<run>/traces/``, its digest in the ledger.

Rows (``HIT_SCHEMA``), one per ranked item, by ``stage``:

* ``channel`` — each channel's collapsed hits before fusion (``channel``, ``rank``,
  ``representation_id``, ``chunk_id``, ``document_id``, ``score``): the retriever's rankings
  (``QueryResult.rankings``), which its audit trace reports as ``channels``;
* ``fused`` — the fused list (the trace's first ``max(k, 20)`` items, ``fusion.items``), rank 1..n;
* ``final`` — the hits returned for the query (after any reranker), rank 1..k, with each hit's
  ``access_scopes`` (canonical JSON list);
* ``shown`` — what the answer step showed the subject beyond the hits (the context's evidence,
  then the cited sources), rank 1..n, with ``access_scopes``; absent without answers;
* ``collapsed`` — the final ranking collapsed to the case's target level (``target_id``), the
  list the metrics were computed on.

The file's key-value metadata ``ragpipe.cell`` holds the canonical JSON of the cell, its outcome,
metrics and latency, the trace ``format`` and, when the run answers, the ``answer`` the metrics
were computed on (abstained, reason, failure, citations), so one file describes its cell on its
own and verification can recompute every metric from it (``recompute.py``). Files are named by the cell's
position in the run's expected cells (``cell-000001.parquet``); a resume finds cells through the
ledger, never through these names. A file is written atomically before its ``CellCompleted``
record, so a crash leaves at worst an unreferenced file that the rerun replaces.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import bytes_digest
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.retrieval.results import Rankings

TRACES = "traces"
CELL_METADATA_KEY = b"ragpipe.cell"
# 2: final and shown rows carry access scopes and the metadata the answer, so every metric is
# recomputable from the file; format-1 traces (no such columns) cannot be verified and are refused.
TRACE_FORMAT = 2
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
        ("access_scopes", pa.string()),
    ]
)
Shown = tuple[str, str, tuple[str, ...]]  # (chunk ID, document ID, access scopes) of one shown item


class TraceError(ValueError):
    """A trace file is missing or differs from the digest its ledger record names."""


def trace_name(position: int) -> str:
    return f"{TRACES}/cell-{position:06d}.parquet"


_FINAL_FIELDS = itemgetter("rank", "chunk_id", "document_id", "score")


def _runs(values: Sequence[tuple[Any, int]], type: pa.DataType) -> pa.Array:
    """A column made of runs ``(value, length)``, built in Arrow (no Python object per row)."""
    parts = [pa.repeat(pa.scalar(v, type=type), n) if v is not None else pa.nulls(n, type) for v, n in values if n]
    return pa.concat_arrays(parts) if parts else pa.array([], type=type)


def scopes_json(scopes: Sequence[str]) -> str:
    """The ``access_scopes`` cell value: the canonical JSON list."""
    return canonical_bytes(list(scopes)).decode("utf-8")


def hit_table(
    cell: Mapping[str, Any],
    rankings: Rankings,
    hits: Sequence[Mapping[str, Any]],
    hit_scopes: Sequence[Sequence[str]],
    targets: Sequence[str],
    shown: Sequence[Shown] = (),
) -> pa.Table:
    """The rows of one cell (module docstring) from a query's rankings, hits (with the access
    scopes of each, in order), the items the answer step showed, and the collapsed list.

    Columns are transposed with ``zip`` over the hits' tuples — in C, not a Python loop per row:
    this runs for ~5,000 rows per cell at k = 1000 (docs/benchmarks.md, evaluation runs)."""
    stages: list[tuple[Any, int]] = []
    channels: list[tuple[Any, int]] = []
    rank: list[Any] = []
    rep: list[Any] = []
    chunk: list[Any] = []
    doc: list[Any] = []
    score: list[Any] = []
    for name, ranked in rankings.channels.items():
        if not ranked:
            continue
        ranks, found = zip(*ranked)
        _, p, c, d, sc = zip(*found)  # Hit: channel, representation, chunk, document, score
        stages.append(("channel", len(ranked)))
        channels.append((name, len(ranked)))
        rank += ranks
        rep += p
        chunk += c
        doc += d
        score += sc
    fused = rankings.fused
    if fused:
        _, c, d, _, sc, _, _ = zip(*fused)  # FusedHit: key, chunk, document, representation, score, ...
        stages.append(("fused", len(fused)))
        rank += range(1, len(fused) + 1)
        chunk += c
        doc += d
        score += sc
    before_final = len(rank)
    if hits:
        r, c, d, sc = zip(*map(_FINAL_FIELDS, hits))
        stages.append(("final", len(hits)))
        rank += r
        chunk += c
        doc += d
        score += sc
    if shown:
        c, d, _ = zip(*shown)
        stages.append(("shown", len(shown)))
        rank += range(1, len(shown) + 1)
        chunk += c
        doc += d
        score += [None] * len(shown)
    if len(hit_scopes) != len(hits):
        raise ValueError(f"{len(hits)} hits but {len(hit_scopes)} scope lists")
    cache: dict[tuple[str, ...], str] = {}  # a few distinct scope sets per corpus: encode each once
    scoped = [cache.get(t) or cache.setdefault(t, scopes_json(t)) for t in map(tuple, hit_scopes)]
    scoped += [scopes_json(s) for _, _, s in shown]
    ranked_rows = len(rank)
    m = len(targets)
    stages.append(("collapsed", m))
    rank += range(1, m + 1)
    total = ranked_rows + m
    channels.append((None, total - len(rep)))
    string = pa.string()
    columns = {
        "case_id": _runs([(cell["case"], total)], string),
        "repeat": _runs([(cell["repeat"], total)], pa.int32()),
        "arm": _runs([(cell["arm"], total)], string),
        "stage": _runs(stages, string),
        "channel": _runs(channels, string),
        "rank": pa.array(rank, type=pa.int32()),
        "representation_id": pa.concat_arrays([pa.array(rep, type=string), pa.nulls(total - len(rep), string)]),
        "chunk_id": pa.concat_arrays([pa.array(chunk, type=string), pa.nulls(m, string)]),
        "document_id": pa.concat_arrays([pa.array(doc, type=string), pa.nulls(m, string)]),
        "target_id": pa.concat_arrays([pa.nulls(ranked_rows, string), pa.array(list(targets), type=string)]),
        "score": pa.concat_arrays([pa.array(score, type=pa.float64()), pa.nulls(m, pa.float64())]),
        "access_scopes": pa.concat_arrays(
            [pa.nulls(before_final, string), pa.array(scoped, type=string), pa.nulls(m, string)]
        ),
    }
    return pa.Table.from_arrays([columns[f.name] for f in HIT_SCHEMA], schema=HIT_SCHEMA)


def write_trace(run: Path, name: str, table: pa.Table, cell_record: Mapping[str, Any]) -> dict[str, Any]:
    """Write ``table`` (with the cell's metadata: ``cell_record`` plus the trace ``format``)
    atomically as ``run/name``; returns the ``{file, digest, rows, bytes}`` reference the
    ``CellCompleted`` record carries."""
    metadata = {**cell_record, "format": TRACE_FORMAT}
    table = table.replace_schema_metadata({CELL_METADATA_KEY: canonical_bytes(metadata)})
    # An Arrow-native buffer: the encoder never calls back into Python. No dictionary pages: the
    # ID columns are nearly unique, and zstd alone gives the same size (~170 KB a SciFact cell at
    # k = 1000) in ~20 % less time.
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression="zstd", use_dictionary=False)
    data = buffer.getvalue().to_pybytes()
    write_file_atomic(run / name, data)
    return {"file": name, "digest": bytes_digest(data), "rows": table.num_rows, "bytes": len(data)}


def verify_trace(run: Path, ref: Mapping[str, Any], where: str) -> bytes:
    """The bytes of the trace ``ref`` names; refuses a file that is missing or whose bytes differ
    from ``ref['digest']``."""
    path = run / str(ref["file"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{where}: trace {path} cannot be read: {exc.strerror}") from None
    if bytes_digest(data) != ref["digest"]:
        raise TraceError(f"{where}: trace {path} does not match the digest in the ledger")
    return data


def read_trace(
    run: Path, ref: Mapping[str, Any], where: str, columns: Sequence[str] | None = None
) -> tuple[pa.Table, dict[str, Any]]:
    """The verified trace's rows (only ``columns``, when given: reading fewer is most of what
    verifying a run costs) and its ``ragpipe.cell`` metadata (``verify_trace`` first). The file's
    schema must be ``HIT_SCHEMA`` whatever is read."""
    data = verify_trace(run, ref, where)
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        schema = parquet.schema_arrow
        metadata = json.loads((schema.metadata or {})[CELL_METADATA_KEY])
        if not schema.remove_metadata().equals(HIT_SCHEMA):
            raise TraceError(f"{where}: trace {run / str(ref['file'])}: its columns are not the trace schema")
        table = parquet.read(columns=list(columns) if columns is not None else None)
    except (pa.ArrowException, KeyError, ValueError, RecursionError) as exc:
        if isinstance(exc, TraceError):
            raise
        raise TraceError(f"{where}: trace {run / str(ref['file'])} is not a cell trace: {exc}") from None
    if not isinstance(metadata, dict):
        raise TraceError(f"{where}: trace {run / str(ref['file'])}: metadata is not an object")
    nulls = [name for name in ("stage", "rank") if name in table.column_names and table[name].null_count]
    if nulls:
        raise TraceError(f"{where}: trace {run / str(ref['file'])}: column {nulls[0]!r} has nulls")
    return table, metadata
