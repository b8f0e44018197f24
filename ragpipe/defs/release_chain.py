"""The evaluation → gate → release assets (present when the pipeline spec has an ``evaluation:`` section).

``evaluation_run`` (deps ``index_bundle``) → ``gate_decision`` → ``release_manifest``, partitioned
by corpus revision like the build graph, each body delegating to one ``ragpipe.stages`` step.
Code versions come from ``ragpipe.stages.chain_plan``; data versions are the evaluation spec ID,
the decision ID and the release ID. The blocking check ``evaluation_ledger_verifies`` stops the
gate (and the release) when the run's ledger is incomplete or does not verify.
"""

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetsDefinition,
    MaterializeResult,
    MetadataValue,
    asset,
    asset_check,
)

from ragpipe.defs.metadata import chain_materialize_result
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.spec import PipelineSpec
from ragpipe.stages.chain_plan import chain_plan
from ragpipe.stages.eval_steps import check_evaluation_run, run_evaluation_run
from ragpipe.stages.gate_steps import run_gate_decision
from ragpipe.stages.release_steps import run_release_manifest

GROUP = "release"
CHAIN_POOLS = {
    # retrieval over a whole suite is CPU-bound: one evaluation (or gate re-evaluation) at a time
    "evaluation_run": "ragpipe_evaluation",
    "gate_decision": "ragpipe_evaluation",
    # the shared, content-addressed release store
    "release_manifest": "ragpipe_release_store",
}


def build_chain_assets(spec: PipelineSpec, common) -> list[AssetsDefinition]:
    """The three chain assets; ``common(name, code_version, pool)`` gives the shared decorator arguments."""
    versions = chain_plan(spec).code_versions()

    def args(name: str) -> dict[str, object]:
        return {**common(name, versions[name], CHAIN_POOLS[name]), "group_name": GROUP}

    @asset(deps=["index_bundle"], kinds={"python", "duckdb"}, **args("evaluation_run"))
    def evaluation_run(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """The revision's bundle evaluated on the spec's suite: a fresh run with a hash-chained ledger."""
        return chain_materialize_result(run_evaluation_run(ragpipe.workspace, context.partition_key, spec))

    @asset(deps=[evaluation_run], kinds={"python"}, **args("gate_decision"))
    def gate_decision(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """The ordered gate on this revision's run against the active release of the default target (or bootstrap floors)."""
        return chain_materialize_result(run_gate_decision(ragpipe.workspace, context.partition_key, spec))

    @asset(deps=[gate_decision], kinds={"python"}, **args("release_manifest"))
    def release_manifest(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """The release manifest binding bundle, plans, policies, evaluation run and gate decision."""
        return chain_materialize_result(run_release_manifest(ragpipe.workspace, context.partition_key, spec))

    return [evaluation_run, gate_decision, release_manifest]


def build_chain_checks() -> list[AssetChecksDefinition]:
    @asset_check(
        asset="evaluation_run",
        blocking=True,
        partitions_def=corpus_revisions,
        description="The evaluation run is completed and its ledger, bound inputs and traces verify.",
    )
    def evaluation_ledger_verifies(context: AssetCheckExecutionContext, ragpipe: RagpipeHome) -> AssetCheckResult:
        path, problems = check_evaluation_run(ragpipe.workspace, context.op_execution_context.partition_key)
        return AssetCheckResult(
            passed=not problems,
            severity=AssetCheckSeverity.ERROR,
            description=f"evaluation run {path}: {problems[0]}" if problems else None,
            metadata={"run_path": MetadataValue.path(path), "problems": len(problems)},
        )

    return [evaluation_ledger_verifies]
