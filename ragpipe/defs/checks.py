"""Blocking asset checks: a failing check stops everything downstream in the run.

A failing check's ``description`` states what is wrong (the first problem found and how many there
are): it is what ``ragpipe build`` prints as the root cause. The problems themselves are a table
(at most ``SHOWN`` rows), present only when there are some.
"""

import warnings

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    PreviewWarning,
    asset_check,
)

from ragpipe.defs.metadata import table_value
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.stages import steps
from ragpipe.stages.results import table

# Partitioned asset checks are deliberate (a check result belongs to one corpus revision) and
# Dagster is pinned and tested. Dagster builds AssetCheckSpecs again while it resolves graphs and
# subsets steps, and each construction site is a new warning "location", so the preview warning
# printed 20+ times per run. A `catch_warnings` around the decorator cannot cover those later
# constructions; a process-wide filter narrow by message and category can. Drop it when Dagster
# declares partitioned checks stable.
warnings.filterwarnings("ignore", message=r"Specifying a partitions_def on an AssetCheckSpec", category=PreviewWarning)

SHOWN = 20


def build_checks() -> list[AssetChecksDefinition]:
    @asset_check(
        asset="chunks",
        additional_deps=["source_snapshot"],  # it reads the documents the chunks were cut from
        blocking=True,
        partitions_def=corpus_revisions,
        description="Every chunk's text equals its document's bytes at its span.",
    )
    def chunks_match_source(context: AssetCheckExecutionContext, ragpipe: RagpipeHome) -> AssetCheckResult:
        checked, problems = steps.check_chunks(ragpipe.workspace, _partition(context))
        return AssetCheckResult(
            passed=not problems,
            severity=AssetCheckSeverity.ERROR,
            description=_summary(problems, f"in {checked} chunks"),
            metadata={"chunks_checked": checked, "problems": len(problems), **_problem_table(problems)},
        )

    @asset_check(
        asset="index_bundle",
        blocking=True,
        partitions_def=corpus_revisions,
        description="The published bundle verifies completely.",
    )
    def bundle_verifies(context: AssetCheckExecutionContext, ragpipe: RagpipeHome) -> AssetCheckResult:
        path, problems = steps.check_bundle(ragpipe.workspace, _partition(context))
        return AssetCheckResult(
            passed=not problems,
            severity=AssetCheckSeverity.ERROR,
            description=_summary(problems, f"in bundle {path}"),
            metadata={"bundle_path": MetadataValue.path(path), "problems": len(problems), **_problem_table(problems)},
        )

    return [chunks_match_source, bundle_verifies]


def _partition(context: AssetCheckExecutionContext) -> str:
    return context.op_execution_context.partition_key


def _problem_table(problems: list[str]) -> dict[str, MetadataValue]:
    """``first_problems`` as a table of the first ``SHOWN`` problems; nothing when there are none."""
    t = table([("problem", "string")], [[p] for p in problems], limit=SHOWN)
    return {"first_problems": table_value(t)} if t else {}


def _summary(problems: list[str], where: str) -> str | None:
    """``None`` when there is nothing wrong; else the first problem and how many there are."""
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{len(problems)} problem(s) {where}: {problems[0]}{more}"
