"""Metadata filters inside both channels: a filtered ranking is the full ranking restricted to the
documents the filter admits, in every mode and on both vector engines, and never more than the
subject's scopes allow.

The corpus is drawn once from a seeded generator (building a bundle per Hypothesis example would
embed a corpus per example); Hypothesis draws the filters, queries and subjects over it.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragpipe.corpus.metadata_filter import matches
from ragpipe.retrieval.authz import Subject
from ragpipe.retrieval.results import QueryError
from ragpipe.retrieval.retriever import Retriever
from ragpipe_tests.support.builds import build_all_stages
from ragpipe_tests.support.corpora import write_tree

WORDS = "returns refund shipping invoice warranty battery charger cable screen repair price discount".split()
CATEGORIES = ["faq", "guide", "policy"]
TAGS = ["eu", "us", "sale", "new"]
STAFF = Subject("bob", ("public", "staff"))
PUBLIC = Subject.default()


def _front_matter(rng: random.Random, n: int) -> str:
    lines = ["---"]
    if rng.random() < 0.85:
        lines.append(f"category: {rng.choice(CATEGORIES)}")
    if rng.random() < 0.8:
        lines.append(f"year: {rng.randint(2018, 2024)}")
    if rng.random() < 0.7:
        lines.append(f"price: {rng.choice([9.5, 19, 49.99, 120])}")
    if rng.random() < 0.6:
        lines.append(f"tags: [{', '.join(rng.sample(TAGS, rng.randint(1, 3)))}]")
    if rng.random() < 0.5:
        lines.append(f"published: 2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}")
    if rng.random() < 0.5:
        lines.append(f"featured: {rng.choice(['true', 'false'])}")
    if n % 4 == 0:
        lines.append("access_scopes: [staff]")
    if n % 5 == 0:
        lines.append("source_role: runbook")
    return "\n".join(lines + ["---", ""])


def _corpus(seed: int, documents: int) -> dict[str, str]:
    rng = random.Random(seed)
    files = {}
    for n in range(documents):
        paragraphs = [" ".join(rng.choices(WORDS, k=rng.randint(8, 30))) + "." for _ in range(rng.randint(1, 3))]
        files[f"shop/doc-{n:02d}.md"] = _front_matter(rng, n) + f"# Doc {n}\n\n" + "\n\n".join(paragraphs) + "\n"
    return files


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("shop")
    corpus = write_tree(root / "shop-corpus", _corpus(seed=39, documents=24))
    _, _, bundle = build_all_stages(root / "home", "s1", corpus, "markdown")
    retriever = Retriever(bundle)
    yield retriever
    retriever.close()


def _leaf() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.builds(lambda v: {"field": "category", "eq": v}, st.sampled_from(CATEGORIES + ["none"])),
        st.builds(lambda vs: {"field": "tags", "in": vs}, st.lists(st.sampled_from(TAGS), min_size=1, max_size=3)),
        st.builds(lambda lo: {"field": "year", "gte": lo}, st.integers(2017, 2025)),
        st.builds(lambda lo, hi: {"field": "price", "gt": lo, "lte": hi}, st.floats(0, 60), st.floats(10, 200)),
        st.builds(lambda d: {"field": "published", "lt": d}, st.sampled_from(["2024-03-01", "2024-06-15"])),
        st.builds(lambda b: {"field": "featured", "eq": b}, st.booleans()),
        st.builds(lambda f: {"field": f, "exists": True}, st.sampled_from(["tags", "published", "price"])),
        st.builds(lambda r: {"field": "source_role", "eq": r}, st.sampled_from(["primary", "runbook"])),
    )


FILTERS = st.recursive(
    _leaf(),
    lambda inner: st.one_of(
        st.builds(lambda fs: {"and": fs}, st.lists(inner, min_size=2, max_size=3)),
        st.builds(lambda fs: {"or": fs}, st.lists(inner, min_size=2, max_size=3)),
        st.builds(lambda f: {"not": f}, inner),
    ),
    max_leaves=5,
)
QUERIES = st.sampled_from(["refund for a battery", "shipping price", "warranty repair of the screen", "cable"])


def _admitted(retriever: Retriever, value: dict) -> set[str]:
    parsed = retriever.filters.parse(value)
    return {d.document_id for d in retriever.bundle.tables.documents if matches(parsed, d.metadata, d.source_role)}


def _channel(result, name: str) -> list[tuple[str, float]]:
    return [(r.hit.chunk_id, r.hit.score) for r in result.rankings.channels[name]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=FILTERS, query=QUERIES, subject=st.sampled_from([STAFF, PUBLIC]), k=st.sampled_from([2, 1000]))
def test_a_filtered_ranking_is_the_full_ranking_restricted(shop, value, query, subject, k):
    """Per channel, in every mode: the filtered channel ranking is the unfiltered full ranking's
    hits of admitted documents, same scores, cut at the same depth."""
    for retriever in (shop,):
        admitted = _admitted(retriever, value)
        for mode in ("lexical", "vector", "hybrid"):
            full = retriever.query(query, subject, k=1000, mode=mode, rankings=True)
            filtered = retriever.query(query, subject, k=k, mode=mode, rankings=True, filter=value)
            assert set(filtered.rankings.channels) == set(full.rankings.channels)
            for name in filtered.rankings.channels:
                restricted = [
                    (r.hit.chunk_id, r.hit.score) for r in full.rankings.channels[name] if r.hit.document_id in admitted
                ]
                units = max(retriever.plan.channels[name].depth, k)
                assert _channel(filtered, name) == restricted[:units], (mode, name)
            visible = {d for d, s in retriever.scopes.items() if set(s) & set(subject.scopes)}
            assert {h["document_id"] for h in filtered.hits} <= admitted & visible
            if mode != "hybrid":  # one channel: the fused order is the channel's order
                assert [h["chunk_id"] for h in filtered.hits] == [
                    c for c, _ in _channel(filtered, mode)[: len(filtered.hits)]
                ]


def test_a_filter_never_widens_what_the_scopes_allow(shop):
    memory = shop
    staff_only = {d for d, s in memory.scopes.items() if s == ("staff",)}
    assert staff_only
    for value in ({"field": "year", "gte": 0}, {"not": {"field": "category", "eq": "nothing"}}):
        result = memory.query("refund shipping battery", PUBLIC, k=1000, filter=value)
        assert result.hits and not {h["document_id"] for h in result.hits} & staff_only


def test_the_result_names_the_filter_and_hits_show_metadata(shop):
    memory = shop
    result = memory.query("refund", STAFF, k=3, filter={"field": "category", "in": ["guide", "faq"]})
    assert result.as_dict()["filter"] == {"field": "category", "in": ["faq", "guide"]}
    assert all(h["metadata"]["category"] in ("faq", "guide") for h in result.hits)
    assert "filter" not in memory.query("refund", STAFF, k=3).as_dict()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"field": "categroy", "eq": "faq"},
            "filter field 'categroy' is not in this corpus; did you mean 'category'? (known fields: category, "
            "featured, price, published, source_role, tags, year)",
        ),
        ({"field": "year", "eq": "2020"}, "filter field 'year' holds integer values; \"2020\" is a string"),
        (
            {"field": "category", "gte": "a"},
            "filter field 'category' holds string values; a range (gte) needs integer, number, date or datetime values",
        ),
        (
            {"field": "year", "between": [1, 2]},
            "filter: unknown key \"between\" (a filter node has 'and', 'or', 'not', or 'field' with one of eq, in, "
            "exists, gt, gte, lt, lte)",
        ),
    ],
)
def test_a_bad_filter_is_one_line(shop, value, message):
    memory = shop
    with pytest.raises(QueryError) as info:
        memory.query("refund", STAFF, filter=value)
    assert str(info.value) == message


def test_a_refusal_names_no_field_type_or_count_that_only_hidden_documents_hold():
    """Found by an adversarial review: a public caller learnt a secret-only field's name (in the
    list of known fields, or as 'exists' answering 200 where an unknown field is a 422) and the
    type counts of hidden documents."""
    from ragpipe.corpus.metadata import MetadataValue
    from ragpipe.corpus.models import Document
    from ragpipe.index.rows import IndexRow
    from ragpipe.retrieval.filtering import BundleFilters

    def doc(doc_id: str, scopes: tuple[str, ...], **meta) -> Document:
        typed = {
            k: MetadataValue(type="integer" if isinstance(v, int) else "string", values=(v,)) for k, v in meta.items()
        }
        return Document(
            document_id=doc_id,
            title="T",
            text="t",
            content_digest="sha256:" + "0" * 64,
            access_scopes=scopes,
            source_role="primary",
            metadata=typed,
        )

    docs = [
        doc("a", ("public",), year=2020),
        doc("b", ("secret",), year="2020", merger_target="acme"),
        doc("c", ("secret",), year="2021"),
    ]
    rows = [
        IndexRow(f"r{i}", f"c{i}", d.document_id, "raw", "t", d.access_scopes, "primary") for i, d in enumerate(docs)
    ]
    filters = BundleFilters(docs, rows)
    public, everyone = [("public",)], [("public",), ("secret",)]
    with pytest.raises(QueryError) as info:
        filters.resolve({"field": "merger_target", "exists": True}, public)
    assert str(info.value) == "filter field 'merger_target' is not in this corpus (known fields: source_role, year)"
    assert filters.resolve({"field": "year", "eq": 2020}, public).selection.documents == {"a"}
    with pytest.raises(QueryError) as info:  # with the secret documents in view, the types disagree
        filters.resolve({"field": "year", "eq": 2020}, everyone)
    assert "string in 2 documents" in str(info.value)
    assert filters.resolve({"field": "merger_target", "exists": True}, everyone).selection.documents == {"b"}
