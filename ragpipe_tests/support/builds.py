"""Building a corpus through every stage as plain functions (no Dagster)."""

from __future__ import annotations

from pathlib import Path


def build_all_stages(
    home: Path, revision: str, corpus: Path, fmt: str, default_scope: str | None = "public", spec=None
):
    """Register ``corpus`` and run every stage (plain functions, no Dagster); returns (ws, spec, bundle path)."""
    from ragpipe.corpus.registry import register_revision
    from ragpipe.kernel.workspace import Workspace
    from ragpipe.spec import load_pipeline_spec
    from ragpipe.stages import steps

    ws = Workspace(home)
    spec = spec or load_pipeline_spec()
    register_revision(ws.registry, revision, corpus, fmt, default_scope)
    for run in steps.BUILD_STEPS:
        run(ws, revision, spec)
    return ws, spec, ws.located(str(steps.read_stage_record(ws, revision, "index_bundle").facts["bundle_path"]))
