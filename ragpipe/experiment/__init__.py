"""The experiment envelope: exact pairing of two evaluation runs, their paired comparison, the
ordered gate policy and the gate decision (docs/gates.md).

It knows nothing about how a query is answered: its input is ``ArmRun`` (one evaluation run's
identities, comparison coordinates and per-cell outcomes), built from a run folder by
``arm_source`` or directly by a caller. Pure Python (pydantic, numpy, scipy); no Dagster.
"""
