"""``ragpipe eval sql``: DuckDB over one run, with views ``cells``, ``hits`` and ``metrics``.

The run is verified first (``run_folder.verify_run``: chain, head, transitions, bound inputs, each
trace file against its digest, every cell's metrics recomputed), so SQL never reads a record or a
trace the ledger does not vouch for:

* ``cells`` — one row per expected cell, in expected order: ``position``, ``case_id``,
  ``repeat``, ``arm``, ``status`` (``pending`` | ``started`` | the terminal outcome), ``starts``
  (how many times the cell was started), ``latency_ms``, ``answer_ms``, ``answer_calls``,
  ``answer_input_tokens``, ``answer_output_tokens``, ``answer_cost_micros`` (the cell's
  ``answer_usage``; null without answers, or when unknown), ``hits``, ``error``, ``tags``,
  ``trace_file``;
* ``metrics`` — one row per completed cell and metric: ``case_id``, ``repeat``, ``arm``,
  ``metric``, ``value``, ``direction``, ``unit``, ``k``;
* ``hits`` — the rows of every completed cell, as its record's trace reference names them in the
  Parquet files (``traces.HIT_SCHEMA``; a file may also hold rows of cells whose closing record was
  never made durable, which are left out).

``cells`` and ``metrics`` are projections of the ledger; ``hits`` is read from the verified traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from ragpipe.evaluation.ledger import LEDGER, read_ledger
from ragpipe.evaluation.metrics import MetricSpec
from ragpipe.evaluation.run_folder import verify_run
from ragpipe.evaluation.run_state import COMPLETED_OUTCOMES, RunState
from ragpipe.evaluation.traces import HIT_SCHEMA, TraceReader

CELLS_SCHEMA = pa.schema(
    [
        ("position", pa.int32()),
        ("case_id", pa.string()),
        ("repeat", pa.int32()),
        ("arm", pa.string()),
        ("status", pa.string()),
        ("starts", pa.int32()),
        ("latency_ms", pa.float64()),
        ("answer_ms", pa.float64()),
        ("answer_calls", pa.int32()),
        ("answer_input_tokens", pa.int64()),
        ("answer_output_tokens", pa.int64()),
        ("answer_cost_micros", pa.int64()),
        ("hits", pa.int32()),
        ("error", pa.string()),
        ("tags", pa.list_(pa.string())),
        ("trace_file", pa.string()),
    ]
)
METRICS_SCHEMA = pa.schema(
    [
        ("case_id", pa.string()),
        ("repeat", pa.int32()),
        ("arm", pa.string()),
        ("metric", pa.string()),
        ("value", pa.float64()),
        ("direction", pa.string()),
        ("unit", pa.string()),
        ("k", pa.int32()),
    ]
)


def _cells(state: RunState) -> pa.Table:
    rows = []
    tags = state.created.get("tags", {})
    for position, key in enumerate(state.expected, start=1):
        p = state.terminal.get(key, {})
        usage = p.get("answer_usage") or {}
        status = p.get("outcome") or ("started" if state.starts.get(key) else "pending")
        rows.append(
            {
                "position": position,
                "case_id": key[0],
                "repeat": key[1],
                "arm": key[2],
                "status": status,
                "starts": state.starts.get(key, 0),
                "latency_ms": p.get("latency_ms"),
                "answer_ms": p.get("answer_ms"),
                "answer_calls": usage.get("calls"),
                "answer_input_tokens": usage.get("input_tokens"),
                "answer_output_tokens": usage.get("output_tokens"),
                "answer_cost_micros": usage.get("cost_micros"),
                "hits": p.get("hits"),
                "error": p.get("error"),
                "tags": tags.get(key[0], []),
                "trace_file": p["trace"]["file"] if "trace" in p else None,
            }
        )
    return pa.Table.from_pylist(rows, schema=CELLS_SCHEMA)


def _metrics(state: RunState) -> pa.Table:
    specs = {m["name"]: MetricSpec.model_validate(m) for m in state.created["spec"]["metrics"]}
    rows = []
    for key in state.expected:
        p = state.terminal.get(key)
        if p is None or p["outcome"] not in COMPLETED_OUTCOMES:
            continue
        for name, value in p["metrics"].items():
            spec = specs[name]
            rows.append(
                {
                    "case_id": key[0],
                    "repeat": key[1],
                    "arm": key[2],
                    "metric": name,
                    "value": float(value),
                    "direction": spec.direction,
                    "unit": spec.unit,
                    "k": spec.k,
                }
            )
    return pa.Table.from_pylist(rows, schema=METRICS_SCHEMA)


def connect(run: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's three views (module docstring)."""
    run = Path(run)
    state = verify_run(run)  # custody first: chain, inputs, traces, every metric recomputed
    records = read_ledger(run).records[: state.events]
    traces = TraceReader(run)
    parts = [
        traces.cell(r.payload["trace"], r.payload["cell"], f"{run / LEDGER}: record {r.seq}")[0]
        for r in records
        if r.kind == "CellCompleted"
    ]
    con = duckdb.connect()
    con.register("cells", _cells(state))
    con.register("metrics", _metrics(state))
    con.register("hits", pa.concat_tables(parts).replace_schema_metadata() if parts else HIT_SCHEMA.empty_table())
    return con


def run_sql(run: Path, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """Column names and rows of ``query`` over the run's views."""
    con = connect(run)
    try:
        cursor = con.execute(query)
        if cursor.description is None:
            return [], []
        return [d[0] for d in cursor.description], cursor.fetchall()
    finally:
        con.close()
