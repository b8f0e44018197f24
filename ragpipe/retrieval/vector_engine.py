"""Which engine serves a bundle's vectors — the in-memory one or lancedb — and why, in words.

``ragpipe.index.vector_memory`` chooses per bundle and host (``auto``): from memory when the
vectors fit its limit and this host's lancedb computes the same distances, else lancedb. Which
engine serves is operational (the same hits either way where the calibration passes) and in no
ID; what a user needs is to *see* it, so the choice travels with a sentence saying why
(``VectorEngine``): in the build summary, ``ragpipe bundle inspect`` and the server's ``/readyz``.

``RAGPIPE_VECTOR_ENGINE`` overrides the choice for every retriever of a process that is not given
one explicitly: ``auto`` (the default), ``lancedb`` (never from memory — what a host whose lance
kernels the in-memory engine does not reproduce does anyway, so a host that has them can run the
other hosts' path: ``make test-lancedb-engine``), or ``memory`` (from memory without comparing with
lancedb). Any other value is refused in one line naming the variable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ragpipe.bundle.verify import VerifiedBundle
from ragpipe.index.engine_calibration import CalibrationRecords
from ragpipe.index.rows import IndexRow
from ragpipe.index.vector_memory import DEFAULT_MEMORY_LIMIT_BYTES, ENGINES, open_vector_searcher

ENGINE_VARIABLE = "RAGPIPE_VECTOR_ENGINE"


class VectorEngineSettingError(ValueError):
    """``RAGPIPE_VECTOR_ENGINE`` names no engine (the message says which values it takes)."""


@dataclass(frozen=True)
class VectorEngine:
    """The engine serving a bundle's vectors (``memory`` or ``lancedb``) and one line saying why."""

    engine: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"engine": self.engine, "why": self.why}


def vector_engine_setting(environ: Mapping[str, str] | None = None) -> str:
    """The engine ``RAGPIPE_VECTOR_ENGINE`` asks for (``auto`` when unset or empty);
    ``VectorEngineSettingError`` for any value but those of ``ENGINES``."""
    value = (os.environ if environ is None else environ).get(ENGINE_VARIABLE, "").strip()
    if not value:
        return "auto"
    if value not in ENGINES:
        raise VectorEngineSettingError(
            f"{ENGINE_VARIABLE}={value!r} is not a vector engine (set it to one of {', '.join(ENGINES)}, or unset it)"
        )
    return value


def open_bundle_vectors(
    bundle: VerifiedBundle,
    rows: Sequence[IndexRow],
    *,
    engine: str | None = None,
    memory_limit_bytes: int = DEFAULT_MEMORY_LIMIT_BYTES,
    calibrations: CalibrationRecords | None = None,
    before_lance: Callable[[], None] | None = None,
):
    """The vector searcher of ``bundle`` (None when it has no vector index) over its index
    ``rows``; ``engine`` None: the setting of ``RAGPIPE_VECTOR_ENGINE``. The searcher's ``engine``
    and ``why`` say which engine serves and why."""
    sem = bundle.manifest.semantic
    if not sem.has_vector_index:
        return None
    dimensions = int(sem.specs["embeddings"].spec["dimensions"])
    fits = len(rows) * dimensions * 4 <= memory_limit_bytes
    return open_vector_searcher(
        bundle.path / "vector",
        sem.specs["vector_index"].spec["metric"],
        [(r.representation_id, r.chunk_id, r.document_id) for r in rows],
        row_scopes=[r.access_scopes for r in rows],
        row_roles=[r.source_role for r in rows],
        embeddings_digest=bundle.manifest.material.embeddings_digest,
        # parsed only for a matrix the memory engine may serve (lancedb serves larger ones)
        vectors=bundle.tables.vectors if fits else None,
        memory_limit_bytes=memory_limit_bytes,
        calibrations=calibrations,
        table_digest=bundle.manifest.material_digest,
        before_lance=before_lance,
        engine=vector_engine_setting() if engine is None else engine,
    )


def engine_of(searcher) -> VectorEngine | None:
    """The ``VectorEngine`` of a searcher ``open_bundle_vectors`` returned (None for None)."""
    return None if searcher is None else VectorEngine(searcher.engine, searcher.why)


def bundle_vector_engine(bundle: VerifiedBundle, calibration_dir: Path) -> VectorEngine | None:
    """Which engine would serve ``bundle`` on this host under the current setting, and why
    (calibrating, and recording the outcome in ``calibration_dir``, if no record says so yet)."""
    from ragpipe.bundle.verify import check_vector_table
    from ragpipe.index.rows import index_rows

    rows = index_rows(bundle.tables.documents, bundle.tables.representations)
    searcher = open_bundle_vectors(
        bundle,
        rows,
        calibrations=CalibrationRecords(calibration_dir),
        before_lance=lambda: check_vector_table(bundle),
    )
    try:
        return engine_of(searcher)
    finally:
        if searcher is not None:
            searcher.close()
