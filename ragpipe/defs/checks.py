"""Blocking asset checks: a failing check stops everything downstream in the run.

A failing check's ``description`` states what is wrong (the first problem found and how many there
are): it is what ``ragpipe build`` prints as the root cause.
"""


from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetChecksDefinition, AssetCheckSeverity, asset_check

from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.stages import steps


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
            metadata={"chunks_checked": checked, "problems": len(problems), "first_problems": "\n".join(problems[:10])},
        )

    @asset_check(asset="index_bundle", blocking=True, partitions_def=corpus_revisions, description="The published bundle verifies completely.")
    def bundle_verifies(context: AssetCheckExecutionContext, ragpipe: RagpipeHome) -> AssetCheckResult:
        path, problems = steps.check_bundle(ragpipe.workspace, _partition(context))
        return AssetCheckResult(
            passed=not problems,
            severity=AssetCheckSeverity.ERROR,
            description=_summary(problems, f"in bundle {path}"),
            metadata={"bundle_path": path, "problems": "\n".join(problems[:20]) or "none"},
        )

    return [chunks_match_source, bundle_verifies]


def _partition(context: AssetCheckExecutionContext) -> str:
    return context.op_execution_context.partition_key


def _summary(problems: list[str], where: str) -> str | None:
    """``None`` when there is nothing wrong; else the first problem and how many there are."""
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{len(problems)} problem(s) {where}: {problems[0]}{more}"
