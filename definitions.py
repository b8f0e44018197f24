"""Dagster entry point (loaded by workspace.yaml): the ragpipe asset graph on the pipeline spec."""

from ragpipe.defs import build_definitions

defs = build_definitions()
