"""Traces: the rows of a group of cells in one Parquet file in ``<run>/traces/``, its digest in
each cell's ledger record.

Rows (``HIT_SCHEMA``), one per ranked item, each naming its cell (``case_id``, ``repeat``,
``arm``), by ``stage``:

* ``channel`` — each channel's collapsed hits before fusion (``channel``, ``rank``,
  ``representation_id``, ``chunk_id``, ``document_id``, ``score``): the retriever's rankings
  (``QueryResult.rankings``), which its audit trace reports as ``channels``;
* ``fused`` — the fused list (the trace's first ``max(k, 20)`` items, ``fusion.items``), rank 1..n,
  only when the plan reranks: without a reranker the hits *are* the fused list's first k items;
* ``final`` — the hits returned for the query (after any reranker), rank 1..k, with each hit's
  ``access_scopes`` (canonical JSON list);
* ``shown`` — what the answer step showed the subject beyond the hits (the context's evidence,
  then the cited sources), rank 1..n, with ``access_scopes``; absent without answers;
* ``ann_approximate`` and ``ann_exact`` — in runs whose plan searches vectors approximately, the
  approximate searcher's top 10 rows and exact search's for the cell's query (channel ``vector``,
  rank, representation, chunk, document, exact score): what ``ann_recall@10`` is computed from
  (``ragpipe.evaluation.ann``).

What the metrics were computed on — the final hits collapsed to the case's target level — is
not stored: verification derives it from the ``final`` rows (``recompute.py``).

A cell's rows are consecutive: its record's trace reference ``{file, digest, first_row, rows}``
names them. The file's key-value metadata ``ragpipe.cells`` holds the canonical JSON
``{"format": 3, "cells": [...]}``: for each of its cells, in row order, the cell, its outcome,
metrics and latency and, when the run answers, the ``answer`` the metrics were computed on
(abstained, reason, failure, citations), so one file describes its cells on its own and
verification can recompute every metric from it. Files are named by the position of their first
cell among the run's expected cells (``cells-000001.parquet``); a resume finds cells through the
ledger, never through these names. A file is written atomically before its cells'
``CellCompleted`` records (the runner's group commit), so a crash leaves at worst a file whose
cells are not closed, which the rerun of those cells replaces or leaves unreferenced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ragpipe.evaluation.ann import APPROXIMATE_STAGE, EXACT_STAGE
from ragpipe.kernel.canonical import canonical_bytes
from ragpipe.kernel.ids import bytes_digest
from ragpipe.kernel.publish import write_file_atomic
from ragpipe.retrieval.results import AnnComparison, Rankings

TRACES = "traces"
CELLS_METADATA_KEY = b"ragpipe.cells"
# 2: final and shown rows carry access scopes and the metadata the answer, so every metric is
# recomputable from the file. 3: one file per group of cells, no collapsed rows, fused rows only
# with a reranker. Earlier formats are refused (evaluate again).
TRACE_FORMAT = 3
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
        ("score", pa.float64()),
        ("access_scopes", pa.string()),
    ]
)
Shown = tuple[str, str, tuple[str, ...]]  # (chunk ID, document ID, access scopes) of one shown item


class TraceError(ValueError):
    """A trace file is missing or differs from the digest its ledger record names."""


def trace_name(position: int) -> str:
    """The file of a group whose first cell is the ``position``-th expected cell."""
    return f"{TRACES}/cells-{position:06d}.parquet"


CELL_COLUMNS = ("case_id", "repeat", "arm")
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
    shown: Sequence[Shown] = (),
    *,
    reranked: bool = False,
    ann: AnnComparison | None = None,
) -> pa.Table:
    """The rows of one cell (module docstring) from a query's rankings, its hits (with the access
    scopes of each, in order) and the items the answer step showed; the fused list only when
    ``reranked``; the two top-10 lists of ``ann`` (a run of an approximate plan).

    Columns are transposed with ``zip`` over the hits' tuples — in C, not a Python loop per row:
    this runs for ~3,000 rows per cell at k = 1000 (docs/benchmarks.md, evaluation runs)."""
    stages: list[tuple[Any, int]] = []
    channels: list[tuple[Any, int]] = []
    rank: list[Any] = []
    rep: list[Any] = []
    chunk: list[Any] = []
    doc: list[Any] = []
    score: list[Any] = []
    blocks = [("channel", name, ranked) for name, ranked in rankings.channels.items()]
    if ann is not None:  # rows with representation IDs come first: see the column below
        for stage, found in ((APPROXIMATE_STAGE, ann.approximate), (EXACT_STAGE, ann.exact)):
            blocks.append((stage, "vector", list(enumerate(found, start=1))))
    for stage, name, ranked in blocks:
        if not ranked:
            continue
        ranks, found = zip(*ranked)
        _, p, c, d, sc = zip(*found)  # Hit: channel, representation, chunk, document, score
        stages.append((stage, len(ranked)))
        channels.append((name, len(ranked)))
        rank += ranks
        rep += p
        chunk += c
        doc += d
        score += sc
    fused = rankings.fused if reranked else ()
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
    total = len(rank)
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
        "chunk_id": pa.array(chunk, type=string),
        "document_id": pa.array(doc, type=string),
        "score": pa.array(score, type=pa.float64()),
        "access_scopes": pa.concat_arrays([pa.nulls(before_final, string), pa.array(scoped, type=string)]),
    }
    return pa.Table.from_arrays([columns[f.name] for f in HIT_SCHEMA], schema=HIT_SCHEMA)


def write_traces(run: Path, name: str, cells: Sequence[tuple[pa.Table, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Write the rows of ``cells`` — ``(rows, description)`` each, the description being what the
    cell's closing record says of it plus, with answers, its ``answer`` — as one file ``run/name``
    (atomically: written, fsynced, renamed, folder fsynced); returns each cell's trace reference
    ``{file, digest, first_row, rows}``."""
    metadata = {"format": TRACE_FORMAT, "cells": [dict(described) for _, described in cells]}
    table = pa.concat_tables([rows for rows, _ in cells]).replace_schema_metadata(
        {CELLS_METADATA_KEY: canonical_bytes(metadata)}
    )
    # An Arrow-native buffer: the encoder never calls back into Python. No dictionary pages: the
    # ID columns are nearly unique, and zstd alone gives the same size in ~20 % less time.
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression="zstd", use_dictionary=False)
    data = buffer.getvalue().to_pybytes()
    write_file_atomic(run / name, data)
    digest, refs, first = bytes_digest(data), [], 0
    for rows, _ in cells:
        refs.append({"file": name, "digest": digest, "first_row": first, "rows": rows.num_rows})
        first += rows.num_rows
    return refs


def verify_trace(run: Path, ref: Mapping[str, Any], where: str) -> bytes:
    """The bytes of the trace file ``ref`` names; refuses a file that is missing or whose bytes
    differ from ``ref['digest']``."""
    path = run / str(ref["file"])
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"{where}: trace {path} cannot be read: {exc.strerror}") from None
    if bytes_digest(data) != ref["digest"]:
        raise TraceError(f"{where}: trace {path} does not match the digest in the ledger")
    return data


class TraceReader:
    """The verified traces of one run: each file is read, checked against its digest and parsed
    once (a file holds a group of cells), then each cell's rows are sliced out of it."""

    def __init__(self, run: Path, columns: Sequence[str] | None = None):
        self.run = run
        # The cell's columns are always read: they prove which cell a row belongs to.
        self.columns = None if columns is None else list(dict.fromkeys([*CELL_COLUMNS, *columns]))
        self._files: dict[tuple[str, str], tuple[pa.Table, list[Any], dict[tuple[Any, ...], int]]] = {}

    def _file(self, ref: Mapping[str, Any], where: str) -> tuple[pa.Table, list[Any], dict[tuple[Any, ...], int]]:
        key = (str(ref["file"]), str(ref["digest"]))
        if key not in self._files:
            self._files[key] = self._parse(verify_trace(self.run, ref, where), self.run / key[0], where)
        return self._files[key]

    def _parse(self, data: bytes, path: Path, where: str) -> tuple[pa.Table, list[Any], dict[tuple[Any, ...], int]]:
        try:
            parquet = pq.ParquetFile(pa.BufferReader(data))
            schema = parquet.schema_arrow
            raw = (schema.metadata or {}).get(CELLS_METADATA_KEY)
            metadata = json.loads(raw) if raw is not None else {}
            if not isinstance(metadata, dict):
                raise TraceError(f"{where}: trace {path}: metadata is not an object")
            if metadata.get("format") != TRACE_FORMAT:
                raise TraceError(
                    f"{where}: trace {path}: format {metadata.get('format', 2 if raw is None else None)!r} does not carry "
                    f"what verification recomputes (format {TRACE_FORMAT}): evaluate again"
                )
            if not schema.remove_metadata().equals(HIT_SCHEMA):
                raise TraceError(f"{where}: trace {path}: its columns are not the trace schema")
            table = parquet.read(columns=self.columns, use_threads=False)
        except (pa.ArrowException, ValueError, RecursionError) as exc:
            if isinstance(exc, TraceError):
                raise
            raise TraceError(f"{where}: trace {path} is not a cell trace: {exc}") from None
        cells = metadata.get("cells")
        if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
            raise TraceError(f"{where}: trace {path}: metadata lists no cells")
        nulls = [
            name for name in (*CELL_COLUMNS, "stage", "rank") if name in table.column_names and table[name].null_count
        ]
        if nulls:
            raise TraceError(f"{where}: trace {path}: column {nulls[0]!r} has nulls")
        # How many rows name each cell: a record must name all of its cell's rows, so no row that
        # counts against it (a disclosure, a better hit) can sit beside the range it names.
        counted = table.group_by(list(CELL_COLUMNS), use_threads=False).aggregate([([], "count_all")])
        counts = {tuple(row[c] for c in CELL_COLUMNS): row["count_all"] for row in counted.to_pylist()}
        return table, cells, counts

    def cell(self, ref: Mapping[str, Any], cell: Mapping[str, Any], where: str) -> tuple[pa.Table, dict[str, Any]]:
        """The rows and the metadata description of ``cell``, whose record's trace reference is
        ``ref`` (``{file, digest, first_row, rows}``, types checked by the caller): exactly the
        rows it names, every one naming ``cell``, and exactly one description of ``cell``."""
        table, cells, counts = self._file(ref, where)
        path = self.run / str(ref["file"])
        first, rows = ref["first_row"], ref["rows"]
        found = counts.get((cell["case"], cell["repeat"], cell["arm"]), 0)
        if found != rows:
            raise TraceError(f"{where}: trace {path}: the cell has {found} rows, its record names {rows}")
        if first + rows > table.num_rows:
            raise TraceError(f"{where}: trace {path} has {table.num_rows} rows, not rows {first}..{first + rows - 1}")
        part = table.slice(first, rows)
        for column, value in zip(CELL_COLUMNS, (cell["case"], cell["repeat"], cell["arm"]), strict=True):
            if rows and (part[column].unique().to_pylist() != [value]):
                raise TraceError(f"{where}: trace {path}: rows {first}..{first + rows - 1} are not all this cell's")
        described = [c for c in cells if c.get("cell") == cell]
        if len(described) != 1:
            raise TraceError(f"{where}: trace {path} describes this cell {len(described)} times, not once")
        return part, described[0]
