"""Where ragpipe keeps runtime state: one folder, ``$RAGPIPE_HOME`` (default ``./var/ragpipe``).

```
revisions/<key>.json                 registered corpus revisions (immutable)
sources/<digest hex>/                corpus sources downloaded from the object store (RAGPIPE_STORE), a cache
work/<key>/<stage>/<version hex>/    one immutable folder per distinct output of a stage for a
                                     revision, named by its data version; never replaced
work/<key>/<stage>/latest.json       the revision's latest materialization of the stage: which
                                     version folder, under which spec (replaced atomically)
embedding_cache/<spec hex>/          embedding cache shards, shared by all revisions
generation_cache/<kind>/             generated representations: one verified entry per request
                                     (ragpipe.work.entries), shared by all revisions
query_graphs/<key hex>/              exported query-side ONNX graphs, one per embedder (sealed
                                     manifest, verified on every load; ragpipe.embedding.query_graph)
bundles/<bundle id hex>/             published, immutable index bundles
verified/<target>.json               the live release's full verification, remembered per target
                                     generation (sealed; ragpipe.release.verified_record)
verified/home.key                    the home's own sealing key (0600), for the two records above
                                     when no key is configured (ragpipe.kernel.seals)
locks/                               flock files (workspace.lock, build-<key>.lock)
evaluations/<run id>/                evaluation runs: the chain's and ``ragpipe eval``'s
releases/                            manifests, kept decisions, target pointers and histories
datasets/<name>/                     datasets people adjudicate (ledger, versions)
serve_traces/<target>/<release hex>/ served answers' trace logs
leases/                              bundles a running server holds
tune/<run id>/                       ``ragpipe tune``'s default output
answer_cache/, draft_cache/          generated answers and drafted cases, one verified entry per request
lab/pairwise.jsonl                   the lab's pairwise review choices (a ledger)
```

Every folder above is a property of ``Workspace``; no other module builds a path under the home
from a folder name (``ragpipe_tests/test_boundaries.py``). Homes made before evaluation runs had
one folder kept ``ragpipe eval``'s runs in ``eval_runs/``: move them with
``mv $RAGPIPE_HOME/eval_runs/* $RAGPIPE_HOME/evaluations/`` (run IDs are unique UUIDv7s).

Stage outputs and bundles accumulate until ``ragpipe.gc.collect_garbage`` removes those no
``latest.json`` references (see ``docs/operations.md``); query graphs are a cache that garbage
collection leaves alone: remove ``query_graphs/`` (or one entry) at any time, the next query
re-creates what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragpipe.kernel.settings import Settings, current_settings

DEFAULT_HOME = Path("var") / "ragpipe"


def default_home(settings: Settings | None = None) -> Path:
    """The home ``settings`` name (``RAGPIPE_HOME``, default ``./var/ragpipe``), absolute; without
    settings, this process's ``current_settings()``."""
    return (settings or current_settings()).home.resolve()


@dataclass(frozen=True)
class Workspace:
    home: Path

    @classmethod
    def of(cls, settings: Settings) -> Workspace:
        """The workspace at ``settings.home`` (resolved against the working directory)."""
        return cls(default_home(settings))

    @property
    def registry(self) -> Path:
        return self.home / "revisions"

    @property
    def sources(self) -> Path:
        """Corpus sources downloaded from the object store (a cache keyed by source digest)."""
        return self.home / "sources"

    @property
    def embedding_cache(self) -> Path:
        return self.home / "embedding_cache"

    @property
    def generation_cache(self) -> Path:
        return self.home / "generation_cache"

    @property
    def query_graphs(self) -> Path:
        return self.home / "query_graphs"

    @property
    def verified(self) -> Path:
        return self.home / "verified"

    @property
    def bundles(self) -> Path:
        return self.home / "bundles"

    @property
    def work(self) -> Path:
        return self.home / "work"

    @property
    def locks(self) -> Path:
        return self.home / "locks"

    @property
    def evaluations(self) -> Path:
        """Evaluation runs, one folder per run ID: the chain's and ``ragpipe eval``'s alike."""
        return self.home / "evaluations"

    @property
    def releases(self) -> Path:
        """Release manifests, kept decisions, target pointers and histories (``ragpipe.release.store``)."""
        return self.home / "releases"

    @property
    def datasets(self) -> Path:
        """Datasets people adjudicate, one folder per name (``ragpipe.evaluation.datasets``)."""
        return self.home / "datasets"

    @property
    def serve_traces(self) -> Path:
        """Served answers' trace logs, per target and release (``ragpipe.server.tracing``)."""
        return self.home / "serve_traces"

    @property
    def leases(self) -> Path:
        """Bundles a running server holds (``ragpipe.kernel.leases``)."""
        return self.home / "leases"

    @property
    def tune(self) -> Path:
        """``ragpipe tune``'s default output folders."""
        return self.home / "tune"

    @property
    def answer_cache(self) -> Path:
        """Generated answers, one verified entry per request (``ragpipe answer``, the server)."""
        return self.home / "answer_cache"

    @property
    def lab(self) -> Path:
        """The lab's own ledgers (pairwise review choices: ``ragpipe.server.lab.review``)."""
        return self.home / "lab"

    @property
    def draft_cache(self) -> Path:
        """Drafted cases' model calls (``ragpipe dataset draft``)."""
        return self.home / "draft_cache"

    def stored(self, path: Path) -> str:
        """How state refers to ``path``: relative to the home (POSIX) when inside it, so a home
        that is copied, moved or restored still finds its own files; absolute otherwise."""
        path = Path(path).resolve()
        try:
            return path.relative_to(self.home.resolve()).as_posix()
        except ValueError:
            return str(path)

    def located(self, stored: str) -> Path:
        """The path ``stored`` (``Workspace.stored``) names: relative ones are inside this home,
        and one that would leave it (``..``) is refused — state read from disk is input."""
        path = Path(stored)
        if path.is_absolute():
            return path
        if ".." in path.parts:
            raise ValueError(f"stored path {stored!r} leaves the home {self.home}")
        return self.home / path

    def stage_dir(self, revision: str, stage: str) -> Path:
        """The folder holding a revision's versions of ``stage`` and its ``latest.json`` pointer."""
        return self.work / revision / stage
