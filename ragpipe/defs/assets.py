"""The build-side asset graph. Each body reads its partition, delegates to ``ragpipe.stages``
and reports a ``DataVersion`` (the artifact digest) plus small, useful metadata.

Assets are made by ``build_assets(spec)`` so each asset's ``code_version`` is its cumulative
semantic spec ID from the pipeline spec file. Every upstream output an asset reads is one of its
``deps`` (so Dagster's lineage and staleness see every input), and each body reads those outputs
through their ``latest`` pointers (``ragpipe.stages.stage_store``).
"""


from dagster import AssetExecutionContext, AssetsDefinition, DataVersion, MaterializeResult, MetadataValue, asset

from ragpipe.defs.partitions import corpus_revisions
from ragpipe.defs.resources import RagpipeHome
from ragpipe.pipeline_spec import PipelineSpec
from ragpipe.stages import steps

GROUP = "build"


def to_result(result: steps.StageResult) -> MaterializeResult:
    metadata: dict[str, object] = dict(result.metadata)
    metadata.update({k: MetadataValue.md(v) for k, v in result.markdown.items()})
    if "bundle_path" in metadata:
        metadata["bundle_path"] = MetadataValue.path(str(metadata["bundle_path"]))
    return MaterializeResult(data_version=DataVersion(result.data_version), metadata=metadata)


def build_assets(spec: PipelineSpec) -> list[AssetsDefinition]:
    ids = spec.spec_ids
    common = {"partitions_def": corpus_revisions, "group_name": GROUP}

    @asset(code_version=ids["source_snapshot"], kinds={"python", "parquet"}, **common)
    def source_snapshot(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """Normalised documents of one registered corpus revision; exclusions listed with reasons."""
        return to_result(steps.run_source_snapshot(ragpipe.workspace, context.partition_key, spec))

    @asset(code_version=ids["chunks"], deps=[source_snapshot], kinds={"python", "parquet"}, **common)
    def chunks(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """Exact UTF-8 byte spans of the source documents."""
        return to_result(steps.run_chunks(ragpipe.workspace, context.partition_key, spec))

    @asset(code_version=ids["representations"], deps=[source_snapshot, chunks], kinds={"python", "parquet"}, **common)
    def representations(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """Retrieval texts derived from chunks (raw, title breadcrumb); each points to one chunk."""
        return to_result(steps.run_representations(ragpipe.workspace, context.partition_key, spec))

    @asset(code_version=ids["embeddings"], deps=[representations], kinds={"pytorch", "parquet"}, **common)
    def embeddings(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """Vectors for representations through the persistent (embedder spec, text digest) cache."""
        return to_result(
            steps.run_embeddings(ragpipe.workspace, context.partition_key, spec, progress=context.log.info)
        )

    @asset(code_version=ids["lexical_index"], deps=[source_snapshot, representations], kinds={"tantivy"}, **common)
    def lexical_index(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """tantivy BM25 index over representations with ID and authorization fields."""
        return to_result(steps.run_lexical_index(ragpipe.workspace, context.partition_key, spec))

    @asset(code_version=ids["vector_index"], deps=[source_snapshot, representations, embeddings], kinds={"lancedb"}, **common)
    def vector_index(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """lancedb table of representation vectors with ID and authorization fields."""
        return to_result(steps.run_vector_index(ragpipe.workspace, context.partition_key, spec))

    bundle_inputs = [source_snapshot, chunks, representations, embeddings, lexical_index, vector_index]

    @asset(code_version=ids["index_bundle"], deps=bundle_inputs, kinds={"python"}, **common)
    def index_bundle(context: AssetExecutionContext, ragpipe: RagpipeHome) -> MaterializeResult:
        """The verified, content-addressed bundle, published atomically."""
        return to_result(steps.run_index_bundle(ragpipe.workspace, context.partition_key, spec))

    return [*bundle_inputs, index_bundle]
