"""The ``embeddings`` asset fanned out into shard steps: ``RAGPIPE_EMBEDDING_SHARDS=n`` (n > 1).

A graph-backed asset of ``n`` ``embed_shard_<i>`` ops and one ``assemble`` op, steps
``embeddings.embed_shard_00`` … and ``embeddings.assemble``: each shard op encodes its shard of the
partition's texts into the shared embedding cache (``ragpipe.stages.embedding_shards``), and
``assemble`` publishes the stage output from the cache — the asset's one materialization, with the
same data version and metadata as the one-step asset. An executor that distributes steps (Celery)
runs the shards on any worker; a shard that fails is retried or re-executed alone.

Why fixed shard steps and not Dagster dynamic outputs: a dynamic output's value (the mapping) is
handed to the mapped steps through an IO manager, which on workers that share no disk would have to
be one more store; shard ops depend on each other only by ``Nothing`` and meet in the embedding
cache, which already is on the object store. The count is operational (not in any ID: the cache
holds one vector per text whatever shard encoded it) and fixed when the code location loads; every
process that loads it (launcher, daemon, workers) must see the same value, or the run's plan and a
worker's would differ — set it where ``RAGPIPE_EXECUTOR`` is set.
"""

from dagster import (
    AssetIn,
    AssetsDefinition,
    DataVersion,
    In,
    Nothing,
    OpDefinition,
    OpExecutionContext,
    Out,
    Output,
    graph_asset,
    op,
)

from ragpipe.defs.metadata import stage_metadata
from ragpipe.defs.resources import RagpipeHome
from ragpipe.spec import PipelineSpec
from ragpipe.stages import steps
from ragpipe.stages.embedding_shards import run_embedding_shard, shard_count

__all__ = ["SHARD_POOL", "build_sharded_embeddings", "shard_count"]

# The shard steps' own pool: each loads the model, so its limit bounds the models in memory at
# once (``make pools`` gives it one slot per worker); the assembling step keeps the cache's pool.
SHARD_POOL = "ragpipe_embedding_shards"


def _shard_op(spec: PipelineSpec, shard: int, shards: int) -> OpDefinition:
    @op(name=f"embed_shard_{shard:02d}", ins={"representations": In(Nothing)}, out=Out(Nothing), pool=SHARD_POOL)
    def embed_shard(context: OpExecutionContext, ragpipe: RagpipeHome) -> None:
        """One shard of the partition's texts into the shared embedding cache."""
        figures = run_embedding_shard(ragpipe.workspace, context.partition_key, spec, shard, shards)
        context.log.info(" ".join(f"{k}={v}" for k, v in figures.items()))

    return embed_shard


def build_sharded_embeddings(spec: PipelineSpec, args: dict[str, object], shards: int) -> AssetsDefinition:
    """The graph-backed ``embeddings`` asset; ``args`` are the one-step asset's decorator arguments."""
    pool = args.pop("pool")
    args.pop("name")
    names = [f"shard_{i:02d}" for i in range(shards)]

    @op(ins={name: In(Nothing) for name in names}, out=Out(Nothing), pool=pool)
    def assemble(context: OpExecutionContext, ragpipe: RagpipeHome):
        """The partition's vectors from the cache the shards filled, published as the stage output."""
        result = steps.run_embeddings(ragpipe.workspace, context.partition_key, spec)
        yield Output(None, data_version=DataVersion(result.data_version), metadata=stage_metadata(result, None))

    shard_ops = [_shard_op(spec, i, shards) for i in range(shards)]

    @graph_asset(name="embeddings", ins={"representations": AssetIn(dagster_type=Nothing)}, **args)
    def embeddings(representations):
        """Vectors for representations through the shared (embedder spec, text digest) cache, in shards."""
        return assemble(**{name: shard(representations) for name, shard in zip(names, shard_ops, strict=True)})

    return embeddings
