"""Dagster entry point: the ragpipe asset graph on the pipeline spec.

``workspace.yaml`` loads this file as the code location ``ragpipe``; the webserver, the daemon and
``ragpipe build`` (which loads the same location in process) all get their definitions here, so a
CLI build is a run of the very job the UI shows. ``$RAGPIPE_HOME`` and ``$RAGPIPE_PIPELINE_SPEC``
are read from the environment of whichever process loads it.
"""

from ragpipe.defs import build_definitions

defs = build_definitions()
