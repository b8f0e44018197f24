"""The Dagster layer: the only package that imports dagster."""


from dagster import Definitions, in_process_executor

from ragpipe.defs.assets import build_assets
from ragpipe.defs.checks import build_checks
from ragpipe.defs.jobs import build_revision_job
from ragpipe.defs.resources import RagpipeHome
from ragpipe.defs.sensors import corpus_revision_sensor
from ragpipe.pipeline_spec import PipelineSpec, load_pipeline_spec


def build_definitions(spec: PipelineSpec | None = None, home: str = "") -> Definitions:
    """Definitions for ``spec`` (default: the checked-in pipeline spec or ``$RAGPIPE_PIPELINE_SPEC``).

    ``home`` empty means ``$RAGPIPE_HOME`` at run time: that is what the code location loads, and
    ``ragpipe build`` runs that location. The in-process executor is the default for every job,
    including the implicit asset job that UI materializations and backfills use (see ``jobs``).
    """
    spec = spec or load_pipeline_spec()
    return Definitions(
        assets=build_assets(spec),
        asset_checks=build_checks(),
        jobs=[build_revision_job],
        sensors=[corpus_revision_sensor],
        resources={"ragpipe": RagpipeHome(home=home)},
        executor=in_process_executor,
    )
