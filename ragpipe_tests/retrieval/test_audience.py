"""Audience views: exact BM25 statistics per audience, bounded and thread-safe caches, view
lifetimes. The index layout and its verification: test_scope_groups.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragpipe.index import segments as segments_module
from ragpipe.index.lexical import LexicalSearcher, build_lexical_index
from ragpipe.index.prefilter import Prefilter
from ragpipe.index.rows import IndexRow
from ragpipe.index.segments import SegmentView, read_scope_groups
from ragpipe.retrieval.audience import AudienceIndexes
from ragpipe.retrieval.authz import ScopePolicy, Subject
from ragpipe.spec import LexicalIndexSpec

SPEC = LexicalIndexSpec()
VOCAB = "aspirin stroke heart cell protein gene cancer risk trial dose blood brain".split()
SCOPE_SETS = [("public",), ("staff",), ("secret",), ("public", "staff"), ("hr", "staff")]
ALL_SCOPES = ("hr", "public", "secret", "staff")
QUERIES = ["aspirin stroke", "heart", "gene cancer trial", "dose blood brain risk", "protein"]
SUBJECTS = [("public",), ("staff",), ("secret",), ("hr",), ("public", "secret"), ("hr", "secret")]


def corpus(seed: int, documents: int = 60) -> list[IndexRow]:
    """Documents of five scope sets with one or two rows each; every fifth document repeats an
    earlier text in another group, so equal scores cross groups (ties at the cut)."""
    rng = random.Random(seed)
    rows: list[IndexRow] = []
    for d in range(documents):
        scopes = rng.choice(SCOPE_SETS)
        for kind in ("raw", "title")[: rng.randint(1, 2)]:
            text = (
                rows[rng.randrange(len(rows))].text
                if rows and d % 5 == 0
                else " ".join(rng.choices(VOCAB, k=rng.randint(1, 12)))
            )
            rows.append(IndexRow(f"r{d:03}-{kind}", f"c{d:03}", f"d{d:03}", kind, text, scopes, "body"))
    return rows


def triples(rows: list[IndexRow]) -> list[tuple[str, str, str]]:
    return [(r.representation_id, r.chunk_id, r.document_id) for r in rows]


def document_scopes(rows: list[IndexRow]) -> dict[str, tuple[str, ...]]:
    return {r.document_id: r.access_scopes for r in rows}


def open_index(directory: Path, rows: list[IndexRow], heap_mb: int = 128) -> LexicalSearcher:
    directory.mkdir(parents=True)
    assert build_lexical_index(directory, rows, SPEC, heap_mb) == len(rows)
    return LexicalSearcher.open(directory, triples(rows))


def authorized_only(directory: Path, rows: list[IndexRow], scopes: tuple[str, ...]) -> LexicalSearcher:
    """The reference: an index built from the rows ``scopes`` may see, and nothing else."""
    return open_index(directory, [r for r in rows if set(r.access_scopes) & set(scopes)])


def audiences(bundle: LexicalSearcher, rows: list[IndexRow], **limits) -> AudienceIndexes:
    return AudienceIndexes(bundle, ScopePolicy(), document_scopes(rows), **limits)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("grouped")
    rows = corpus(11)
    return rows, open_index(root / "lexical", rows), {s: authorized_only(root / "-".join(s), rows, s) for s in SUBJECTS}


# --- exact statistics -------------------------------------------------------------------------


@pytest.mark.parametrize("scopes", SUBJECTS)
def test_audience_view_results_equal_an_authorized_only_index(grouped, scopes):
    rows, bundle, references = grouped
    searcher, stats = audiences(bundle, rows).searcher_for(Subject("s", scopes))
    assert (stats.index, stats.rows) == ("audience", references[scopes].num_docs)
    for query in QUERIES:
        for k in (1, 3, 10, 200):
            got = searcher.search(query, k, Prefilter(scopes))
            assert got == references[scopes].search(query, k, Prefilter(scopes)), (query, k)
            assert not {h.document_id for h in got} - {
                r.document_id for r in rows if set(r.access_scopes) & set(scopes)
            }


def test_bundle_statistics_differ_from_an_audience_s(grouped):
    """The fixture is not trivial: over the whole bundle (filter only) scores differ."""
    rows, bundle, references = grouped
    filtered = bundle.search("aspirin stroke", 10, Prefilter(("public",)))
    assert [h.representation_id for h in filtered] and filtered != references[("public",)].search(
        "aspirin stroke", 10, Prefilter(("public",))
    )


def test_ties_at_the_cut_are_settled_by_ids_not_addresses(tmp_path: Path):
    # six equal texts, the lowest document IDs indexed last (tantivy would keep the first addresses)
    rows = [
        IndexRow(f"r{d}", f"c{d}", f"d{d}", "raw", "aspirin stroke", ("staff",) if d in (7, 1) else ("public",), "body")
        for d in (9, 8, 7, 3, 2, 1)
    ]
    bundle = open_index(tmp_path / "lexical", rows)
    assert [h.document_id for h in bundle.search("aspirin", 2, Prefilter(("public", "staff")))] == ["d1", "d2"]
    view, _ = audiences(bundle, rows).searcher_for(Subject("p", ("public",)))
    assert [h.document_id for h in view.search("aspirin", 2, Prefilter(("public",)))] == ["d2", "d3"]
    assert view.search("aspirin", 2, Prefilter(("public",))) == authorized_only(
        tmp_path / "ref", rows, ("public",)
    ).search("aspirin", 2, Prefilter(("public",)))


@pytest.fixture(scope="module")
def bundles_by_seed(tmp_path_factory: pytest.TempPathFactory):
    """Bundle indexes of ``corpus(seed, 40)``, built once per seed (tantivy fsyncs each group's commit)."""
    root, built = tmp_path_factory.mktemp("seeds"), {}

    def get(seed: int) -> tuple[list[IndexRow], AudienceIndexes]:
        if seed not in built:
            rows = corpus(seed, documents=40)
            built[seed] = rows, audiences(open_index(root / str(seed) / "lexical", rows), rows)
        return built[seed]

    yield get
    for _, indexes in built.values():
        indexes.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 5),
    scopes=st.sets(st.sampled_from(ALL_SCOPES), min_size=1).map(lambda s: tuple(sorted(s))),
    words=st.lists(st.sampled_from(VOCAB), min_size=1, max_size=4),
    k=st.integers(1, 40),
)
def test_law_view_equals_authorized_only_index(bundles_by_seed, tmp_path_factory, seed, scopes, words, k):
    rows, indexes = bundles_by_seed(seed)
    searcher, _ = indexes.searcher_for(Subject("s", scopes))
    query = " ".join(words)
    # A folder that outlives the example: tantivy-py's meta.json watcher thread lives as long as
    # the opened index and may create its lock file while a TemporaryDirectory is being removed.
    reference = authorized_only(tmp_path_factory.mktemp("ref") / "ref", rows, scopes)
    assert searcher.search(query, k, Prefilter(scopes)) == reference.search(query, k, Prefilter(scopes))


# --- which searcher, caching, lifetime ---------------------------------------------------------


def test_a_subject_who_sees_everything_uses_the_bundle_index(grouped):
    rows, bundle, _ = grouped
    indexes = audiences(bundle, rows)
    searcher, stats = indexes.searcher_for(Subject("admin", ALL_SCOPES))
    assert searcher is bundle
    assert stats.as_dict() == {
        "index": "bundle",
        "documents": 60,
        "total_documents": 60,
        "rows": len(rows),
        "built": False,
        "build_ms": None,
    }
    assert (indexes.builds, indexes.cached_audiences) == (0, 0)


def test_a_subject_who_sees_nothing_gets_an_empty_view(grouped):
    rows, bundle, _ = grouped
    indexes = audiences(bundle, rows)
    searcher, stats = indexes.searcher_for(Subject("stranger", ("nobody",)))
    assert (stats.index, stats.documents, stats.rows) == ("audience", 0, 0)
    assert searcher.search("aspirin stroke", 10, Prefilter(("nobody",))) == []
    assert sorted(p.name for p in searcher.view.path.iterdir()) == [".tantivy-meta.lock", "meta.json"]
    indexes.close()


def test_views_are_reused_bounded_evicted_and_removed(grouped):
    rows, bundle, references = grouped
    indexes = audiences(bundle, rows, max_views=2)
    public, stats = indexes.searcher_for(Subject("a", ("public",)))
    assert stats.build_ms is not None and indexes.builds == 1
    again, stats = indexes.searcher_for(Subject("b", ("public",)))  # another principal, same audience
    assert again is public and stats.build_ms is None and indexes.builds == 1
    folder = public.view.path
    assert folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith(f"ragpipe-audience-{os.getpid()}-")
    admitted = [g for g in read_scope_groups(bundle.directory) if "public" in g.scopes]
    linked = {p.name for p in folder.iterdir()} - {"meta.json", ".tantivy-meta.lock"}
    assert linked == {
        p.name for g in admitted for p in segments_module.segment_files(bundle.directory, g.segment_ids[0])
    }
    assert all(
        (folder / n).stat().st_ino == (bundle.directory / n).stat().st_ino for n in linked
    )  # hard links, no copy
    expected = references[("public",)].search("aspirin stroke", 10, Prefilter(("public",)))
    indexes.searcher_for(Subject("c", ("staff",)))
    indexes.searcher_for(Subject("d", ("secret",)))  # third view: the least recently used (public) goes
    assert (indexes.cached_audiences, indexes.builds) == (2, 3)
    assert public.view.closed and not folder.exists()
    assert (
        public.search("aspirin stroke", 10, Prefilter(("public",))) == expected
    )  # a searcher handed out earlier still works
    reopened, stats = indexes.searcher_for(Subject("a", ("public",)))
    assert reopened is not public and stats.build_ms is not None and indexes.builds == 4
    folders = [v.view.path for v in indexes._views.values()]
    indexes.close()
    assert indexes.cached_audiences == 0 and not any(f.exists() for f in folders)


def test_audience_memo_is_bounded(grouped):
    rows, bundle, _ = grouped
    indexes = audiences(bundle, rows, max_audiences=2)
    for scopes in (("public",), ("staff",), ("secret",)):
        indexes.audience(Subject("x", scopes))
    assert list(indexes._audiences) == [("staff",), ("secret",)]
    with pytest.raises(ValueError, match="max_views and max_audiences must be >= 1"):
        audiences(bundle, rows, max_views=0)


def test_views_fall_back_to_symlinks_across_file_systems(grouped, monkeypatch):
    rows, bundle, references = grouped

    def no_hard_links(source, target):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(segments_module.os, "link", no_hard_links)
    indexes = audiences(bundle, rows)
    searcher, _ = indexes.searcher_for(Subject("a", ("staff",)))
    linked = [p for p in searcher.view.path.iterdir() if p.name not in ("meta.json", ".tantivy-meta.lock")]
    assert linked and all(p.is_symlink() and p.resolve().parent == bundle.directory.resolve() for p in linked)
    assert searcher.search("heart", 10, Prefilter(("staff",))) == references[("staff",)].search(
        "heart", 10, Prefilter(("staff",))
    )
    indexes.close()


VIEW_SCRIPT = """
import sys, os, signal
from pathlib import Path
from ragpipe.index.lexical import LexicalSearcher
from ragpipe.index.segments import read_meta, read_scope_groups
directory = Path(sys.argv[1])
group = read_scope_groups(directory)[0]
searcher = LexicalSearcher.open_view(directory, read_meta(directory), group.segment_ids, [])
print(searcher.view.path, flush=True)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_view_folders_are_removed_at_exit_and_after_a_crash(grouped, monkeypatch):
    rows, bundle, _ = grouped
    run = [sys.executable, "-c", VIEW_SCRIPT, str(bundle.directory)]
    clean = subprocess.run([*run, "exit"], capture_output=True, text=True, check=True)
    assert not Path(clean.stdout.strip()).exists()  # interpreter exit removed it
    killed = subprocess.run([*run, "kill"], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL
    leftover = Path(killed.stdout.strip())
    assert leftover.is_dir()
    monkeypatch.setattr(SegmentView, "_swept", False)  # as in a fresh process
    indexes = audiences(bundle, rows)
    indexes.searcher_for(Subject("a", ("hr",)))
    assert not leftover.exists()  # the first view of the next process sweeps dead processes' views
    indexes.close()


# --- threads ----------------------------------------------------------------------------------


def test_eight_threads_get_the_sequential_results_and_each_view_is_opened_once(grouped, monkeypatch):
    rows, bundle, _ = grouped
    subjects = [Subject(f"u{i}", SUBJECTS[i % 6]) for i in range(8)] + [Subject("admin", ALL_SCOPES)]
    work = [(s, q, k) for s in subjects for q in QUERIES for k in (3, 20)]
    sequential_indexes = audiences(bundle, rows)
    sequential = {
        (s.principal, q, k): sequential_indexes.searcher_for(s)[0].search(q, k, Prefilter(s.scopes)) for s, q, k in work
    }
    sequential_indexes.close()

    opened: list[tuple[str, ...]] = []
    real_open = LexicalSearcher.open_view.__func__
    in_flight = threading.Condition()
    requests = [0]  # searcher_for calls entered and not yet returned

    def held_open(cls, directory, meta, segment_ids, rows_):
        opened.append(tuple(segment_ids))
        # hold the open until every thread is inside searcher_for (a condition, not a delay), so a
        # second opener of the same view would slip in here if opening were not deduplicated
        with in_flight:
            in_flight.wait_for(lambda: requests[0] >= 8, timeout=5)
        return real_open(cls, directory, meta, segment_ids, rows_)

    monkeypatch.setattr(LexicalSearcher, "open_view", classmethod(held_open))
    indexes = audiences(bundle, rows)
    real_searcher_for = indexes.searcher_for

    def counted_searcher_for(subject):
        with in_flight:
            requests[0] += 1
            in_flight.notify_all()
        try:
            return real_searcher_for(subject)
        finally:
            with in_flight:
                requests[0] -= 1

    indexes.searcher_for = counted_searcher_for
    barrier = threading.Barrier(8)
    results: dict[tuple[str, str, int], list] = {}
    errors: list[BaseException] = []

    def client(n: int) -> None:
        try:
            barrier.wait()
            for i in range(len(work)):
                s, q, k = work[(i + n * 7) % len(work)]  # every thread walks all subjects, from its own start
                results[(s.principal, q, k)] = indexes.searcher_for(s)[0].search(q, k, Prefilter(s.scopes))
                assert results[(s.principal, q, k)] == sequential[(s.principal, q, k)]
        except BaseException as exc:  # surfaced below with the thread's failure
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == sequential
    assert len(opened) == len(set(opened)) == indexes.builds == 6  # six partial audiences, each opened once
    indexes.close()


def test_retriever_lexical_queries_from_eight_threads_match_sequential(scoped_bundles):
    from ragpipe.retrieval.retriever import Retriever

    full, _ = scoped_bundles
    retriever = Retriever(full)
    subjects = [
        Subject("a", ("public",)),
        Subject("n", ("public", "staff")),
        Subject("s", ("secret",)),
        Subject("x", ("public", "secret", "staff")),
    ]
    work = [(s, q) for s in subjects for q in ("aspirin stroke", "secret aspirin stroke trial", "twin text aspirin")]
    sequential = Retriever(full)
    expected = {(s.principal, q): sequential.query(q, s, k=5, mode="lexical").as_dict() for s, q in work}
    sequential.close()
    barrier = threading.Barrier(8)
    got: dict[tuple[str, str], list] = {}

    def client(n: int) -> None:
        barrier.wait()
        for s, q in work[n % 3 :] + work[: n % 3]:
            got.setdefault((s.principal, q), []).append(retriever.query(q, s, k=5, mode="lexical").as_dict())

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {key: values for key, values in got.items()} == {key: [expected[key]] * 8 for key in expected}
    assert retriever.lexical.builds == 3  # three partial audiences, each opened once
    retriever.lexical.close()
    retriever.close()
