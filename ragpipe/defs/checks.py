"""Blocking asset checks: a failing check stops everything downstream in the run."""


from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetChecksDefinition, AssetCheckSeverity, asset_check

from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.stages import steps


def build_checks() -> list[AssetChecksDefinition]:
    @asset_check(asset="chunks", blocking=True, partitions_def=corpus_revisions, description="Every chunk's text equals its document's bytes at its span.")
    def chunks_match_source(context: AssetCheckExecutionContext, ragpipe: RagpipeHome) -> AssetCheckResult:
        checked, problems = steps.check_chunks(ragpipe.workspace, _partition(context))
        return AssetCheckResult(
            passed=not problems,
            severity=AssetCheckSeverity.ERROR,
            metadata={"chunks_checked": checked, "problems": len(problems), "first_problems": "\n".join(problems[:10])},
        )

    @asset_check(asset="index_bundle", blocking=True, partitions_def=corpus_revisions, description="The published bundle verifies completely.")
    def bundle_verifies(context: AssetCheckExecutionContext, ragpipe: RagpipeHome) -> AssetCheckResult:
        path, problems = steps.check_bundle(ragpipe.workspace, _partition(context))
        return AssetCheckResult(
            passed=not problems,
            severity=AssetCheckSeverity.ERROR,
            metadata={"bundle_path": path, "problems": "\n".join(problems[:20]) or "none"},
        )

    return [chunks_match_source, bundle_verifies]


def _partition(context: AssetCheckExecutionContext) -> str:
    return context.op_execution_context.partition_key
