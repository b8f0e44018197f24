"""Jobs.

Every run of the build graph executes in one process (``in_process_executor``): the steps form a
chain (only the lexical and vector indexes could overlap), and one process imports torch and loads
the embedding model once per run instead of once per step. The same executor is the
``Definitions`` default, so the UI's ``__ASSET_JOB`` runs and asset backfills use it too.
"""

from dagster import AssetSelection, define_asset_job, in_process_executor

from ragpipe.defs.partitions import corpus_revisions

build_revision_job = define_asset_job(
    "build_revision",
    selection=AssetSelection.groups("build"),
    partitions_def=corpus_revisions,
    executor_def=in_process_executor,
    description=(
        "Materialize the whole build graph (snapshot → bundle) for one corpus revision, in one process. "
        "`ragpipe build`, the sensor and the UI all launch this job."
    ),
)
