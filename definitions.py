"""Dagster entry point: the ragpipe asset graph on the pipeline spec.

``workspace.yaml`` loads this file as the code location ``ragpipe``; the webserver, the daemon and
``ragpipe build`` (which loads the same location in process) all get their definitions here, so a
CLI build is a run of the very job the UI shows. ``$RAGPIPE_HOME`` and ``$RAGPIPE_PIPELINE_SPEC``
are read from the environment of whichever process loads it.

A configuration error (``ragpipe.stages.configuration``: spec, suite, query plan, gate policy,
targets) is one line naming the file, the field and the rule, and is reported without a Python
traceback where Dagster allows it:

- ``dagster definitions validate`` (which sets ``DAGSTER_IS_DEFS_VALIDATION_CLI=1`` for code to
  know it is validating): the line is printed on stderr and the process exits with status 1, as
  Dagster would print any exception with its stack trace;
- anywhere else (a code server of ``dagster dev``, the webserver or the daemon; ``ragpipe build``
  in process) the ``ConfigurationError`` is raised again with its traceback cut to this file, so
  the location shows the line as its load error (Dagster adds the one frame of this file), and
  ``ragpipe build`` turns it back into its one-line ``error:`` (``ragpipe.orchestration.launch``).
"""

import os

from ragpipe.defs import ConfigurationError, build_definitions

try:
    defs = build_definitions()
except ConfigurationError as exc:
    if os.environ.get("DAGSTER_IS_DEFS_VALIDATION_CLI") == "1":
        raise SystemExit(str(exc)) from None
    raise exc.with_traceback(None) from None  # the message is the whole error: file, field, rule
