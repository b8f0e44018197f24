"""The Dagster layer: with ``orchestration/`` the only packages that import dagster."""

from dagster import Definitions

from ragpipe.defs.activation import activate_release_job, activation_sensor_def
from ragpipe.defs.assets import build_assets
from ragpipe.defs.checks import build_checks
from ragpipe.defs.executors import executor_from
from ragpipe.defs.jobs import build_revision_job
from ragpipe.defs.release_chain import build_chain_checks
from ragpipe.defs.resources import RagpipeHome
from ragpipe.defs.schedules import nightly_rebuild
from ragpipe.defs.sensors import corpus_revision_sensor
from ragpipe.kernel.settings import Settings, current_settings
from ragpipe.release.targets import TargetsConfig
from ragpipe.spec import PipelineSpec
from ragpipe.stages.configuration import ConfigurationError, check_configuration

__all__ = ["ConfigurationError", "build_definitions"]


def build_definitions(
    spec: PipelineSpec | None = None, home: str = "", settings: Settings | None = None
) -> Definitions:
    """Definitions for ``spec`` (default: the checked-in pipeline spec or ``$RAGPIPE_PIPELINE_SPEC``).

    ``settings`` (default: read from the environment once, here) are the ``RAGPIPE_*`` variables
    (``ragpipe.kernel.settings``): they choose the executor and are what the configuration
    check reads.
    ``home`` empty means ``$RAGPIPE_HOME`` at run time: that is what the code location loads, and
    ``ragpipe build`` runs that location. The executor ``RAGPIPE_EXECUTOR`` names (default: in
    process) runs every job, including the implicit asset job that UI materializations and
    backfills use (``executors``).
    With an ``evaluation:`` section the graph continues after ``index_bundle`` with the evaluation →
    gate → release chain, and ``build_revision`` selects it too. ``activation_sensor``'s default
    status comes from the targets config (``$RAGPIPE_TARGETS``) read here.

    Without ``spec`` the whole configuration is checked first (``ragpipe.stages.configuration``:
    the spec, the suite, query plan and gate policy it names, the targets file): a problem raises
    ``ConfigurationError``, whose message is one line naming the file, the field and the rule,
    before anything is defined (``definitions.py`` says how Dagster then reports it).
    """
    targets: TargetsConfig | None = None
    if spec is None:
        checked = check_configuration(settings=settings)
        spec, targets, settings = checked.spec, checked.targets, checked.settings
    settings = settings or current_settings()
    chain_checks = build_chain_checks() if spec.evaluation is not None else []
    return Definitions(
        assets=build_assets(spec),
        asset_checks=[*build_checks(), *chain_checks],
        jobs=[build_revision_job(spec, settings), activate_release_job],
        sensors=[corpus_revision_sensor, activation_sensor_def(targets)],
        schedules=[nightly_rebuild],
        resources={"ragpipe": RagpipeHome(home=home)},
        executor=executor_from(settings),
    )
