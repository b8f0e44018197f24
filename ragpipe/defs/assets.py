"""The build-side asset graph. Each body reads its partition, delegates to ``ragpipe.stages``
and reports a ``DataVersion`` (the artifact digest) plus the metadata of ``ragpipe.defs.metadata``.

Assets are made by ``build_assets(spec)`` so each asset's ``code_version`` is its cumulative
semantic spec ID from the pipeline spec file; owners and tags come from the spec's operational
``dagster:`` section (no ID). Every upstream output an asset reads is one of its ``deps`` (so
Dagster's lineage and staleness see every input), and each body reads those outputs through their
``latest`` pointers (``ragpipe.stages.stage_store``).

Operation: every asset names a pool (``POOLS``; the instance template ``dagster.yaml``
limits each to one slot per step) and has ``BackfillPolicy.multi_run(1)``: a backfill runs one run
per revision, so a revision's folders have one writer per run.
"""

import warnings

from dagster import (
    AssetExecutionContext,
    AssetObservation,
    AssetsDefinition,
    BackfillPolicy,
    BetaWarning,
    MaterializeResult,
    asset,
)

from ragpipe.defs.embedding_shards import build_sharded_embeddings, shard_count
from ragpipe.defs.metadata import ENCODED, NEW_TEXTS, to_materialize_result
from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.release_chain import build_chain_assets
from ragpipe.defs.resources import RagpipeHome
from ragpipe.spec import PipelineSpec
from ragpipe.stages import steps

# `backfill_policy` is a beta parameter of `@asset`; we use it deliberately (one run per revision)
# on a pinned, tested Dagster, so its BetaWarning (printed once per process that loads the
# definitions: CLI, webserver, daemon, each run) only adds noise. Narrow by message and category.
warnings.filterwarnings("ignore", message=r"Parameter `backfill_policy` of function `asset`", category=BetaWarning)

GROUP = "build"
ATTEMPT_TAG = "ragpipe/attempt"  # set by corpus_revision_sensor on the runs it requests

# Single-writer resources: stage folders, the shared embedding cache, tantivy and lancedb writers,
# the content-addressed bundle store.
POOLS = {
    "source_snapshot": "ragpipe_stage_files",
    "chunks": "ragpipe_stage_files",
    "representations": "ragpipe_stage_files",
    "embeddings": "ragpipe_embedding_cache",
    "lexical_index": "ragpipe_tantivy",
    "vector_index": "ragpipe_lancedb",
    "index_bundle": "ragpipe_bundle_store",
}
BACKFILL_POLICY = BackfillPolicy.multi_run(1)


def build_assets(spec: PipelineSpec) -> list[AssetsDefinition]:
    """The build group, plus the evaluation → gate → release chain when the spec has an
    ``evaluation:`` section (``ragpipe.defs.release_chain``)."""
    ids = spec.spec_ids

    def shared(name: str, code_version: str, pool: str) -> dict[str, object]:
        return {
            "name": name,
            "code_version": code_version,
            "partitions_def": corpus_revisions,
            "pool": pool,
            "backfill_policy": BACKFILL_POLICY,
            "owners": spec.dagster.owners_for(name),
            "tags": spec.dagster.tags_for(name),
        }

    def common(name: str) -> dict[str, object]:
        return {**shared(name, ids[name], POOLS[name]), "group_name": GROUP}

    @asset(deps=[], kinds={"python", "parquet"}, **common("source_snapshot"))
    def source_snapshot(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """Normalised documents of one registered corpus revision; exclusions listed with reasons."""
        return to_materialize_result(steps.run_source_snapshot(ragpipe.workspace, context.partition_key, spec))

    @asset(deps=[source_snapshot], kinds={"python", "parquet"}, **common("chunks"))
    def chunks(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """Exact UTF-8 byte spans of the source documents."""
        return to_materialize_result(steps.run_chunks(ragpipe.workspace, context.partition_key, spec))

    @asset(deps=[source_snapshot, chunks], kinds={"python", "parquet"}, **common("representations"))
    def representations(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """Retrieval texts derived from chunks (raw, title breadcrumb) or written by a model
        (questions, summary: cached, budgeted calls with usage and cost in the metadata); each
        points to one chunk."""
        return to_materialize_result(steps.run_representations(ragpipe.workspace, context.partition_key, spec))

    @asset(deps=[representations], kinds={"pytorch", "parquet"}, **common("embeddings"))
    def one_step_embeddings(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """Vectors for representations through the persistent (embedder spec, text digest) cache."""

        def progress(done: int, total: int) -> None:  # an observation per slice: ragpipe build's bar
            context.log_event(
                AssetObservation(
                    context.asset_key, partition=context.partition_key, metadata={ENCODED: done, NEW_TEXTS: total}
                )
            )

        return to_materialize_result(
            steps.run_embeddings(ragpipe.workspace, context.partition_key, spec, progress=progress)
        )

    shards = shard_count()
    if shards > 1:  # the same asset, its encoding fanned out into shard steps
        embeddings = build_sharded_embeddings(spec, {**common("embeddings"), "kinds": {"pytorch", "parquet"}}, shards)
    else:
        embeddings = one_step_embeddings

    @asset(deps=[source_snapshot, representations], kinds={"tantivy"}, **common("lexical_index"))
    def lexical_index(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """tantivy BM25 index over representations with ID and authorization fields."""
        return to_materialize_result(steps.run_lexical_index(ragpipe.workspace, context.partition_key, spec))

    @asset(deps=[source_snapshot, representations, embeddings], kinds={"lancedb"}, **common("vector_index"))
    def vector_index(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """lancedb table of representation vectors with ID and authorization fields."""
        return to_materialize_result(steps.run_vector_index(ragpipe.workspace, context.partition_key, spec))

    bundle_inputs = [source_snapshot, chunks, representations, embeddings, lexical_index, vector_index]

    @asset(deps=bundle_inputs, kinds={"python"}, **common("index_bundle"))
    def index_bundle(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """The verified, content-addressed bundle, published atomically."""
        result = steps.run_index_bundle(ragpipe.workspace, context.partition_key, spec)
        attempt = context.run.tags.get(ATTEMPT_TAG)
        return to_materialize_result(result, {"run_attempt": int(attempt)} if attempt else None)

    chain = build_chain_assets(spec, shared) if spec.evaluation is not None else []
    return [*bundle_inputs, index_bundle, *chain]
