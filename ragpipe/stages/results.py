"""What a stage reports to its asset: the record, small metadata and markdown tables."""

from __future__ import annotations

from dataclasses import dataclass, field

from ragpipe.stages.stage_store import StageRecord


@dataclass
class StageResult:
    """What an asset reports: the data version, small metadata, and markdown tables."""

    record: StageRecord
    metadata: dict[str, str | int | float] = field(default_factory=dict)
    markdown: dict[str, str] = field(default_factory=dict)

    @property
    def data_version(self) -> str:
        return self.record.data_version


def md_table(header: list[str], rows: list[list[object]], limit: int = 20) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"\n… {len(rows) - limit} more")
    return "\n".join(lines)
