"""Garbage-collection roots from releases: every bundle an active or previously active release pins.

``release_roots(ws)`` is what the lead passes as ``extra_roots`` to
``ragpipe.gc.collect_garbage``: the bundle IDs of every release that is active, was ever
active, or is being activated (open intent) on any target with a history in the store. A bundle is
self-contained, so the stage versions that built it need not stay (gc.py). Fails closed: a damaged
history or a missing manifest raises, so collection never runs on a partial root set.
"""

from __future__ import annotations

from ragpipe.kernel.workspace import Workspace
from ragpipe.release.history import read_history
from ragpipe.release.manifest import load_manifest
from ragpipe.release.pointer import read_pointer
from ragpipe.release.store import ReleaseStore


def pinned_releases(ws: Workspace) -> frozenset[str]:
    """Release IDs that are, were, or are becoming active on any target."""
    store = ReleaseStore(ws)
    found: set[str] = set()
    for target in store.known_targets():
        state, _ = read_history(store, target)
        found.update(state.ever_active)
        if state.open_intent is not None:
            found.add(state.open_intent.payload["release_id"])
        pointer = read_pointer(store, target)
        if pointer is not None:
            found.add(pointer.release_id)
    return frozenset(found)


def release_roots(ws: Workspace) -> frozenset[str]:
    """Bundle IDs (``sha256:<hex>``) to keep: those of ``pinned_releases``."""
    store = ReleaseStore(ws)
    return frozenset(load_manifest(store, rid).bundle_id for rid in pinned_releases(ws))
