"""Stage results as the metadata a Dagster user expects.

- the row count of a tabular output as ``dagster/row_count`` (the UI shows it on the asset);
- tables as ``MetadataValue.table`` with a schema (never markdown strings), empty ones omitted;
- ``Path`` values as ``MetadataValue.path``; text and integers as they are; every float — a
  metric value, delta, interval bound, threshold, in a table or not — rounded to 4 significant
  digits (``SIGNIFICANT``): figures for a person (``0.9218``, not ``0.9217678885599524``); the
  raw values stay in the artifacts (run reports, decision and comparison files).

The step lines of ``ragpipe build`` read ``dagster/row_count``, ``duration_seconds``, ``excluded``,
``encoded``, ``cache_hits``, ``bundle_id`` and ``bundle_path`` from these materializations, and its
embedding bar reads the ``embeddings`` step's observations (``ENCODED`` of ``NEW_TEXTS``).
"""

from __future__ import annotations

from pathlib import Path

from dagster import DataVersion, MaterializeResult, MetadataValue, TableColumn, TableRecord, TableSchema

from ragpipe.stages.release_chain_store import ChainResult
from ragpipe.stages.results import StageResult, Table

ROW_COUNT = "dagster/row_count"
# The embeddings asset observes its progress after every slice: texts encoded so far, of how many new.
ENCODED = "encoded"
NEW_TEXTS = "new_texts"


SIGNIFICANT = 4


def rounded(value: object) -> object:
    """``value`` with a float rounded to ``SIGNIFICANT`` significant digits (anything else as is)."""
    if isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")):
        return float(f"{value:.{SIGNIFICANT}g}")
    return value


def table_value(t: Table) -> MetadataValue:
    """A ``Table`` as a Dagster table with its schema, floats rounded (``rounded``)."""
    schema = TableSchema(columns=[TableColumn(name, kind) for name, kind in t.columns])
    records = [TableRecord(data={k: rounded(v) for k, v in row.items()}) for row in t.rows]
    return MetadataValue.table(records=records, schema=schema)


def _value(value: object) -> object:
    return MetadataValue.path(str(value)) if isinstance(value, Path) else rounded(value)


def stage_metadata(result: StageResult, extra: dict[str, object] | None = None) -> dict[str, object]:
    """The materialization metadata of ``result`` (plus ``extra`` values, given as they are)."""
    metadata: dict[str, object] = {}
    if result.row_count is not None:
        metadata[ROW_COUNT] = MetadataValue.int(result.row_count)
    for key, value in result.metadata.items():
        metadata[key] = _value(value)
    metadata.update({name: table_value(t) for name, t in result.tables.items()})
    metadata.update(extra or {})
    return metadata


def to_materialize_result(result: StageResult, extra: dict[str, object] | None = None) -> MaterializeResult:
    """The ``MaterializeResult`` of one stage: its data version and metadata."""
    return MaterializeResult(data_version=DataVersion(result.data_version), metadata=stage_metadata(result, extra))


def chain_materialize_result(result: ChainResult) -> MaterializeResult:
    """The ``MaterializeResult`` of a chain asset: its Dagster data version (``result.data_version``,
    which for ``evaluation_run`` is the spec ID, not the attempt's stage version) and metadata."""
    metadata: dict[str, object] = {k: _value(v) for k, v in result.metadata.items()}
    metadata.update({name: table_value(t) for name, t in result.tables.items()})
    return MaterializeResult(data_version=DataVersion(result.data_version), metadata=metadata)
