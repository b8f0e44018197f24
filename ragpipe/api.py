"""The Python API in one import: ``from ragpipe.api import Retriever, Subject, answer``.

``Retriever`` queries any verified bundle, ``answer`` answers over a retriever, and
``retriever_for_release`` opens the retriever a *release* serves. That constructor lives here,
above both layers it joins, because the retrieval layer must not read the release store: it
answers over whatever bundle it is given; which bundle and plan a target serves is release policy
(``ragpipe.release.serving``).

``Retriever``, ``answer`` and ``make_generator`` are imported on first use (PEP 562): they import
the retrieval stack, which ``retriever_for_release`` needs only after verifying the release.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragpipe.kernel.workspace import Workspace, default_home
from ragpipe.retrieval.authz import Subject
from ragpipe.spec import EmbedderSpec

if TYPE_CHECKING:
    from ragpipe.answer.answering import answer, make_generator
    from ragpipe.embedding.onnx_query import OnnxEncoder
    from ragpipe.release.serving import ServedRelease
    from ragpipe.retrieval.retriever import Retriever

__all__ = ["Retriever", "Subject", "answer", "make_generator", "retriever_for_release"]

RETRIEVER_THREADS = 2  # the Retriever's default ``threads``: an early-loaded encoder uses what it would


def __getattr__(name: str):
    if name == "Retriever":
        from ragpipe.retrieval.retriever import Retriever

        return Retriever
    if name in ("answer", "make_generator"):
        from ragpipe.answer import answering

        return getattr(answering, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def retriever_for_release(
    target: str | None = None, *, release_id: str | None = None, home: Path | None = None, **options
) -> Retriever:
    """A retriever over a release: the active release of ``target`` (the configured default
    target when None), or ``release_id`` (the ID or a unique prefix of at least 12 hex digits:
    ``ragpipe.release.manifest.resolve_release_id``); its bundle fully verified against the
    release manifest and its query plan the one the release was gated with
    (``ragpipe.release.serving``), verified once and handed over opened; ``release_id`` set on
    the retriever. ``home`` defaults to ``$RAGPIPE_HOME``; ``options`` are the constructor's
    operational options (``query_graph_dir`` defaults to that home's cache).

    When the bundle's query graph is cached, it is loaded (every check of
    ``ragpipe.embedding.query_graph.load_entry``) on a worker thread *while* the release is
    verified, and handed to the retriever if the verified bundle and plan call for exactly that
    embedder with the onnxruntime runtime; a refused entry then raises here (``QueryGraphError``),
    while an entry whose manifest is not trusted is left to the retriever, which rebuilds it.
    Raises ``ragpipe.release.store.ReleaseError`` when nothing is active or the release does not
    verify."""
    ws = Workspace(Path(home) if home else default_home())
    if release_id is not None:  # a unique prefix of 12+ hex digits names the release too
        from ragpipe.release.manifest import resolve_release_id
        from ragpipe.release.store import ReleaseStore

        release_id = resolve_release_id(ReleaseStore(ws), release_id)
    options.setdefault("query_graph_dir", ws.query_graphs)
    early = None
    if "embedder" not in options:
        early = _start_early_load(ws, target, release_id, Path(options["query_graph_dir"]), options)
    # Imported after the graph started loading: verifying the release needs the release and
    # bundle layers (~0.15 s of imports), which the loading thread overlaps.
    from ragpipe.release.serving import served_release

    served = served_release(ws, target, release_id)
    if early is not None and early.serves(served):
        from ragpipe.embedding.query_graph import UntrustedManifest

        try:
            options["embedder"] = early.loading.result()
        except UntrustedManifest:
            pass  # the Retriever's query_encoder says why, once, and rebuilds the entry
    from ragpipe.retrieval.retriever import Retriever

    retriever = Retriever(served.bundle, plan=served.plan, **options)
    retriever.release_id = served.release_id
    return retriever


@dataclass(frozen=True)
class _EarlyLoad:
    """The query graph of ``spec`` loading on a worker thread, started before the release that
    names it was verified."""

    spec: EmbedderSpec
    loading: Future[OnnxEncoder]

    def serves(self, served: ServedRelease) -> bool:
        """Whether the *verified* release embeds queries with exactly this encoder."""
        plan, semantic = served.plan, served.bundle.manifest.semantic
        return (
            plan.query_embedding.runtime == "onnxruntime"
            and "vector" in plan.channels
            and semantic.has_vector_index
            and EmbedderSpec.model_validate(semantic.specs["embeddings"].spec) == self.spec
        )


def _start_early_load(
    ws: Workspace, target: str | None, release_id: str | None, root: Path, options: dict
) -> _EarlyLoad | None:
    """Start loading the query graph of the embedder the release's bundle names, read *without*
    verification — verifying the release takes ~0.9 s (most of it the bundle's payload checks and
    importing lancedb), loading the graph ~0.4 s, mostly outside the GIL (reading, hashing,
    running the probes), so the two overlap. Safe because the entry verifies itself against the
    spec it is loaded for, and ``_EarlyLoad.serves`` hands it over only if the verified bundle
    names that same spec. None when nothing is to be loaded: no such entry (creating one is the
    Retriever's slow path), or anything unreadable, which ``served_release`` then reports."""
    from ragpipe.bundle.manifest import BundleManifest
    from ragpipe.embedding.query_graph import entry_dir, load_entry
    from ragpipe.release.activation import bundle_path
    from ragpipe.release.manifest import load_manifest
    from ragpipe.release.pointer import read_pointer
    from ragpipe.release.store import ReleaseStore
    from ragpipe.release.targets import load_targets

    try:
        store = ReleaseStore(ws)
        if release_id is None:
            pointer = read_pointer(store, load_targets().get(target)[0])
            if pointer is None:
                return None
            release_id = pointer.release_id
        bundle = bundle_path(ws, load_manifest(store, release_id))
        semantic = BundleManifest.model_validate_json((bundle / "manifest.json").read_bytes()).semantic
        if not semantic.has_vector_index:
            return None
        spec = EmbedderSpec.model_validate(semantic.specs["embeddings"].spec)
    except Exception:  # a hint only: served_release verifies all of it and names what is wrong
        return None
    if not entry_dir(root, spec).is_dir():
        return None
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ragpipe-query-graph")
    try:
        return _EarlyLoad(spec, worker.submit(load_entry, root, spec, options.get("threads", RETRIEVER_THREADS)))
    finally:
        worker.shutdown(wait=False)  # its one thread ends with its one task
