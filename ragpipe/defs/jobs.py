"""Jobs."""

from dagster import AssetSelection, define_asset_job

from ragpipe.defs.partitions import corpus_revisions

build_revision_job = define_asset_job(
    "build_revision",
    selection=AssetSelection.groups("build"),
    partitions_def=corpus_revisions,
    description="Materialize the whole build graph (snapshot → bundle) for one corpus revision.",
)
