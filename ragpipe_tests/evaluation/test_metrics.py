"""Ranking metrics: hand-computed golden values, equality with pytrec_eval, collapse laws."""

from __future__ import annotations

import math

import pytest
import pytrec_eval
from hypothesis import given, settings
from hypothesis import strategies as st

from ragpipe.evaluation.metrics import MetricSpec, MetricValue, aggregate, collapse, default_metric_specs, score_cases

SPECS = default_metric_specs()
NAMES = ["ndcg@10", "recall@100", "mrr@10", "precision@10", "hit@10", "relevant_recall@10"]


def test_default_specs_declare_semantics():
    assert [s.name for s in SPECS] == NAMES
    assert [s.measure for s in SPECS] == ["nDCG@10", "R@100", "RR@10", "P@10", "Success@10", "R@10"]
    assert {(s.direction, s.unit, s.range, s.aggregate) for s in SPECS} == {("higher", "ratio", (0.0, 1.0), "mean")}
    assert [s.k for s in SPECS] == [10, 100, 10, 10, 10, 10]
    custom = default_metric_specs({"ndcg": 5, "recall": 50})
    assert [s.name for s in custom][:2] == ["ndcg@5", "recall@50"] and custom[0].measure == "nDCG@5"


@pytest.mark.parametrize(
    ("cutoffs", "message"),
    [
        ({"map": 10}, "unknown metric family 'map' (known: ndcg, recall, mrr, precision, hit, relevant_recall)"),
        ({"ndcg": 0}, "cutoff of 'ndcg' must be a positive integer, got 0"),
        ({"hit": True}, "cutoff of 'hit' must be a positive integer, got True"),
    ],
)
def test_bad_cutoffs(cutoffs, message):
    with pytest.raises(ValueError) as err:
        default_metric_specs(cutoffs)
    assert str(err.value) == message


def test_hand_computed_graded_missing_and_unjudged():
    # a:3 b:2 c:1 judged; c is never retrieved (missing), x is retrieved but unjudged (non-relevant).
    judged = {"g": {"a": 3, "b": 2, "c": 1, "n": 0}}
    got = score_cases(judged, {"g": ["n", "b", "x", "a"]}, SPECS)["g"]
    dcg = 2 / math.log2(3) + 3 / math.log2(5)
    idcg = 3 + 2 / math.log2(3) + 1 / math.log2(4)
    assert got["ndcg@10"] == pytest.approx(dcg / idcg, abs=1e-12)
    assert got == {
        "ndcg@10": got["ndcg@10"],
        "recall@100": pytest.approx(2 / 3),
        "mrr@10": 0.5,
        "precision@10": pytest.approx(0.2),
        "hit@10": 1.0,
        "relevant_recall@10": pytest.approx(2 / 3),
    }
    short = score_cases(
        judged, {"g": ["n", "b", "x", "a"]}, default_metric_specs({"ndcg": 2, "mrr": 1, "hit": 1, "relevant_recall": 3})
    )["g"]
    assert short["ndcg@2"] == pytest.approx((2 / math.log2(3)) / (3 + 2 / math.log2(3)), abs=1e-12)
    assert (short["mrr@1"], short["hit@1"]) == (0.0, 0.0)
    assert short["relevant_recall@3"] == pytest.approx(1 / 3)


def test_rank_order_wins_over_trec_eval_tie_breaking():
    """With equal scores trec_eval re-sorts by document ID (descending), putting 'z' first;
    score_cases gives strictly decreasing scores, so the ranking's own order counts."""
    tied = pytrec_eval.RelevanceEvaluator({"t": {"z": 1}}, {"recip_rank"}).evaluate({"t": {"a": 1.0, "z": 1.0}})
    assert tied["t"]["recip_rank"] == 1.0
    got = score_cases({"t": {"z": 1}}, {"t": ["a", "z"]}, SPECS)["t"]
    assert got["mrr@10"] == 0.5
    assert got["ndcg@10"] == pytest.approx(1 / math.log2(3), abs=1e-12)


def test_empty_ranking_scores_zero_like_trec_eval_c():
    got = score_cases({"m": {"d1": 1, "d2": 1}, "g": {"d1": 1}}, {"m": [], "g": ["d1"]}, SPECS)
    assert got["m"] == dict.fromkeys(NAMES, 0.0)
    assert got["g"]["ndcg@10"] == 1.0 and got["g"]["precision@10"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("judged", "ranked", "message"),
    [
        ({"q": {"a": 1}}, {"q": ["a", "b", "a"]}, "ranking of case 'q' lists 'a' twice (collapse it first)"),
        ({"q": {"a": 0}}, {"q": ["a"]}, "case 'q' has no judgment of grade >= 1"),
        ({"q": {"a": 1}}, {"q": ["a"], "r": []}, "cases judged and ranked differ: 'r'"),
    ],
)
def test_score_cases_refuses(judged, ranked, message):
    with pytest.raises(ValueError) as err:
        score_cases(judged, ranked, SPECS)
    assert str(err.value) == message


def test_non_ranking_spec_refused():
    spec = MetricSpec(
        name="unauthorized_disclosures",
        measure="ragpipe:unauthorized_disclosures",
        direction="lower",
        unit="count",
        k=None,
        range=(0.0, None),
        aggregate="sum",
    )
    with pytest.raises(ValueError, match=r"is not a ranking measure"):
        score_cases({"q": {"a": 1}}, {"q": ["a"]}, [spec])


def reference(judged: dict, ranked: dict) -> dict[str, dict[str, float]]:
    """Direct pytrec_eval (trec_eval) values; RR@10 as trec_eval recip_rank on the run cut at 10."""
    run = {q: {t: float(len(r) - i) for i, t in enumerate(r)} for q, r in ranked.items() if r}
    full = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10", "recall.10,100", "P.10", "success.10"}).evaluate(run)
    cut = {q: {t: s for t, s in r.items() if s > len(r) - 10} for q, r in run.items()}
    rr = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(cut)
    out = {}
    for q in judged:
        if q not in run:
            out[q] = dict.fromkeys(NAMES, 0.0)
            continue
        m = full[q]
        out[q] = {
            "ndcg@10": m["ndcg_cut_10"],
            "recall@100": m["recall_100"],
            "mrr@10": rr[q]["recip_rank"],
            "precision@10": m["P_10"],
            "hit@10": m["success_10"],
            "relevant_recall@10": m["recall_10"],
        }
    return out


docs = st.text("abcdefghijklmnop", min_size=1, max_size=2)


@st.composite
def fixtures(draw):
    judged, ranked = {}, {}
    for q in range(draw(st.integers(1, 5))):
        grades = draw(st.dictionaries(docs, st.integers(0, 4), min_size=1, max_size=8))
        if not any(g >= 1 for g in grades.values()):
            grades[draw(docs) + "r"] = draw(st.integers(1, 4))
        judged[f"q{q}"] = grades
        ranked[f"q{q}"] = draw(st.lists(st.one_of(st.sampled_from(sorted(grades)), docs), max_size=30, unique=True))
    return judged, ranked


@settings(max_examples=200, deadline=None)
@given(fixtures())
def test_equal_to_pytrec_eval(fixture):
    judged, ranked = fixture
    got = score_cases(judged, ranked, SPECS)
    want = reference(judged, ranked)
    assert got.keys() == want.keys()
    for q in got:
        assert got[q] == pytest.approx(want[q], abs=1e-12), q


def test_equal_to_pytrec_eval_on_a_fixed_graded_fixture():
    judged = {"1": {"d1": 2, "d2": 1, "d3": 0, "d4": 1}, "2": {"e1": 1}, "3": {"f1": 4, "f2": 4}}
    ranked = {"1": ["d3", "d9", "d2", "d1"], "2": [f"x{i}" for i in range(12)] + ["e1"], "3": ["f2", "f1", "f3"]}
    got = score_cases(judged, ranked, SPECS)
    assert got == {q: pytest.approx(v, abs=1e-12) for q, v in reference(judged, ranked).items()}
    assert got["2"]["recall@100"] == 1.0 and got["2"]["hit@10"] == 0.0 and got["2"]["mrr@10"] == 0.0
    assert got["3"]["ndcg@10"] == 1.0


pairs = st.lists(st.tuples(st.sampled_from("ABCDE"), st.sampled_from("abcdefghij")), max_size=25)


@given(pairs, st.sampled_from(["document", "chunk"]))
def test_collapse_laws(ranking, level):
    out = collapse(ranking, level)
    index = 0 if level == "document" else 1
    targets = [p[index] for p in ranking]
    assert len(out) == len(set(out)) == len(set(targets))  # duplicate-free, nothing lost
    assert [targets.index(t) for t in out] == sorted(targets.index(t) for t in out)  # first occurrences, in order
    assert collapse([(t, t) for t in out], level) == out  # idempotent


def test_collapse_document_level_keeps_best_chunk_position():
    ranking = [("d2", "c1"), ("d1", "c2"), ("d2", "c3"), ("d3", "c4"), ("d1", "c5")]
    assert collapse(ranking, "document") == ["d2", "d1", "d3"]
    assert collapse(ranking, "chunk") == ["c1", "c2", "c3", "c4", "c5"]
    with pytest.raises(ValueError, match="unknown target level 'passage'"):
        collapse(ranking, "passage")  # type: ignore[arg-type]


def test_aggregate_counts_only_cases_with_values():
    specs = [
        *SPECS[:1],
        MetricSpec(
            name="unauthorized_disclosures",
            measure="ragpipe:unauthorized_disclosures",
            direction="lower",
            unit="count",
            k=None,
            range=(0.0, None),
            aggregate="sum",
        ),
        MetricSpec(
            name="citation_precision",
            measure="ragpipe:citation_precision",
            direction="higher",
            unit="ratio",
            k=None,
            range=(0.0, 1.0),
        ),
    ]
    per_case = {
        "a": {"ndcg@10": 1.0, "unauthorized_disclosures": 2.0},
        "b": {"ndcg@10": 0.5, "unauthorized_disclosures": 0.0},
        "c": {"unauthorized_disclosures": 1.0},
    }
    assert aggregate(per_case, specs) == {
        "ndcg@10": MetricValue(0.75, "higher", "ratio", 10, 2),
        "unauthorized_disclosures": MetricValue(3.0, "lower", "count", None, 3),
        "citation_precision": MetricValue(None, "higher", "ratio", None, 0),
    }
    assert aggregate(per_case, specs)["ndcg@10"].as_dict() == {
        "value": 0.75,
        "direction": "higher",
        "unit": "ratio",
        "k": 10,
        "n": 2,
    }
    with pytest.raises(ValueError, match="metric 'ndcg@10' has a non-finite case value"):
        aggregate({"a": {"ndcg@10": math.nan}}, specs)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_scoring_only_the_top_max_cutoff_changes_nothing(data):
    """score_cases hands ir_measures only the top max-cutoff (100) targets: on rankings deeper
    than that, every value equals trec_eval's on the whole ranking."""
    n = data.draw(st.integers(101, 400))
    ranking = [f"t{i}" for i in data.draw(st.permutations(range(n)))]
    judged = data.draw(
        st.dictionaries(st.sampled_from([*ranking, "missing"]), st.integers(0, 3), min_size=1, max_size=40)
    )
    judged[ranking[data.draw(st.integers(0, n - 1))]] = data.draw(st.integers(1, 3))
    got = score_cases({"q": judged}, {"q": ranking}, SPECS)
    assert got == {"q": pytest.approx(reference({"q": judged}, {"q": ranking})["q"], abs=1e-12)}


def test_a_measure_without_cutoff_reads_the_whole_ranking():
    ranking = [f"t{i}" for i in range(500)]
    judged = {"t0": 1, "t499": 1}
    spec = MetricSpec(name="map", measure="AP", direction="higher", unit="ratio", k=None, range=(0.0, 1.0))
    want = pytrec_eval.RelevanceEvaluator({"q": judged}, {"map"}).evaluate(
        {"q": {t: float(500 - i) for i, t in enumerate(ranking)}}
    )["q"]["map"]
    assert (
        score_cases({"q": judged}, {"q": ranking}, [spec, *SPECS])["q"]["map"]
        == pytest.approx(want, abs=1e-12)
        == (1 + 2 / 500) / 2
    )


@pytest.mark.parametrize("measure", ["nDCG(judged_only=True)@10", "P(judged_only=True)@10"])
def test_a_measure_that_drops_unjudged_targets_first_reads_the_whole_ranking(measure):
    """``judged_only`` removes unjudged targets *before* the cutoff: ranks 1-10 unjudged but one,
    the relevant target at 11 — cutting the ranking at the cutoff would score 0."""
    import ir_measures

    ranking = [f"u{i}" for i in range(10)] + ["rel"]
    judged = {"rel": 1, "u0": 0}
    spec = MetricSpec(name="x", measure=measure, direction="higher", unit="ratio", k=10, range=(0.0, 1.0))
    run = {"q": {t: float(len(ranking) - i) for i, t in enumerate(ranking)}}
    want = ir_measures.calc_aggregate([ir_measures.parse_measure(measure)], {"q": judged}, run)[
        ir_measures.parse_measure(measure)
    ]
    assert want > 0 and score_cases({"q": judged}, {"q": ranking}, [spec])["q"]["x"] == pytest.approx(want, abs=1e-12)
