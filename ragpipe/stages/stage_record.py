"""A stage output's record: what ``stage.json`` in a version folder and each ``latest.json``
pointer hold, and the name of a data version's folder (``ragpipe.stages.stage_store``)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

POINTER = "latest.json"
STAGE_RECORD = "stage.json"
_VERSION = re.compile(r"^sha256:([0-9a-f]{64})$")


class StageError(RuntimeError):
    pass


class StageRecord(BaseModel):
    """One materialization of one stage for one revision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stage: str
    revision: str
    spec_id: str
    data_version: str
    inputs: dict[str, str] = {}  # upstream stage -> data version read
    facts: dict[str, str | int | float | bool | None] = {}


def version_name(data_version: str) -> str:
    """The folder name of a data version (``sha256:<hex>`` -> ``<hex>``)."""
    match = _VERSION.match(data_version)
    if match is None:
        raise StageError(f"data version {data_version!r} is not a sha256 content ID")
    return match.group(1)
