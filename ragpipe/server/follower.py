"""Follow a target's pointer: open, verify and warm each newly active release, then swap it in atomically.

The follower reads the target's ``pointer.json`` (and the size and time of its history) every
``poll_interval`` seconds. When either changes it checks the release the pointer names exactly as
activation did (``ragpipe.release.serving.active_release``: pointer and history agreeing, eligible
under a policy the target accepts, bundle and evaluation evidence verifying), takes a lease on its
bundle (``ragpipe.kernel.leases``: garbage collection keeps it), builds a ``Retriever`` over the
verified bundle and the gated plan, runs each channel's first query (so the first caller does not
pay for loading the query graph or the vector table), and only then replaces the one reference
requests read.

A request takes that reference once (``acquire``) and gives it back when it has answered
(``release``): every channel, the hydration and the ``release_id`` of one response come from one
release. A replaced release is closed when its last request has given it back. A release that fails
any check is never swapped in: the last good one keeps serving and ``status()`` carries the
refusal and its reason; rollback is the same path (the pointer moves back).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ragpipe.kernel.leases import BundleLease
from ragpipe.kernel.workspace import Workspace
from ragpipe.release.serving import ServedRelease, active_release
from ragpipe.release.store import ReleaseError, ReleaseStore
from ragpipe.release.target_sync import target_key
from ragpipe.release.targets import load_targets
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.retriever import MODES, Retriever
from ragpipe.storage.location import store_from_env
from ragpipe.storage.objects import StorageError

log = logging.getLogger("ragpipe.server")
WARM_QUERY = "warm up the query path"
RECHECK_S = 30.0  # a failed look is retried after poll_interval * 2**failures seconds, at most this


class NotReady(RuntimeError):
    """Nothing is being served yet; the message says why."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class InService:
    """One release being served: what requests read, and how many of them are using it."""

    served: ServedRelease
    retriever: Retriever
    lease: BundleLease
    serving_since: str  # when this server swapped it in
    users: int = 0
    retired: bool = False
    closed: bool = False
    generators: dict[str, object] = field(default_factory=dict)  # answer generators, built on first use

    @property
    def release_id(self) -> str:
        return self.served.release_id

    def describe(self) -> dict[str, object]:
        s = self.served
        return {
            "release_id": s.release_id,
            "target": s.target,
            "generation": s.generation,
            "active_since": s.since,
            "serving_since": self.serving_since,
            "revision": s.manifest.revision,
            "bundle_id": s.bundle.bundle_id,
            "plan_id": s.plan.plan_id,
            # which engine serves the vectors here and why ("lancedb: …" where this host's lance
            # kernels are not the in-memory engine's): an operator sees it without the log
            "vector_engine": engine.as_dict() if (engine := self.retriever.vector_engine) else None,
        }

    def close(self) -> None:
        """Close the retriever and give up the lease (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.retriever.close()
        finally:
            self.lease.release()


@dataclass(frozen=True)
class Refusal:
    release_id: str | None
    generation: int | None
    reason: str
    at: str

    def as_dict(self) -> dict[str, object]:
        return {"release_id": self.release_id, "generation": self.generation, "reason": self.reason, "at": self.at}


def warm(retriever: Retriever) -> None:
    """One query per mode the bundle supports: loads the query graph and opens the vector table."""
    modes = [m for m in MODES if retriever.vector is not None or m == "lexical"]
    for mode in modes:
        retriever.query(WARM_QUERY, Subject.default(), k=1, mode=mode)


class ReleaseFollower:
    """See the module docstring. ``on_swap(in_service)`` / ``on_refusal(refusal)`` are told each
    event (metrics); ``retriever_options`` are the ``Retriever``'s operational options."""

    def __init__(
        self,
        ws: Workspace,
        target: str | None,
        poll_interval: float = 0.5,
        targets_path: Path | None = None,
        retriever_options: dict[str, object] | None = None,
        on_swap: Callable[[InService], None] | None = None,
        on_refusal: Callable[[Refusal], None] | None = None,
    ):
        self.ws = ws
        self.targets_path = targets_path
        self.target, _ = load_targets(targets_path).get(target)  # an unknown target fails here, clearly
        self.poll_interval = poll_interval
        self.retriever_options = retriever_options or {}
        self.on_swap = on_swap or (lambda _: None)
        self.on_refusal = on_refusal or (lambda _: None)
        self._lock = threading.Lock()
        self._current: InService | None = None
        self._refusal: Refusal | None = None
        self._seen: tuple[bytes | None, tuple[int, int] | None] | None = None
        self._failures = 0  # consecutive failed looks: the next re-check backs off to RECHECK_S
        self._recheck_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.swaps = 0
        self.refused = 0

    # -- what requests use ------------------------------------------------------------------

    def acquire(self) -> InService:
        """The release to answer one request from; ``NotReady`` when none is being served."""
        with self._lock:
            current = self._current
            if current is None:
                raise NotReady(self._refusal.reason if self._refusal else f"target {self.target!r}: starting")
            current.users += 1
            return current

    def release(self, in_service: InService) -> None:
        with self._lock:
            in_service.users -= 1
            done = in_service.retired and in_service.users == 0
        if done:
            in_service.close()

    @property
    def current_release_id(self) -> str | None:
        """The release being served (one attribute read: cheap enough for every response header)."""
        current = self._current
        return current.release_id if current is not None else None

    def status(self) -> dict[str, object]:
        with self._lock:
            current, refusal = self._current, self._refusal
            return {
                "ready": current is not None,
                "target": self.target,
                "release": current.describe() if current else None,
                "refusal": refusal.as_dict() if refusal else None,
                "swaps": self.swaps,
                "refused_swaps": self.refused,
            }

    # -- following the pointer --------------------------------------------------------------

    def _observed(self) -> tuple[bytes | str | None, tuple[int, int] | None]:
        store = ReleaseStore(self.ws)
        remote = store_from_env()
        if remote is not None:  # the store's target object is the record: its ETag changes with it
            try:
                return remote.version(target_key(self.target)), None  # a HEAD on S3: no body each poll
            except StorageError as exc:
                return f"unreadable: {exc}", None
        try:
            pointer = store.pointer_path(self.target).read_bytes()
        except FileNotFoundError:
            pointer = None
        try:
            st = store.history_path(self.target).stat()
            history = (st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            history = None
        return pointer, history

    def poll(self) -> None:
        """Look once; load what the pointer names when the pointer or history changed, or when the
        last look failed and its re-check is due (a refusal can be cured by files other than these
        two: a restored evaluation folder, a repaired bundle, a lease that could not be taken)."""
        seen = self._observed()
        if seen == self._seen and (self._failures == 0 or time.monotonic() < self._recheck_at):
            return
        self._seen = seen
        self._load()

    def _load(self) -> None:
        try:
            served = active_release(
                self.ws, self.target, config=load_targets(self.targets_path), defer_vector_table=True
            )
        except (ReleaseError, OSError) as exc:
            self._refuse(None, None, str(exc))
            return
        current = self._current
        if current is not None and (current.release_id, current.served.generation) == (
            served.release_id,
            served.generation,
        ):
            with self._lock:
                self._refusal, self._failures = None, 0  # the served release checks again (history only grew)
            return
        lease = None
        try:
            lease = BundleLease(self.ws, served.bundle.bundle_id)
            retriever = Retriever(served.bundle, plan=served.plan, **self.retriever_options)  # type: ignore[arg-type]
            try:
                warm(retriever)
            except Exception:
                retriever.close()
                raise
        except Exception as exc:  # a release that cannot answer a query is refused like one that does not verify
            if lease is not None:
                lease.release()
            self._refuse(served.release_id, served.generation, f"release {served.release_id} cannot serve: {exc}")
            return
        retriever.release_id = served.release_id
        self._swap(InService(served, retriever, lease, _now()))

    def _swap(self, new: InService) -> None:
        with self._lock:
            if self._stop.is_set():  # stopped while this release was being opened: never install it
                old, close_old, stopped = None, False, True
            else:
                old, self._current, stopped = self._current, new, False
                self._refusal, self._failures = None, 0
                self.swaps += 1
                close_old = False
                if old is not None:
                    old.retired = True
                    close_old = old.users == 0
        if stopped:
            new.close()
            return
        log.info("serving release %s (generation %s)", new.release_id, new.served.generation)
        self.on_swap(new)
        if close_old and old is not None:
            old.close()

    def _refuse(self, release_id: str | None, generation: int | None, reason: str) -> None:
        """Record a refusal; counted (and told) once per distinct reason, however often it is re-checked."""
        refusal = Refusal(release_id, generation, reason, _now())
        with self._lock:
            new = self._refusal is None or self._refusal.reason != reason
            if new:
                self._refusal = refusal
                self.refused += 1
            self._failures += 1
            self._recheck_at = time.monotonic() + min(RECHECK_S, self.poll_interval * 2**self._failures)
        if new:
            log.warning("not serving: %s", reason)
            self.on_refusal(refusal)

    def start(self) -> None:
        """Follow in the background: the first look happens at once, so ``/healthz`` answers while
        the first release is still being verified (``/readyz`` says ``starting`` until then)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ragpipe-release-follower", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.poll()
            except Exception as exc:  # never let the follower die: report and look again next time
                self._refuse(None, None, f"following target {self.target!r} failed: {type(exc).__name__}: {exc}")
            if self._stop.wait(self.poll_interval):
                return

    def stop(self) -> None:
        """Stop following and close the served release once its in-flight requests are done (a
        release still being opened is closed instead of installed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        with self._lock:
            current, self._current = self._current, None
            close_now = current is not None and current.users == 0
            if current is not None:
                current.retired = True
        if close_now and current is not None:
            current.close()
