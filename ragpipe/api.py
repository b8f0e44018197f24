"""The Python API in one import: ``from ragpipe.api import Retriever, Subject, answer``.

``Retriever`` queries any verified bundle, ``answer`` answers over a retriever, and
``retriever_for_release`` opens the retriever a *release* serves. That constructor lives here,
above both layers it joins, because the retrieval layer must not read the release store: it
answers over whatever bundle it is given; which bundle and plan a target serves is release policy
(``ragpipe.release.serving``).
"""

from __future__ import annotations

from pathlib import Path

from ragpipe.answer.answering import answer, make_generator
from ragpipe.kernel.workspace import Workspace, default_home
from ragpipe.release.serving import served_release
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import Retriever

__all__ = ["Retriever", "Subject", "answer", "make_generator", "retriever_for_release"]


def retriever_for_release(
    target: str | None = None, *, release_id: str | None = None, home: Path | None = None, **options
) -> Retriever:
    """A retriever over a release: the active release of ``target`` (the configured default
    target when None), or the exact ``release_id``; its bundle fully verified against the
    release manifest and its query plan the one the release was gated with
    (``ragpipe.release.serving``), verified once and handed over opened; ``release_id`` set on
    the retriever. ``home`` defaults to
    ``$RAGPIPE_HOME``; ``options`` are the constructor's operational options. Raises
    ``ragpipe.release.store.ReleaseError`` when nothing is active or the release does not verify."""
    served = served_release(Workspace(Path(home) if home else default_home()), target, release_id)
    retriever = Retriever(served.bundle, plan=served.plan, **options)
    retriever.release_id = served.release_id
    return retriever
