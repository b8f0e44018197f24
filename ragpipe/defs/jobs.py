"""Jobs.

``build_revision`` materializes one corpus revision: the build group (snapshot → bundle) and, when
the pipeline spec has an ``evaluation:`` section, the chain after it (evaluation → gate → release
manifest). It is built per spec (``build_revision_job(spec)``) so its owners are the spec's and its
selection follows the spec; its partitions are those of the assets it selects (``corpus_revisions``).

By default every run of it executes in one process (``in_process_executor``): the steps form a
chain (only the lexical and vector indexes could overlap), and one process imports torch and loads
the embedding model once per run instead of once per step. ``RAGPIPE_EXECUTOR=celery`` runs each
step as a Celery task instead (``executors``). The same executor is the ``Definitions`` default,
so the UI's ``__ASSET_JOB`` runs and asset backfills use it too.
"""

import warnings

from dagster import AssetSelection, BetaWarning, define_asset_job

from ragpipe.defs.assets import GROUP as BUILD_GROUP
from ragpipe.defs.executors import executor_from
from ragpipe.defs.release_chain import GROUP as CHAIN_GROUP
from ragpipe.kernel.settings import Settings, current_settings
from ragpipe.spec import PipelineSpec

BUILD_JOB = "build_revision"

# Job owners (from the spec's dagster section) are a beta parameter: Dagster warns each time it
# builds the job or re-targets a sensor/schedule at it, once per process that loads the
# definitions. Used deliberately on a pinned, tested Dagster; narrow by message and category.
warnings.filterwarnings(
    "ignore",
    message=r"Parameter `owners` of (initializer `(JobDefinition|SensorDefinition|ScheduleDefinition)\.__init__`|function `GraphDefinition\.to_job`)",
    category=BetaWarning,
)


def build_revision_job(
    spec: PipelineSpec, settings: Settings | None = None
):  # -> the unresolved asset job define_asset_job returns (no public type)
    chain = spec.evaluation is not None
    selection = AssetSelection.groups(BUILD_GROUP, CHAIN_GROUP) if chain else AssetSelection.groups(BUILD_GROUP)
    what = "snapshot → bundle → evaluation → gate → release manifest" if chain else "snapshot → bundle"
    return define_asset_job(
        BUILD_JOB,
        selection=selection,
        executor_def=executor_from(settings or current_settings()),
        owners=list(spec.dagster.owners),
        description=(
            f"Materialize the whole graph ({what}) for one corpus revision "
            "(in one process unless RAGPIPE_EXECUTOR says otherwise). "
            "`ragpipe build`, the sensors, the nightly schedule and the UI all launch this job."
        ),
    )
