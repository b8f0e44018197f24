"""What a stage reports to its asset: the record, a row count, small metadata and typed tables.

Dagster-free: ``ragpipe.defs.metadata`` turns a ``StageResult`` into Dagster metadata (tables
become ``MetadataValue.table`` with a schema, paths ``MetadataValue.path``, the row count
``dagster/row_count``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ragpipe.stages.stage_store import StageRecord

Scalar = str | int | float | bool
Cell = str | int | float | bool | None
ColumnType = str  # one of Dagster's table column types: "string", "int", "float", "bool"
COLUMN_TYPES = {"string": str, "int": int, "float": float, "bool": bool}


@dataclass(frozen=True)
class Table:
    """A small table: ``columns`` are (name, type); each row maps every column name to a cell.

    Tables are reported only when they have rows; an empty one is omitted and its count kept
    (``excluded: 0``), so the UI never shows a placeholder row.
    """

    columns: tuple[tuple[str, ColumnType], ...]
    rows: tuple[dict[str, Cell], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.columns]
        for name, kind in self.columns:
            if kind not in COLUMN_TYPES:
                raise ValueError(f"table column {name!r}: unknown type {kind!r}")
        for row in self.rows:
            if list(row) != names:
                raise ValueError(f"table row {row!r} does not have exactly the columns {names}")
            for name, kind in self.columns:
                cell = row[name]
                if cell is not None and type(cell) is not COLUMN_TYPES[kind]:
                    raise ValueError(f"table column {name!r} is {kind}, got {cell!r}")


def table(columns: list[tuple[str, ColumnType]], rows: list[list[Cell]], limit: int = 50) -> Table | None:
    """A ``Table`` of the first ``limit`` rows, or ``None`` when there are no rows."""
    if not rows:
        return None
    names = [name for name, _ in columns]
    return Table(tuple(columns), tuple(dict(zip(names, row, strict=True)) for row in rows[:limit]))


@dataclass
class StageResult:
    """What an asset reports.

    ``row_count`` is the number of rows of a tabular output (documents, chunks, representations,
    vectors, indexed rows) and ``None`` for non-tabular ones (the bundle). ``metadata`` values that
    are ``Path`` are paths; ``duration_seconds`` is always present (float, seconds).
    """

    record: StageRecord
    row_count: int | None
    metadata: dict[str, Scalar | Path] = field(default_factory=dict)
    tables: dict[str, Table] = field(default_factory=dict)

    @property
    def data_version(self) -> str:
        return self.record.data_version


def finish(
    record: StageRecord,
    t0: float,
    output_path: Path,
    row_count: int | None,
    metadata: dict[str, Scalar | Path],
    tables: dict[str, Table | None] | None = None,
) -> StageResult:
    """The stage's result: ``metadata`` plus its output folder and the time since ``t0``;
    empty tables (``None``) are dropped."""
    return StageResult(
        record,
        row_count,
        {**metadata, "output_path": output_path, "duration_seconds": round(time.perf_counter() - t0, 3)},
        {name: t for name, t in (tables or {}).items() if t is not None},
    )
